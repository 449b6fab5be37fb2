//! [`VerifyModel`] for every model the engine loads, through its backend's own checkpoint and
//! rollback (`model::loaded`). A KV-only sequence (the shared decoder) checkpoints its position
//! and truncates its cache on rollback: cells past the kept prefix are overwritten later, and
//! nothing is recomputed. Flash-Next's GDN and PLE states cannot be truncated: its checkpoint
//! copies them (fixed size, no KV copy), and the rollback restores them and re-runs the
//! accepted prefix `[last, accepted drafts]` in one call.

use std::any::Any;

use model::error::EngineError;
use model::loaded::{LoadedModel, Session};

use super::VerifyModel;

impl VerifyModel for dyn LoadedModel {
    type State = Box<dyn Session>;
    type Checkpoint = Box<dyn Any>;
    type Error = EngineError;

    fn n_vocab(&self) -> usize {
        LoadedModel::n_vocab(self)
    }

    fn position(&self, st: &Self::State) -> usize {
        st.n_past()
    }

    fn forward(&self, st: &mut Self::State, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut out = Vec::new();
        self.eval(&mut **st, tokens, model::Logits::All, &mut out)?;
        Ok(out)
    }

    fn forward_hidden(&self, st: &mut Self::State, tokens: &[u32]) -> Result<(Vec<f32>, Vec<f32>), EngineError> {
        self.eval_hidden(&mut **st, tokens)
    }

    fn checkpoint(&self, st: &Self::State) -> Self::Checkpoint {
        LoadedModel::checkpoint(self, &**st)
    }

    fn rollback(&self, st: &mut Self::State, cp: Self::Checkpoint, keep: &[u32]) -> Result<usize, EngineError> {
        LoadedModel::rollback(self, &mut **st, cp, keep)
    }
}
