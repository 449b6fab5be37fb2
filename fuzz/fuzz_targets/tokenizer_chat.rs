//! Chat-template rendering with fuzzed conversations (roles and contents), then tokenizing the
//! result as the server does (`encode(text, true, true)`). Templates (strata_fuzz::
//! chat_tokenizers): the built-in ChatML, Gemma and Llama 3 formats and the real Jinja
//! templates of Qwen2.5-Coder (the default chat model) and SmolLM2 when cached. Properties: no
//! panic; the built-in formats never fail and hold every message content (trimmed for Gemma
//! and Llama 3; Gemma drops a system text no user turn follows, as llama.cpp does); a Jinja
//! template fails only with a template error (its own
//! `raise_exception`, a type error), never otherwise.
//!
//! Input: `[flags] role NUL content NUL role NUL content ...` (lossy UTF-8, at most 16
//! messages); flags bits 0-2 pick the template, bit 3 add_generation_prompt.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenizer::{ChatMessage, TokenizerError};

fn trim(s: &str) -> &str {
    s.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0B' | '\x0C'))
}

// The fixtures (tokenizers and templates) load before the first input, so their one-time cost (seconds
// under ASan, more on a busy machine) is not counted against that input's -timeout.
fuzz_target!(init: { strata_fuzz::chat_tokenizers(); }, |data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let all = strata_fuzz::chat_tokenizers();
    let named = &all[(flags & 7) as usize % all.len()];
    let t = &named.tok;
    let add_gen = flags & 8 != 0;
    let f = strata_fuzz::fields(rest, 32);
    let messages: Vec<ChatMessage> = f
        .chunks(2)
        .map(|p| ChatMessage::new(&p[0], p.get(1).map_or("", String::as_str)))
        .collect();

    match t.apply_chat_template(&messages, add_gen) {
        Ok(text) => {
            if !named.name.starts_with("jinja") {
                for (i, m) in messages.iter().enumerate() {
                    // Gemma has no system turn: like llama.cpp, the system text goes into the
                    // next user turn, and is dropped when none follows.
                    let merged = |r: &str| r != "system" && r != "assistant" && r != "model";
                    if named.name == "gemma" && m.role == "system" && !messages[i..].iter().any(|n| merged(&n.role)) {
                        continue;
                    }
                    let c = if named.name == "chatml" { m.content.as_str() } else { trim(&m.content) };
                    assert!(text.contains(c), "{}: content {c:?} missing from {text:?}", named.name);
                }
            }
            let ids = t.encode(&text, true, true);
            assert!(ids.iter().all(|&i| (i as usize) < t.vocab_size()));
            let _ = t.decode(&ids);
        }
        Err(TokenizerError::ChatTemplate(e) | TokenizerError::ChatTemplateRaised(e)) => {
            assert!(named.name.starts_with("jinja"), "{}: built-in format failed: {e}", named.name);
        }
        Err(e) => panic!("{}: unexpected error kind: {e}", named.name),
    }
});
