//! Flash-Next (`qwen4exp`) on the CPU: the executor of `model::qwen4exp::program` ([`ops`]) and
//! the arithmetic of its layers, one file per layer kind, matching llama.cpp on the public
//! fixtures. The model module holds the weights, states and the order of operations; this one
//! computes them, on the same thread team and product kernels as the shared decoders.

mod gdn;
mod gr;
pub mod linear;
mod mtp;
pub mod ops;
mod ple;
mod qsa;

pub use crate::moe::{MoeCpu, SwiGluCpu};
pub use gdn::GdnCpu;
pub use gr::HyperConnCpu;
pub use linear::{MatCpu, Numerics, NumericsCpu};
pub use mtp::MtpCpu;
pub use ple::{PleBlock, PleCpu, team_for_each};
pub use qsa::{QsaCpu, QsaProjections, heap_select};

use model::error::EngineError;
use model::qwen4exp::{Qwen4Exp, SeqState, Trace, program};

/// Tokens per internal micro-batch (bounds activation memory like llama.cpp's n_ubatch).
const UBATCH: usize = 512;

/// The CPU executor's methods on [`Qwen4Exp`] (a type of the `model` crate, which knows no backend).
pub trait Qwen4ExpCpu {
    /// Runs `tokens` at positions `start_pos..` (which must equal `st.pos`) and returns the
    /// logits of every position, `[tokens.len()][n_vocab]`.
    fn forward(&self, st: &mut SeqState, tokens: &[u32], start_pos: usize) -> Result<Vec<f32>, EngineError>;

    /// [`Qwen4Exp::forward`] that also records diagnostics.
    fn forward_traced(
        &self,
        st: &mut SeqState,
        tokens: &[u32],
        start_pos: usize,
        trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, EngineError>;

    /// [`Qwen4Exp::forward`] that also returns every position's wide residual, the `hc`
    /// hyper-connection streams before the output mixer, `[tokens.len()][hc][n_embd]`: what
    /// the MTP head reads (the published heads' `nextn.hnorm` is `[hc·n_embd]`).
    fn forward_hidden(
        &self,
        st: &mut SeqState,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), EngineError>;

    /// Greedy decoding: feeds `prompt` (positions from `st.pos`), then `n_gen` argmax tokens
    /// one forward call each (lowest id on ties). Returns the generated ids.
    fn generate_greedy(&self, st: &mut SeqState, prompt: &[u32], n_gen: usize) -> Result<Vec<u32>, EngineError>;
}

impl Qwen4ExpCpu for Qwen4Exp {
    fn forward(&self, st: &mut SeqState, tokens: &[u32], start_pos: usize) -> Result<Vec<f32>, EngineError> {
        self.forward_traced(st, tokens, start_pos, None)
    }

    fn forward_traced(
        &self,
        st: &mut SeqState,
        tokens: &[u32],
        start_pos: usize,
        trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, EngineError> {
        self.forward_full(st, tokens, start_pos, trace, None)
    }

    fn forward_hidden(
        &self,
        st: &mut SeqState,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), EngineError> {
        let mut hidden = vec![0f32; tokens.len() * self.hp.hc * self.hp.n_embd];
        let logits = self.forward_full(st, tokens, start_pos, None, Some(&mut hidden))?;
        Ok((logits, hidden))
    }

    fn generate_greedy(&self, st: &mut SeqState, prompt: &[u32], n_gen: usize) -> Result<Vec<u32>, EngineError> {
        let v = self.hp.n_vocab;
        let argmax = |row: &[f32]| {
            let mut best = 0;
            for (i, &x) in row.iter().enumerate() {
                if x > row[best] {
                    best = i;
                }
            }
            best as u32
        };
        let mut out = Vec::with_capacity(n_gen);
        if n_gen == 0 {
            return Ok(out);
        }
        let pos = st.pos;
        let logits = self.forward(st, prompt, pos)?;
        let Some(last) = logits.len().checked_sub(v).map(|o| &logits[o..]) else {
            return Ok(out); // empty prompt: nothing to continue from
        };
        out.push(argmax(last));
        while out.len() < n_gen {
            let pos = st.pos;
            let l = self.forward(st, &out[out.len() - 1..], pos)?;
            out.push(argmax(&l));
        }
        Ok(out)
    }
}

/// Steps of the methods above that stay private to this module.
trait Qwen4ExpSteps {
    fn forward_full(
        &self,
        st: &mut SeqState,
        tokens: &[u32],
        start_pos: usize,
        trace: Option<&mut Trace>,
        hidden: Option<&mut [f32]>,
    ) -> Result<Vec<f32>, EngineError>;

    /// One micro-batch at `st.pos`: the program of [`program::forward`] on the CPU.
    fn ubatch(
        &self,
        st: &mut SeqState,
        toks: &[u32],
        logits: &mut [f32],
        trace: Option<&mut Trace>,
        hidden: Option<&mut [f32]>,
    ) -> Result<(), EngineError>;
}

impl Qwen4ExpSteps for Qwen4Exp {
    fn forward_full(
        &self,
        st: &mut SeqState,
        tokens: &[u32],
        start_pos: usize,
        mut trace: Option<&mut Trace>,
        mut hidden: Option<&mut [f32]>,
    ) -> Result<Vec<f32>, EngineError> {
        if st.layers.len() != self.layers.len() || st.ple.is_some() != self.ple.is_some() {
            return Err(EngineError::StateMismatch { layer: st.layers.len().min(self.layers.len()) });
        }
        if start_pos != st.pos {
            return Err(EngineError::Position { expected: st.pos, got: start_pos });
        }
        if let Some((index, &token)) = tokens.iter().enumerate().find(|(_, t)| **t as usize >= self.hp.n_vocab) {
            return Err(EngineError::BadTokenAt { token, index, n_vocab: self.hp.n_vocab });
        }
        let mut logits = vec![0f32; tokens.len() * self.hp.n_vocab];
        for (ci, chunk) in tokens.chunks(UBATCH).enumerate() {
            let out = &mut logits[ci * UBATCH * self.hp.n_vocab..][..chunk.len() * self.hp.n_vocab];
            let w = self.hp.hc * self.hp.n_embd;
            let h = hidden.as_deref_mut().map(|h| &mut h[ci * UBATCH * w..][..chunk.len() * w]);
            self.ubatch(st, chunk, out, trace.as_deref_mut(), h)?;
        }
        Ok(logits)
    }

    fn ubatch(
        &self,
        st: &mut SeqState,
        toks: &[u32],
        logits: &mut [f32],
        trace: Option<&mut Trace>,
        hidden: Option<&mut [f32]>,
    ) -> Result<(), EngineError> {
        let mut chunk = ops::CpuQwen4ExpChunk::new(self, st, toks, logits, trace, hidden);
        // One spinning team for the whole micro-batch, as the shared decoders' CPU executor.
        cpu_kernels::team::with_team(|| program::forward(&mut chunk, self))?;
        st.pos += toks.len();
        Ok(())
    }
}
