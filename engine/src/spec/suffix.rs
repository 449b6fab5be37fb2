//! Suffix / prompt-lookup drafter: no weights, works for every model. The longest recent
//! suffix of the history that occurred earlier predicts what followed it then.
//!
//! Per draft: over the last `max_lookback` tokens, find the largest L (`min_match ≤ L ≤
//! max_match`) such that the last L tokens occurred earlier with a token after them. Among all
//! those earlier occurrences, propose the most frequent follower (ties: the most recent one),
//! with probability p = (occurrences followed by it) / (occurrences). That is the empirical
//! estimate of P(next | suffix) in this context: 1.0 when every occurrence continued the same
//! way, lower when the context is ambiguous, so `--spec-min-p` cuts windows at ambiguous
//! points. Further drafts repeat the search on the history extended by the drafts so far.
//! It is not the model's probability: a draft with p = 1.0 can still be rejected.

use super::{Draft, Drafter};

/// Prompt-lookup drafter (see the module docs for its probability).
#[derive(Clone, Debug)]
pub struct SuffixDrafter {
    /// Shortest suffix that may be matched (default 2).
    pub min_match: usize,
    /// Longest suffix compared (default 16).
    pub max_match: usize,
    /// How far back occurrences are searched (default 8192 tokens).
    pub max_lookback: usize,
}

impl Default for SuffixDrafter {
    fn default() -> SuffixDrafter {
        SuffixDrafter { min_match: 2, max_match: 16, max_lookback: 8192 }
    }
}

impl SuffixDrafter {
    /// The next token after `h` and its probability, if some suffix of length ≥ min_match
    /// occurred before.
    pub fn predict(&self, h: &[u32]) -> Option<Draft> {
        let n = h.len();
        let min = self.min_match.max(1);
        if n < min + 1 {
            return None;
        }
        let lo = n.saturating_sub(self.max_lookback);
        // (length, followers of the occurrences of that length)
        let mut best_len = 0;
        let mut followers: Vec<(u32, usize)> = Vec::new(); // (token, end index j)
        // An occurrence ends at j (< n − 1, so h[j + 1] exists and lies in the history).
        for j in lo..n - 1 {
            let mut l = 0;
            while l < self.max_match && l <= j - lo && h[j - l] == h[n - 1 - l] {
                l += 1;
            }
            if l < min || l < best_len {
                continue;
            }
            if l > best_len {
                best_len = l;
                followers.clear();
            }
            followers.push((h[j + 1], j));
        }
        if followers.is_empty() {
            return None;
        }
        // Most frequent follower; ties go to the most recent occurrence.
        let total = followers.len();
        let mut best: Option<(u32, usize, usize)> = None; // (token, count, last j)
        for &(t, _) in &followers {
            if best.is_some_and(|b| b.0 == t) {
                continue;
            }
            let count = followers.iter().filter(|f| f.0 == t).count();
            let last = followers.iter().filter(|f| f.0 == t).map(|f| f.1).max().unwrap_or(0);
            if best.is_none_or(|b| count > b.1 || (count == b.1 && last > b.2)) {
                best = Some((t, count, last));
            }
        }
        best.map(|(token, count, _)| Draft { token, p: count as f32 / total as f32 })
    }
}

impl Drafter for SuffixDrafter {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<Draft> {
        let mut h = history.to_vec();
        let mut out = Vec::with_capacity(max);
        while out.len() < max {
            let Some(d) = self.predict(&h) else { break };
            h.push(d.token);
            out.push(d);
        }
        out
    }
}
