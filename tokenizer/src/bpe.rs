//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`), as llama.cpp runs it:
//! 1. pre-tokenize: the regexes of `tokenizer.ggml.pre` are applied one after another, each to
//!    every fragment left by the previous one; text between matches stays a fragment of its own;
//! 2. each fragment's UTF-8 bytes are mapped to GPT-2's printable "byte characters";
//! 3. adjacent symbols are merged lowest merge rank first (leftmost on ties) until no pair
//!    in `tokenizer.ggml.merges` applies; each final symbol is looked up in the vocabulary.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::OnceLock;

use fancy_regex::Regex;

use crate::vocab::Vocab;

/// The pre-tokenizer families implemented (llama.cpp `LLAMA_VOCAB_PRE_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// Missing or "default" `tokenizer.ggml.pre`.
    Default,
    /// GPT-2's own regex ("gpt-2", "mpt", "olmo", ...).
    Gpt2,
    /// Llama 3 ("llama-bpe", "llama3", "dbrx", "smaug-bpe", ...): digits in groups of up to 3.
    Llama3,
    /// Qwen2 ("qwen2", "stablelm2", ...): single digits, llama3-like words.
    Qwen2,
    /// StarCoder/SmolLM ("smollm", "starcoder", "refact", ...): every digit split off, then GPT-2.
    Starcoder,
}

/// What a `tokenizer.ggml.pre` name implies besides the regexes.
pub(crate) struct PreInfo {
    pub pre: PreTokenizer,
    pub clean_spaces: bool,
    pub ignore_merges: bool,
    pub add_bos: bool,
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

impl PreTokenizer {
    /// Maps `tokenizer.ggml.pre` to a family and llama.cpp's flags for it; `None` if unknown.
    pub(crate) fn from_name(name: &str) -> Option<PreInfo> {
        use PreTokenizer::*;
        let (pre, clean_spaces, ignore_merges, add_bos) = match name {
            "" | "default" => (Default, true, false, false),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => (Llama3, true, true, true),
            "dbrx" | "smaug-bpe" => (Llama3, true, false, false),
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais"
            | "exaone4" => (Gpt2, true, false, false),
            "trillion" | "granite-docling" => (Gpt2, false, false, false),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
            | "grok-2" => (Qwen2, false, false, false),
            "stablelm2" | "megrez" => (Qwen2, true, false, false),
            "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
                (Starcoder, true, false, false)
            }
            "smollm" | "command-r" => (Starcoder, false, false, false),
            _ => return None,
        };
        Some(PreInfo {
            pre,
            clean_spaces,
            ignore_merges,
            add_bos,
        })
    }

    fn regexes(self) -> &'static [Regex] {
        static CACHE: OnceLock<[Vec<Regex>; 5]> = OnceLock::new();
        let all = CACHE.get_or_init(|| {
            // These patterns are constants; fancy-regex accepts them (covered by tests).
            let r = |s: &str| Regex::new(s).expect("built-in pre-tokenizer regex");
            [
                vec![
                    r(r"[\p{P}\$\+<=>\^~\|]+"),
                    r(GPT2),
                    r(r"\p{N}+"),
                    r("[0-9][0-9][0-9]"),
                ],
                vec![r(GPT2)],
                vec![r(LLAMA3)],
                vec![r(QWEN2)],
                vec![r(r"\p{N}"), r(GPT2)],
            ]
        });
        &all[self as usize]
    }

    /// Splits `text` into words.
    pub fn split(self, text: &str) -> Vec<&str> {
        let mut frags = vec![text];
        for re in self.regexes() {
            let mut next = Vec::with_capacity(frags.len() * 2);
            for f in frags {
                let mut last = 0;
                for m in re.find_iter(f) {
                    // A backtracking-limit error leaves the rest of the fragment whole.
                    let Ok(m) = m else { break };
                    if m.start() > last {
                        next.push(&f[last..m.start()]);
                    }
                    if m.end() > m.start() {
                        next.push(m.as_str());
                    }
                    last = m.end();
                }
                if last < f.len() {
                    next.push(&f[last..]);
                }
            }
            frags = next;
        }
        frags
    }
}

/// GPT-2's byte → printable character table and its inverse.
struct ByteMap {
    to_char: [char; 256],
    to_byte: HashMap<char, u8>,
}

fn byte_map() -> &'static ByteMap {
    static MAP: OnceLock<ByteMap> = OnceLock::new();
    MAP.get_or_init(|| {
        // Printable Latin-1 bytes map to themselves; the other 68 take code points 256.. in order.
        let printable = |b: u32| {
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
        };
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
        let to_byte = to_char
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
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
        syms.push(Sym {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: None,
        });
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
            None => out.extend(
                s.bytes()
                    .filter_map(|b| v.text_to_token(std::str::from_utf8(&[b]).ok()?)),
            ),
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

    #[test]
    fn pre_tokenizer_splits() {
        let s = PreTokenizer::Starcoder.split("The year 1440, books  in\n\nEurope's");
        assert_eq!(
            s,
            vec![
                "The", " year", " ", "1", "4", "4", "0", ",", " books", " ", " in", "\n", "\n",
                "Europe", "'s"
            ]
        );
        let q = PreTokenizer::Qwen2.split("Hello world123 it's  ok\n\n");
        assert_eq!(
            q,
            vec![
                "Hello", " world", "1", "2", "3", " it", "'s", " ", " ok", "\n\n"
            ]
        );
        let l = PreTokenizer::Llama3.split("x=12345;");
        assert_eq!(l, vec!["x", "=", "123", "45", ";"]);
        let g = PreTokenizer::Gpt2.split("Ünïcödé 日本語 🎉!");
        assert_eq!(g, vec!["Ünïcödé", " 日本語", " 🎉!"]);
    }
}
