//! SentencePiece BPE (`tokenizer.ggml.model = "llama"`, Gemma, Llama 2), as llama.cpp runs it:
//! the text (spaces already escaped to U+2581 "▁") is split into UTF-8 characters; every
//! adjacent pair whose concatenation is a vocabulary token is queued with that token's score;
//! the best-scoring pair (leftmost on ties) is merged repeatedly; a final symbol that is not a
//! token is re-split along the merges that built it, down to `<0xNN>` byte tokens.

use std::collections::{BinaryHeap, HashMap};

use crate::vocab::Vocab;

struct Sym {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A queued merge; ordered so that `BinaryHeap` pops the highest score, then the lowest left.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // total_cmp: scores are finite in practice; NaN must not break the heap invariants.
        self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
    }
}

struct Session<'a> {
    v: &'a Vocab,
    text: &'a str,
    syms: Vec<Sym>,
    queue: BinaryHeap<Bigram>,
    rev_merge: HashMap<&'a str, (usize, usize)>,
}

impl<'a> Session<'a> {
    fn sym_text(&self, i: usize) -> &'a str {
        let s = &self.syms[i];
        &self.text[s.start..s.start + s.len]
    }

    fn try_add(&mut self, l: Option<usize>, r: Option<usize>) {
        let (Some(l), Some(r)) = (l, r) else { return };
        let start = self.syms[l].start;
        let joined = &self.text[start..start + self.syms[l].len + self.syms[r].len];
        let Some(id) = self.v.text_to_token(joined) else {
            return;
        };
        let score = self.v.scores[id as usize];
        self.queue.push(Bigram { left: l, right: r, score, size: joined.len() });
        self.rev_merge.insert(joined, (l, r));
    }

    fn resegment(&self, i: usize, out: &mut Vec<u32>) {
        let t = self.sym_text(i);
        if let Some(id) = self.v.text_to_token(t) {
            out.push(id);
            return;
        }
        match self.rev_merge.get(t) {
            Some(&(l, r)) => {
                self.resegment(l, out);
                self.resegment(r, out);
            }
            None => out.extend(t.bytes().filter_map(|b| byte_to_token(self.v, b))),
        }
    }
}

/// `<0xNN>`, else the byte itself as a one-character token, else UNK.
pub(crate) fn byte_to_token(v: &Vocab, b: u8) -> Option<u32> {
    v.text_to_token(&format!("<0x{b:02X}>"))
        .or_else(|| std::str::from_utf8(&[b]).ok().and_then(|s| v.text_to_token(s)))
        .or(v.sp.unk)
}

/// Tokenizes one already-escaped fragment and appends the ids.
pub(crate) fn encode(v: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut s = Session { v, text, syms: Vec::new(), queue: BinaryHeap::new(), rev_merge: HashMap::new() };
    for (i, (start, c)) in text.char_indices().enumerate() {
        s.syms.push(Sym { start, len: c.len_utf8(), prev: i.checked_sub(1), next: None });
        if i > 0 {
            s.syms[i - 1].next = Some(i);
        }
    }
    for i in 1..s.syms.len() {
        s.try_add(Some(i - 1), Some(i));
    }
    while let Some(b) = s.queue.pop() {
        let (l, r) = (&s.syms[b.left], &s.syms[b.right]);
        // Skip pairs whose symbols were merged away or grew since they were queued.
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        let rlen = r.len;
        let rnext = r.next;
        s.syms[b.left].len += rlen;
        s.syms[b.right].len = 0;
        s.syms[b.left].next = rnext;
        if let Some(n) = rnext {
            s.syms[n].prev = Some(b.left);
        }
        let prev = s.syms[b.left].prev;
        s.try_add(prev, Some(b.left));
        s.try_add(Some(b.left), rnext);
    }
    let mut i = if s.syms.is_empty() { None } else { Some(0) };
    while let Some(k) = i {
        s.resegment(k, out);
        i = s.syms[k].next;
    }
}
