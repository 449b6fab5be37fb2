//! [`VerifyModel`] for qwen4exp. The GDN layers and the PLE block carry recurrent state that
//! cannot be truncated, so a checkpoint copies it ([`Qwen4Exp::checkpoint`]: fixed size, no
//! KV copy) and a rollback restores it, truncates the attention caches to the checkpoint and
//! re-runs the accepted prefix `[last, accepted drafts]` in one call. Cheaper alternatives
//! (keeping the GDN state after every window position during the verify pass) would save that
//! re-run; this choice keeps the forward pass untouched and costs one extra batched call of
//! m + 1 tokens per window with a rejection.

use cpu_executor::prelude::*;
use model::error::EngineError;
use model::qwen4exp::{Checkpoint, Qwen4Exp, SeqState};

use super::VerifyModel;

impl VerifyModel for Qwen4Exp {
    type State = SeqState;
    type Checkpoint = Checkpoint;
    type Error = EngineError;

    fn n_vocab(&self) -> usize {
        self.hp.n_vocab
    }

    fn position(&self, st: &SeqState) -> usize {
        st.pos
    }

    fn forward(&self, st: &mut SeqState, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let pos = st.pos;
        Qwen4ExpCpu::forward(self, st, tokens, pos)
    }

    fn forward_hidden(&self, st: &mut SeqState, tokens: &[u32]) -> Result<(Vec<f32>, Vec<f32>), EngineError> {
        let pos = st.pos;
        Qwen4ExpCpu::forward_hidden(self, st, tokens, pos)
    }

    fn checkpoint(&self, st: &SeqState) -> Checkpoint {
        Qwen4Exp::checkpoint(self, st)
    }

    fn rollback(&self, st: &mut SeqState, cp: Checkpoint, keep: &[u32]) -> Result<usize, EngineError> {
        self.restore(st, cp)?;
        if !keep.is_empty() {
            let pos = st.pos;
            Qwen4ExpCpu::forward(self, st, keep, pos)?;
        }
        Ok(keep.len())
    }
}

/// The same on the device (`--device emu|hip`): the checkpoint copies the GDN and PLE states to
/// the session's snapshot buffers on the device, the rollback copies them back, moves the
/// position back (the attention cells after it are overwritten by the next window) and re-runs
/// the accepted prefix. The hidden states are the wide residuals read back with the logits
/// (what the MTP head on the device, `gpu::flash_next::GpuMtp`, reads).
#[cfg(feature = "gpu")]
impl VerifyModel for gpu_executor::flash_next::GpuFlashNext {
    type State = gpu_executor::flash_next::GpuFlashSession;
    type Checkpoint = gpu_executor::flash_next::GpuCheckpoint;
    type Error = EngineError;

    fn n_vocab(&self) -> usize {
        self.m.hp.n_vocab
    }

    fn position(&self, st: &Self::State) -> usize {
        st.n_past
    }

    fn forward(&self, st: &mut Self::State, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut out = Vec::new();
        self.eval(st, tokens, model::Logits::All, &mut out)?;
        Ok(out)
    }

    fn forward_hidden(&self, st: &mut Self::State, tokens: &[u32]) -> Result<(Vec<f32>, Vec<f32>), EngineError> {
        let (mut out, mut hidden) = (Vec::new(), Vec::new());
        self.eval_hidden(st, tokens, model::Logits::All, &mut out, Some(&mut hidden))?;
        Ok((out, hidden))
    }

    fn checkpoint(&self, st: &Self::State) -> Self::Checkpoint {
        gpu_executor::flash_next::GpuFlashNext::checkpoint(self, st)
    }

    fn rollback(&self, st: &mut Self::State, cp: Self::Checkpoint, keep: &[u32]) -> Result<usize, EngineError> {
        gpu_executor::flash_next::GpuFlashNext::rollback(self, st, cp)?;
        if !keep.is_empty() {
            self.forward(st, keep)?;
        }
        Ok(keep.len())
    }
}
