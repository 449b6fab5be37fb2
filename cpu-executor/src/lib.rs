//! The CPU executor of the shared decoder: it runs the program of `model::decoder` with
//! `cpu_kernels` (the operations are in [`chunk`]).
//!
//! Tokens are processed in chunks of `prefill_chunk` rows: every projection is one
//! `cpu_kernels::matmul` over the chunk (a `matvec` for single-token decode), attention reads the
//! per-sequence KV cache. Scratch buffers live in the [`Session`] and only grow, so steady-state
//! decoding allocates nothing.

pub mod attention;
mod chunk;
pub mod f16;
pub mod kv_cache;
pub mod loaded;
mod mat;
mod matmul;
pub mod moe;
pub mod qwen4exp;

use crate::kv_cache::{KvCache, KvType};
pub use loaded::{CpuDecoder, CpuQwen4Exp, Qwen4ExpSession, on_cpu};
pub use mat::MatCpu;
pub use matmul::DecoderMatmul;
pub use matmul::{ExpertActs, matmul_ordered, matmul_prepared};
use model::error::{EngineError, Result};
pub use model::loaded::Numerics;
use model::op_profile::{OpProfile, Timed};
use model::{Decoder, Logits, decoder};

/// The CPU executor's methods on the `model` crate's types, in one import:
/// `use strata::cpu::prelude::*;` (the model crate knows no backend, so these are traits).
pub mod prelude {
    pub use super::DecoderCpu;
    pub use super::qwen4exp::{
        GdnCpu, HyperConnCpu, MatCpu, MoeCpu, MtpCpu, NumericsCpu, PleCpu, QsaCpu, Qwen4ExpCpu, SwiGluCpu,
    };
}

/// Per-sequence state: KV cache, position, and reusable scratch buffers.
pub struct Session {
    pub cache: KvCache,
    /// Number of positions already in the cache.
    pub n_past: usize,
    /// Maximum rows per forward chunk (`--prefill`).
    pub prefill_chunk: usize,
    /// When set, the residual stream after every layer of the next forward chunk is copied
    /// here (`[layer][tokens * n_embd]`; backend parity tests).
    pub trace: Option<Vec<Vec<f32>>>,
    /// Attention in the fixed float order of `attention::attend_ordered`, the order the GPU's
    /// ordered mode uses, so both backends compute it bit for bit alike (`--ordered-attention`).
    pub ordered_attention: bool,
    /// Ordered-numerics mode (`--ordered`): besides ordered attention, every matrix product is
    /// [`matmul::matmul_ordered`] (the `quant` crate's reference quantizer and `vec_dot`, the code the
    /// GPU's `mmv_ordered` kernel runs per output), SiLU / non-Gemma GELU use `quant::fmath`,
    /// and MoE routing/combining follow the GPU kernels' order. With `GpuOptions::ordered` the
    /// GPU backend computes every layer and the logits bit for bit alike. Slower.
    pub ordered: bool,
    /// `--cpu-gemm tiles`: prompt products through the exact-block row tiles
    /// ([`Numerics::Tiles`]); `ordered` takes precedence.
    pub tiles: bool,
    /// When set, every operation of the following forward chunks is timed into it
    /// (`strata bench --profile`).
    pub profile: Option<OpProfile>,
    s: Scratch,
}

/// Rope angles of one chunk: ((base bits, scale bits, pos0, n), `[n][rot/2]` (cos, sin)).
type RopeCs = ((u32, u32, usize, usize), Vec<(f32, f32)>);

/// The activation buffers of [`decoder::Buf`] plus the FFN's and rope's own.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
    /// ggml rope angles of the current chunk: ((base bits, scale bits, pos0, n), [n][rot/2]).
    rope_cs: Vec<RopeCs>,
    moe: moe::MoeScratch,
}

/// Grows `v` to at least `n` elements (never shrinks: no steady-state allocation).
#[inline]
pub(crate) fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

impl Session {
    /// Forgets the sequence (the cache contents are overwritten by the next evaluation).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }
    pub fn capacity(&self) -> usize {
        self.cache.capacity
    }
}

/// The CPU executor's methods on [`Model`] (a type of the `model` crate, which knows no backend).
pub trait DecoderCpu {
    /// A fresh sequence with room for `max_ctx` positions (panics when its cache cannot be
    /// allocated: [`DecoderCpu::try_new_session`] is the engine's).
    fn new_session(&self, kv: KvType, max_ctx: usize, prefill_chunk: usize) -> Session {
        self.try_new_session(kv, max_ctx, prefill_chunk).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`DecoderCpu::new_session`], with a cache that cannot be allocated as an error.
    fn try_new_session(&self, kv: KvType, max_ctx: usize, prefill_chunk: usize) -> Result<Session>;

