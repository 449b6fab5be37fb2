//! Splitting raw text at special tokens before tokenization (llama.cpp
//! `tokenizer_st_partition`): for every control / user-defined / unknown token, longest text
//! first, each remaining raw-text fragment is cut at every occurrence of the token's text.
//! User-defined tokens are always matched; control and unknown ones only with `parse_special`.

use crate::vocab::{Vocab, attr};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Frag<'a> {
    Text(&'a str),
    Token(u32),
}

fn is_space(b: u8) -> bool {
    // C isspace in the "C" locale.
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

pub(crate) fn partition<'a>(v: &Vocab, text: &'a str, parse_special: bool) -> Vec<Frag<'a>> {
    let mut frags = if text.is_empty() { vec![] } else { vec![Frag::Text(text)] };
    // One pass over the text tells which special tokens occur at all; only those are searched
    // for below (Gemma has ~6,400 special tokens, a prompt contains a handful).
    let present: Option<Vec<bool>> = v.special_matcher.as_ref().map(|ac| {
        let mut p = vec![false; v.special_cache.len()];
        for m in ac.find_overlapping_iter(text) {
            p[m.pattern().as_usize()] = true;
        }
        p
    });
    for (i, &id) in v.special_cache.iter().enumerate() {
        if present.as_ref().is_some_and(|p| !p[i]) {
            continue;
        }
        let a = v.attr(id);
        if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let tok = v.texts[id as usize].as_str();
        // It may occur only inside a longer special token that was already cut out.
        if !frags.iter().any(|f| matches!(f, Frag::Text(t) if t.contains(tok))) {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for f in frags {
            let Frag::Text(mut rest) = f else {
                next.push(f);
                continue;
            };
            while let Some(pos) = rest.find(tok) {
                let mut left = &rest[..pos];
                if a & attr::LSTRIP != 0 {
                    left = left.trim_end_matches(|c: char| c.is_ascii() && is_space(c as u8));
                }
                if !left.is_empty() {
                    next.push(Frag::Text(left));
                }
                next.push(Frag::Token(id));
                rest = &rest[pos + tok.len()..];
                if a & attr::RSTRIP != 0 {
                    rest = rest.trim_start_matches(|c: char| c.is_ascii() && is_space(c as u8));
                }
            }
            if !rest.is_empty() {
                next.push(Frag::Text(rest));
            }
        }
        frags = next;
    }
    frags
}
