//! The engine facade the commands and the server use: a model, its tokenizer, and helpers to
//! run sequences (prefill + sampled decode) on a [`Session`].

use std::path::Path;

use tokenizer::Tokenizer;

use crate::error::{EngineError, Result};
use crate::kv_cache::KvType;
use crate::model::Model;
use crate::model::forward::{Logits, Session};
use crate::sampler::Sampler;

/// How sessions are built (from the validated CLI config).
#[derive(Clone, Debug, PartialEq)]
pub struct RunOptions {
    pub kv: KvType,
    /// KV capacity in positions (0: the model's training context).
    pub max_context: usize,
    /// Tokens per prefill chunk.
    pub prefill: usize,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions { kv: KvType::F16, max_context: 4096, prefill: 512 }
    }
}

pub struct Engine {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub opts: RunOptions,
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// An end-of-generation token was sampled (not included in the output).
    Eog,
    /// The requested number of tokens was produced.
    Length,
    /// The callback asked to stop.
    Callback,
}

impl Engine {
    pub fn load(path: &Path, opts: RunOptions) -> Result<Engine> {
        let model = Model::load(path)?;
        let tokenizer = Tokenizer::from_gguf(&model.gguf)
            .map_err(|source| EngineError::Tokenizer { path: path.to_path_buf(), source })?;
        Ok(Engine { model, tokenizer, opts })
    }

    /// KV capacity for new sessions.
    pub fn context_size(&self) -> usize {
        if self.opts.max_context == 0 { self.model.hp.n_ctx_train } else { self.opts.max_context }
    }

    pub fn new_session(&self) -> Session {
        self.model.new_session(self.opts.kv, self.context_size(), self.opts.prefill)
    }

    /// Encodes a prompt the way llama.cpp's examples do (BOS per the model, no special parsing
    /// unless asked).
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        self.tokenizer.encode(text, self.tokenizer.add_bos(), parse_special)
    }

    /// Evaluates `prompt` on a fresh session state and samples up to `n` tokens, calling
    /// `on_token` for each (return false to stop). Returns the tokens and why it stopped.
    pub fn generate(
        &self,
        sess: &mut Session,
        prompt: &[u32],
        n: usize,
        sampler: &mut Sampler,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, Stop)> {
        let needed = sess.n_past + prompt.len() + n.saturating_sub(1);
        if needed > sess.capacity() {
            return Err(EngineError::ContextFull { needed, capacity: sess.capacity() });
        }
        let mut logits = Vec::new();
        self.model.eval(sess, prompt, Logits::Last, &mut logits)?;
        for &t in prompt {
            sampler.accept(t);
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let t = sampler.sample(&logits);
            if self.tokenizer.is_eog(t) {
                return Ok((out, Stop::Eog));
            }
            sampler.accept(t);
            out.push(t);
            if !on_token(t) {
                return Ok((out, Stop::Callback));
            }
            if out.len() < n {
                self.model.eval(sess, &[t], Logits::Last, &mut logits)?;
            }
        }
        Ok((out, Stop::Length))
    }
}

/// Turns a stream of token byte strings into valid UTF-8 text pieces, holding back incomplete
/// multi-byte sequences (byte-fallback tokens split characters).
#[derive(Default)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    /// Adds bytes; returns the longest complete UTF-8 prefix (invalid bytes become U+FFFD).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..good]).expect("validated prefix"));
                    match e.error_len() {
                        // Incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is left (lossy).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::TextStream;

    #[test]
    fn text_stream_holds_split_characters() {
        let mut t = TextStream::default();
        let e = "é".as_bytes();
        assert_eq!(t.push(&e[..1]), "");
        assert_eq!(t.push(&e[1..]), "é");
        assert_eq!(t.push(b"a\xffb"), "a\u{FFFD}b");
    }
}