    /// Appends `tokens` to the sequence and writes logits to `out`
    /// (`[1][vocab]` for [`Logits::Last`], `[tokens.len()][vocab]` for [`Logits::All`]).
    /// Runs with the pool's threads as one spinning team (`cpu_kernels::team::with_team`).
    fn eval(&self, s: &mut Session, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()>;
}

impl DecoderCpu for Decoder {
    fn try_new_session(&self, kv: KvType, max_ctx: usize, prefill_chunk: usize) -> Result<Session> {
        Ok(Session {
            cache: KvCache::try_new(kv, max_ctx, &self.cache_shape())?,
            n_past: 0,
            prefill_chunk: prefill_chunk.max(1),
            trace: None,
            ordered_attention: false,
            ordered: false,
            tiles: false,
            profile: None,
            s: Scratch::default(),
        })
    }

    fn eval(&self, s: &mut Session, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()> {
        cpu_kernels::team::with_team(|| self.eval_on_team(s, tokens, want, out))
    }
}

/// Steps of the methods above that stay private to this module.
trait DecoderSteps {
    fn eval_on_team(&self, s: &mut Session, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()>;

    fn forward_chunk(&self, sess: &mut Session, toks: &[u32], want: Logits, logits: Option<&mut [f32]>) -> Result<()>;
}

impl DecoderSteps for Decoder {
    fn eval_on_team(&self, s: &mut Session, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        if let Some(index) = tokens.iter().position(|&t| t as usize >= self.n_vocab) {
            return Err(EngineError::BadTokenAt { token: tokens[index], index, n_vocab: self.n_vocab });
        }
        let needed = s.n_past + tokens.len();
        if needed > s.cache.capacity {
            return Err(EngineError::ContextFull { needed, capacity: s.cache.capacity });
        }
        let nv = self.n_vocab;
        let rows = if want == Logits::All { tokens.len() } else { 1 };
        if out.len() != rows * nv {
            out.resize(rows * nv, 0.0);
        }
        let chunk = s.prefill_chunk;
        let n_chunks = tokens.len().div_ceil(chunk);
        for (ci, toks) in tokens.chunks(chunk).enumerate() {
            let last = ci + 1 == n_chunks;
            let dst = match want {
                Logits::All => Some(&mut out[ci * chunk * nv..(ci * chunk + toks.len()) * nv]),
                Logits::Last if last => Some(&mut out[..]),
                Logits::Last => None,
            };
            self.forward_chunk(s, toks, want, dst)?;
            s.n_past += toks.len();
        }
        Ok(())
    }

    fn forward_chunk(&self, sess: &mut Session, toks: &[u32], want: Logits, logits: Option<&mut [f32]>) -> Result<()> {
        let hp = &self.hp;
        let n = toks.len();
        let (d, nq, nk) = (hp.n_embd, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim);
        let ff = hp.moe.as_ref().map_or(hp.n_ff, |m| m.n_ff_exp);
        let s = &mut sess.s;
        for (buf, len) in
            [(&mut s.x, n * d), (&mut s.xn, n * d.max(nq)), (&mut s.q, n * nq), (&mut s.k, n * nk), (&mut s.v, n * nk)]
        {
            grow(buf, len);
        }
        for (buf, len) in
            [(&mut s.att, n * nq), (&mut s.o, n * d), (&mut s.gate, n * ff), (&mut s.up, n * ff), (&mut s.act, n * ff)]
        {
            grow(buf, len);
        }
        let logits_from = logits.is_some().then(|| if want == Logits::All { 0 } else { n - 1 });
        let mut trace = sess.trace.take();
        if let Some(t) = trace.as_mut() {
            t.clear();
        }
        let mut chunk = chunk::CpuChunk {
            m: self,
            s: &mut sess.s,
            cache: &mut sess.cache,
            toks,
            pos0: sess.n_past,
            ordered: sess.ordered,
            ordered_attention: sess.ordered_attention || sess.ordered,
            tiles: sess.tiles,
            trace: trace.as_mut(),
            logits,
        };
        let r = match sess.profile.as_mut() {
            None => decoder::forward(&mut chunk, hp, &self.w, logits_from),
            Some(profile) => {
                let t = std::time::Instant::now();
                let r = decoder::forward(
                    &mut Timed { inner: &mut chunk, profile: &mut *profile },
                    hp,
                    &self.w,
                    logits_from,
                );
                profile.add_chunk(t.elapsed());
                r
            }
        };
        sess.trace = trace;
        r
    }
}
