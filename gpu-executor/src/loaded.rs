//! Both model families on a gfx11 device, behind the engine's one interface (`model::loaded`).

use std::any::Any;

use model::error::{EngineError, Result};
use model::loaded::{
    Description, HostWeights, LoadedModel, Session, SessionConfig, checkpoint_position, downcast_session,
};
use model::{Logits, Mat};

use crate::model::{GpuModel, GpuSession};
use crate::qwen4exp::{GpuCheckpoint, GpuQwen4Exp, GpuQwen4ExpSession};

impl Session for GpuSession {
    fn n_past(&self) -> usize {
        self.n_past
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
    /// The cache rows are overwritten by the next evaluation.
    fn reset(&mut self) {
        self.n_past = 0;
    }
    fn trace_chunk(&self) -> Option<usize> {
        Some(self.chunk.max(1))
    }
    fn set_trace(&mut self, trace: Option<Vec<Vec<f32>>>) -> Option<Vec<Vec<f32>>> {
        std::mem::replace(&mut self.trace, trace)
    }
}

impl Session for GpuQwen4ExpSession {
    fn n_past(&self) -> usize {
        self.n_past
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
    /// The recurrent and PLE state start over too: a Flash-Next device session resets by value.
    fn reset(&mut self) {
        GpuQwen4ExpSession::reset(self)
    }
}

/// The shared decoder on the device: a KV-only sequence, so a rollback truncates. A verify
/// window of up to 9 tokens runs MMVQ (8 + 1 columns), whose columns are computed exactly as
/// single-token steps, so speculative output equals plain greedy output on the device too.
impl LoadedModel for GpuModel {
    fn description(&self) -> Description<'_> {
        Description::Decoder(&self.model)
    }
    fn backend(&self) -> String {
        self.res.backend()
    }
    fn kv_in_host_memory(&self) -> bool {
        self.res.memory_is_the_hosts()
    }

    /// The numerics mode is the model's, fixed at load (`GpuOptions::ordered`).
    fn new_session(&self, cfg: &SessionConfig) -> Result<Box<dyn Session>> {
        Ok(Box::new(GpuModel::new_session(self, cfg.kv, cfg.max_ctx, cfg.prefill_chunk)?))
    }

    fn eval(&self, s: &mut dyn Session, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()> {
        GpuModel::eval(self, downcast_session::<GpuSession>(s)?, tokens, want, out)
    }

    fn rollback(&self, s: &mut dyn Session, cp: Box<dyn Any>, keep: &[u32]) -> Result<usize> {
        let s = downcast_session::<GpuSession>(s)?;
        s.n_past = checkpoint_position(cp)? + keep.len();
        Ok(0)
    }

    fn expert_cache_stats(&self) -> Option<experts::counters::CacheStats> {
        self.res.expert_cache_stats()
    }
    fn save_expert_profile(&self, path: &std::path::Path) -> Result<bool> {
        self.res.save_expert_profile_if_cached(path)
    }
    /// The host copies an expert cache's misses read (the weights themselves are in VRAM).
    fn host_matrices(&mut self, which: HostWeights) -> Vec<&mut Mat> {
        if which == HostWeights::Experts && self.res.expert_cache.is_some() {
            self.model.host_matrices(which)
        } else {
            Vec::new()
        }
    }
}

/// Flash-Next on the device: the checkpoint copies the GDN and PLE states to the session's
/// snapshot buffers on the device, the rollback copies them back, moves the position back (the
/// attention cells after it are overwritten by the next window) and re-runs the accepted
/// prefix. The hidden states are the wide residuals read back with the logits (what the MTP
/// head on the device, `qwen4exp::GpuMtp`, reads).
impl LoadedModel for GpuQwen4Exp {
    fn description(&self) -> Description<'_> {
        Description::Qwen4Exp(&self.m)
    }
    fn backend(&self) -> String {
        self.res.backend()
    }
    fn kv_in_host_memory(&self) -> bool {
        self.res.memory_is_the_hosts()
    }

    fn new_session(&self, cfg: &SessionConfig) -> Result<Box<dyn Session>> {
        Ok(Box::new(self.new_session_chunked(cfg.kv, cfg.max_ctx, cfg.prefill_chunk)?))
    }

    fn eval(&self, s: &mut dyn Session, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()> {
        GpuQwen4Exp::eval(self, downcast_session::<GpuQwen4ExpSession>(s)?, tokens, want, out)
    }

    fn eval_hidden(&self, s: &mut dyn Session, tokens: &[u32]) -> Result<(Vec<f32>, Vec<f32>)> {
        let (mut out, mut hidden) = (Vec::new(), Vec::new());
        let s = downcast_session::<GpuQwen4ExpSession>(s)?;
        GpuQwen4Exp::eval_hidden(self, s, tokens, Logits::All, &mut out, Some(&mut hidden))?;
        Ok((out, hidden))
    }

    fn checkpoint(&self, s: &dyn Session) -> Box<dyn Any> {
        match s.downcast_ref::<GpuQwen4ExpSession>() {
            Some(s) => Box::new(GpuQwen4Exp::checkpoint(self, s)),
            None => Box::new(()),
        }
    }

    fn rollback(&self, s: &mut dyn Session, cp: Box<dyn Any>, keep: &[u32]) -> Result<usize> {
        let cp = cp.downcast::<GpuCheckpoint>().map_err(|_| EngineError::SessionMismatch)?;
        GpuQwen4Exp::rollback(self, downcast_session::<GpuQwen4ExpSession>(s)?, *cp)?;
        if !keep.is_empty() {
            let mut out = Vec::new();
            LoadedModel::eval(self, s, keep, Logits::All, &mut out)?;
        }
        Ok(keep.len())
    }

    fn expert_cache_stats(&self) -> Option<experts::counters::CacheStats> {
        self.res.expert_cache_stats()
    }
    fn save_expert_profile(&self, path: &std::path::Path) -> Result<bool> {
        self.res.save_expert_profile_if_cached(path)
    }
    fn host_matrices(&mut self, which: HostWeights) -> Vec<&mut Mat> {
        if which == HostWeights::Experts && self.res.expert_cache.is_some() {
            self.m.host_matrices(which)
        } else {
            Vec::new()
        }
    }
}
