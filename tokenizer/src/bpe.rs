//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`), as llama.cpp runs it:
//! 1. pre-tokenize: the regexes of `tokenizer.ggml.pre` are applied one after another, each to
//!    every fragment left by the previous one; text between matches stays a fragment of its own;
//! 2. each fragment's UTF-8 bytes are mapped to GPT-2's printable "byte characters";
//! 3. adjacent symbols are merged lowest merge rank first (leftmost on ties) until no pair
//!    in `tokenizer.ggml.merges` applies; each final symbol is looked up in the vocabulary.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::OnceLock;

use crate::pretok::PreTokenizer;
use crate::vocab::Vocab;

/// GPT-2's byte → printable character table and its inverse.
struct ByteMap {
    to_char: [char; 256],
    to_byte: HashMap<char, u8>,
}

fn byte_map() -> &'static ByteMap {
    static MAP: OnceLock<ByteMap> = OnceLock::new();
    MAP.get_or_init(|| {
        // Printable Latin-1 bytes map to themselves; the other 68 take code points 256.. in order.
        let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let mut to_char = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..256u32 {
            let c = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            to_char[b as usize] = char::from_u32(c).unwrap_or('\u{FFFD}');
        }
        let to_byte = to_char.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        ByteMap { to_char, to_byte }
    })
}

/// Bytes of a byte-level token text; characters outside the table keep their UTF-8 bytes.
pub(crate) fn decode_byte_level(text: &str) -> Vec<u8> {
    let m = byte_map();
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match m.to_byte.get(&c) {
            Some(&b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out
}

struct Sym {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// Tokenizes one raw-text fragment (no special tokens in it) and appends the ids.
pub(crate) fn encode(
    v: &Vocab,
    pre: PreTokenizer,
    ranks: &HashMap<(String, String), u32>,
    text: &str,
    out: &mut Vec<u32>,
) {
    let map = byte_map();
    for word in pre.split(text) {
        let enc: String = word.bytes().map(|b| map.to_char[b as usize]).collect();
        if v.ignore_merges
            && let Some(id) = v.text_to_token(&enc)
        {
            out.push(id);
            continue;
        }
        merge_word(v, ranks, &enc, out);
    }
}

fn merge_word(v: &Vocab, ranks: &HashMap<(String, String), u32>, word: &str, out: &mut Vec<u32>) {
    let mut syms: Vec<Sym> = Vec::new();
    for (i, (start, c)) in word.char_indices().enumerate() {
        syms.push(Sym { start, len: c.len_utf8(), prev: i.checked_sub(1), next: None });
        if i > 0 {
            syms[i - 1].next = Some(i);
        }
    }
    let text = |s: &Sym| &word[s.start..s.start + s.len];
    // Min-heap on (rank, left): the lowest rank merges first, leftmost on ties.
    let mut heap: BinaryHeap<Reverse<(u32, usize, usize, String)>> = BinaryHeap::new();
    let push = |heap: &mut BinaryHeap<_>, syms: &[Sym], l: Option<usize>, r: Option<usize>| {
        let (Some(l), Some(r)) = (l, r) else { return };
        let (a, b) = (text(&syms[l]), text(&syms[r]));
        if let Some(&rank) = ranks.get(&(a.to_string(), b.to_string())) {
            heap.push(Reverse((rank, l, r, format!("{a}{b}"))));
        }
    };
    for i in 1..syms.len() {
        push(&mut heap, &syms, Some(i - 1), Some(i));
    }
    while let Some(Reverse((_, l, r, joined))) = heap.pop() {
        if syms[l].len == 0 || syms[r].len == 0 || syms[l].next != Some(r) {
            continue;
        }
        // A pair whose symbols changed since it was queued is stale.
        if syms[l].start + syms[l].len + syms[r].len - syms[l].start != joined.len()
            || word[syms[l].start..syms[l].start + joined.len()] != joined
        {
            continue;
        }
        syms[l].len += syms[r].len;
        syms[r].len = 0;
        syms[l].next = syms[r].next;
        if let Some(n) = syms[r].next {
            syms[n].prev = Some(l);
        }
        let (p, n) = (syms[l].prev, syms[l].next);
        push(&mut heap, &syms, p, Some(l));
        push(&mut heap, &syms, Some(l), n);
    }
    let mut i = if syms.is_empty() { None } else { Some(0) };
    while let Some(k) = i {
        let s = text(&syms[k]);
        match v.text_to_token(s) {
            Some(id) => out.push(id),
            // llama.cpp then looks up each byte of the (byte-level) text as a one-byte token;
            // only ASCII bytes can match, others are dropped, exactly as there.
            None => out.extend(s.bytes().filter_map(|b| v.text_to_token(std::str::from_utf8(&[b]).ok()?))),
        }
        i = syms[k].next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_gpt2() {
        let m = byte_map();
        assert_eq!(m.to_char[b' ' as usize], 'Ġ');
        assert_eq!(m.to_char[b'\n' as usize], 'Ċ');
        assert_eq!(m.to_char[b'a' as usize], 'a');
        assert_eq!(m.to_char[0xA0], 'ł');
        assert_eq!(m.to_char[0xAD], 'Ń');
        assert_eq!(m.to_byte.len(), 256);
        assert_eq!(decode_byte_level("ĠhelloĊ"), b" hello\n");
    }
}
