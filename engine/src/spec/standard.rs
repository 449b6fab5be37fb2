//! [`VerifyModel`] for the shared decoder ([`Model`]: Gemma, Llama, Qwen2/3). Its only
//! sequence state is the KV cache, so a checkpoint is the position and a rollback truncates
//! the cache: cells past the kept prefix are simply overwritten later (nothing recomputed).

use cpu_executor::Session;
use cpu_executor::prelude::*;
use model::Logits;
use model::Model;
use model::error::EngineError;

use super::VerifyModel;

impl VerifyModel for Model {
    type State = Session;
    type Checkpoint = usize;
    type Error = EngineError;

    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn position(&self, st: &Session) -> usize {
        st.n_past
    }

    fn forward(&self, st: &mut Session, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut out = Vec::new();
        self.eval(st, tokens, Logits::All, &mut out)?;
        Ok(out)
    }

    fn checkpoint(&self, st: &Session) -> usize {
        st.n_past
    }

    fn rollback(&self, st: &mut Session, cp: usize, keep: &[u32]) -> Result<usize, EngineError> {
        // Positions cp..cp+keep.len() hold exactly the kept tokens' K/V (the verify window
        // wrote them in order); later cells are rejected drafts and become free.
        st.n_past = cp + keep.len();
        Ok(0)
    }
}

/// The shared decoder on a gfx11 device: the same KV-only rollback. A verify window of up to
/// 9 tokens runs MMVQ (8 + 1 columns), whose columns are computed exactly as single-token
/// steps, so speculative output equals plain greedy output on the device too.
#[cfg(feature = "gpu")]
impl VerifyModel for gpu_executor::model::GpuModel {
    type State = gpu_executor::model::GpuSession;
    type Checkpoint = usize;
    type Error = EngineError;

    fn n_vocab(&self) -> usize {
        self.model.n_vocab
    }

    fn position(&self, st: &Self::State) -> usize {
        st.n_past
    }

    fn forward(&self, st: &mut Self::State, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut out = Vec::new();
        self.eval(st, tokens, Logits::All, &mut out)?;
        Ok(out)
    }

    fn checkpoint(&self, st: &Self::State) -> usize {
        st.n_past
    }

    fn rollback(&self, st: &mut Self::State, cp: usize, keep: &[u32]) -> Result<usize, EngineError> {
        st.n_past = cp + keep.len();
        Ok(0)
    }
}
