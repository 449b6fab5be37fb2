//! Prompt reuse: a request that begins with tokens the session already consumed computes only
//! the rest (a chat's next turn, an agent resending its context).
//!
//! The session remembers the tokens it consumed. A new request keeps the longest common
//! prefix, always leaving at least its last token to run (its logits start the generation):
//! - a KV-only sequence (the shared decoder) is truncated to that prefix
//!   ([`LoadedModel::truncate`]); nothing is recomputed;
//! - a recurrent one (Flash-Next) cannot be truncated, so each request ends with a checkpoint
//!   of its states ([`LoadedModel::checkpoint`]: fixed size, the KV cells are not copied), and
//!   the next request restores it when the checkpoint's position is within the common prefix.
//!   Otherwise it starts from scratch.
//!
//! Output with reuse equals a cold run's: the kept cells and states are exactly those a cold
//! run computes for the same tokens (the tests check this bit for bit on greedy).

use std::any::Any;

use model::error::Result;
use model::loaded::{LoadedModel, Session};

/// What one session holds from its previous request.
#[derive(Default)]
pub struct PromptReuse {
    /// Every token the session consumed, in order.
    consumed: Vec<u32>,
    /// A recurrent model's states at the end of the previous request, and their position.
    checkpoint: Option<(usize, Box<dyn Any>)>,
}

impl PromptReuse {
    /// Takes `sess` to the longest reusable prefix of `tokens` (non-empty) and returns its
    /// length: the tokens the caller must not run again (always fewer than `tokens.len()`).
    pub fn resume(&mut self, model: &dyn LoadedModel, sess: &mut dyn Session, tokens: &[u32]) -> Result<usize> {
        debug_assert_eq!(self.consumed.len(), sess.n_past(), "PromptReuse out of step with its session");
        let common = self.consumed.iter().zip(tokens).take_while(|(a, b)| a == b).count().min(tokens.len() - 1);
        let kept = if common == 0 {
            0
        } else if model.truncate(sess, common)? {
            common
        } else {
            match self.checkpoint.take() {
                Some((at, cp)) if at <= common => {
                    model.rollback(sess, cp, &[])?;
                    at
                }
                _ => 0,
            }
        };
        if kept == 0 {
            self.forget(sess);
        }
        self.consumed.truncate(kept);
        Ok(kept)
    }

    /// `sess` consumed `tokens` (after those [`PromptReuse::resume`] kept).
    pub fn consumed(&mut self, tokens: &[u32]) {
        self.consumed.extend_from_slice(tokens);
    }

    /// The request is over: a recurrent model checkpoints its states for the next one.
    pub fn finish(&mut self, model: &dyn LoadedModel, sess: &dyn Session) {
        self.checkpoint = None;
        if !model.kv_only() && !self.consumed.is_empty() {
            self.checkpoint = Some((self.consumed.len(), model.checkpoint(sess)));
        }
    }

    /// Starts over: an empty session and nothing to reuse (after an error, or a run that
    /// used the session in a way this does not track).
    pub fn forget(&mut self, sess: &mut dyn Session) {
        sess.reset();
        self.consumed.clear();
        self.checkpoint = None;
    }
}
