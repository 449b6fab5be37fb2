//! Both model families on the CPU, behind the engine's one interface (`model::loaded`).

use std::any::Any;

use model::error::{EngineError, Result};
use model::loaded::{Description, HostWeights, LoadedModel, Numerics, Session as SessionTrait, SessionConfig};
use model::loaded::{HostModel, checkpoint_position, downcast_session};
use model::qwen4exp::{self as q4, Qwen4Exp};
use model::{Decoder, Logits, Mat};

use crate::qwen4exp::Qwen4ExpCpu;
use crate::{DecoderCpu, Session};

/// A model description on the CPU.
pub fn on_cpu(m: HostModel) -> Box<dyn LoadedModel> {
    match m {
        HostModel::Decoder(m) => Box::new(CpuDecoder(*m)),
        HostModel::Qwen4Exp(m) => Box::new(CpuQwen4Exp(*m)),
    }
}

/// The shared decoder on the CPU.
pub struct CpuDecoder(pub Decoder);

/// Flash-Next on the CPU.
pub struct CpuQwen4Exp(pub Qwen4Exp);

/// A Flash-Next sequence on the CPU: its state plus the capacity the engine enforces.
pub struct Qwen4ExpSession {
    pub st: q4::SeqState,
    pub capacity: usize,
    /// The empty state, for [`SessionTrait::reset`].
    fresh: q4::SeqState,
}

impl SessionTrait for Session {
    fn n_past(&self) -> usize {
        self.n_past
    }
    fn capacity(&self) -> usize {
        Session::capacity(self)
    }
    fn reset(&mut self) {
        Session::reset(self)
    }
    fn trace_chunk(&self) -> Option<usize> {
        Some(self.prefill_chunk.max(1))
    }
    fn set_trace(&mut self, trace: Option<Vec<Vec<f32>>>) -> Option<Vec<Vec<f32>>> {
        std::mem::replace(&mut self.trace, trace)
    }
}

impl SessionTrait for Qwen4ExpSession {
    fn n_past(&self) -> usize {
        self.st.pos
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
    fn reset(&mut self) {
        self.st = self.fresh.clone();
    }
}

impl LoadedModel for CpuDecoder {
    fn description(&self) -> Description<'_> {
        Description::Decoder(&self.0)
    }
    fn backend(&self) -> String {
        "cpu".into()
    }
    fn kv_in_host_memory(&self) -> bool {
        true
    }

    fn new_session(&self, cfg: &SessionConfig) -> Result<Box<dyn SessionTrait>> {
        let mut s = self.0.try_new_session(cfg.kv, cfg.max_ctx, cfg.prefill_chunk)?;
        let ordered = cfg.numerics == Numerics::Ordered;
        s.ordered_attention = ordered;
        s.ordered = ordered;
        s.tiles = cfg.numerics == Numerics::Tiles;
        Ok(Box::new(s))
    }

    fn eval(&self, s: &mut dyn SessionTrait, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()> {
        self.0.eval(downcast_session::<Session>(s)?, tokens, want, out)
    }

    fn rollback(&self, s: &mut dyn SessionTrait, cp: Box<dyn Any>, keep: &[u32]) -> Result<usize> {
        // Positions cp..cp+keep.len() hold exactly the kept tokens' K/V (the verify window
        // wrote them in order); later cells are rejected drafts and become free.
        let s = downcast_session::<Session>(s)?;
        s.n_past = checkpoint_position(cp)? + keep.len();
        Ok(0)
    }

    fn host_matrices(&mut self, which: HostWeights) -> Vec<&mut Mat> {
        self.0.host_matrices(which)
    }
}

impl LoadedModel for CpuQwen4Exp {
    fn description(&self) -> Description<'_> {
        Description::Qwen4Exp(&self.0)
    }
    fn backend(&self) -> String {
        "cpu".into()
    }
    fn kv_in_host_memory(&self) -> bool {
        true
    }

    /// Its forward pass takes the whole window at once, in the session's numerics
    /// (`SeqState::numerics`).
    fn new_session(&self, cfg: &SessionConfig) -> Result<Box<dyn SessionTrait>> {
        let mut st = self.0.new_state(cfg.kv);
        st.numerics = cfg.numerics;
        Ok(Box::new(Qwen4ExpSession { fresh: st.clone(), st, capacity: cfg.max_ctx }))
    }

    fn eval(&self, s: &mut dyn SessionTrait, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()> {
        let f = downcast_session::<Qwen4ExpSession>(s)?;
        if tokens.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        let needed = f.st.pos + tokens.len();
        if needed > f.capacity {
            return Err(EngineError::ContextFull { needed, capacity: f.capacity });
        }
        let pos = f.st.pos;
        let mut l = self.0.forward(&mut f.st, tokens, pos)?;
        if want == Logits::Last {
            let nv = self.0.n_vocab();
            l.drain(..l.len() - nv);
        }
        *out = l;
        Ok(())
    }

    fn eval_hidden(&self, s: &mut dyn SessionTrait, tokens: &[u32]) -> Result<(Vec<f32>, Vec<f32>)> {
        let f = downcast_session::<Qwen4ExpSession>(s)?;
        let pos = f.st.pos;
        self.0.forward_hidden(&mut f.st, tokens, pos)
    }

    /// The GDN and PLE states cannot be truncated: the checkpoint copies them (fixed size, no
    /// KV copy).
    fn checkpoint(&self, s: &dyn SessionTrait) -> Box<dyn Any> {
        match s.downcast_ref::<Qwen4ExpSession>() {
            Some(f) => Box::new(self.0.checkpoint(&f.st)),
            None => Box::new(()),
        }
    }

    /// Restores the checkpoint (the attention caches truncated to it) and re-runs the accepted
    /// prefix in one call: one extra batched call of m + 1 tokens per window with a rejection,
    /// and the forward pass untouched.
    fn rollback(&self, s: &mut dyn SessionTrait, cp: Box<dyn Any>, keep: &[u32]) -> Result<usize> {
        let f = downcast_session::<Qwen4ExpSession>(s)?;
        let cp = cp.downcast::<q4::Checkpoint>().map_err(|_| EngineError::SessionMismatch)?;
        self.0.restore(&mut f.st, *cp)?;
        if !keep.is_empty() {
            let pos = f.st.pos;
            self.0.forward(&mut f.st, keep, pos)?;
        }
        Ok(keep.len())
    }

    fn host_matrices(&mut self, which: HostWeights) -> Vec<&mut Mat> {
        self.0.host_matrices(which)
    }
}
