//! Qwen3.8-Flash-Next (GGUF architecture `qwen4exp`), described once: hyperparameters, weights,
//! sequence state and the order of operations ([`program`]). `cpu::qwen4exp` computes it
//! (matching llama.cpp 0c1e570), `gpu::qwen4exp` runs the same program on the device.
//!
//! A hybrid decoder: Gated DeltaNet layers ([`gdn`]) and sparse-attention layers ([`qsa`])
//! over hyper-connection residual streams ([`gr`]), a 512-expert MoE with a shared expert in
//! every layer ([`moe`]), and one PLE n-gram table block ([`ple`]) before one GDN layer. The
//! exact computation (and the numerics that matter: f16 KV/indexer cache rounding, libstdc++
//! heap-order tie-breaking of the QSA top-k) is described in
//! `testdata/reference/tiny-qwen4exp/README.md`; each module repeats its part, and its CPU
//! arithmetic is the file of the same name in `cpu::qwen4exp`.
//!
//! ```text
//! R_t[c] = token_embd[tok_t] for each of the hc streams
//! per layer: R ← PLE(R) (PLE layer only)
//!            (x, inj) = HCmix_attn(R); y = GDN(x) or QSA(x); R ← HCcombine(R, y, inj)
//!            (x, inj) = HCmix_ffn(R);  y = MoE(x);           R ← HCcombine(R, y, inj)
//! logits = W_out · HCmix_head(R)        (no output_norm; W_out falls back to token_embd)
//! ```
//! Use: [`Qwen4Exp::open`], [`Qwen4Exp::new_state`], then `Qwen4Exp::forward` (the CPU's,
//! `cpu::qwen4exp`) with the tokens of one or more steps; logits come back for every position.

pub mod gdn;
pub mod gr;
pub mod hparams;
mod load;
pub mod moe;
pub mod mtp;
pub mod ple;
pub mod ple_io;
pub mod program;
pub mod qsa;

use std::path::Path;
use std::sync::Arc;

use gguf::GgufFile;

use crate::Mat;
use crate::error::EngineError;

pub use gdn::{Gdn, GdnMode, GdnState};
pub use gr::HyperConn;
pub use hparams::{HParams, LayerKind, PleParams};
pub use moe::{Moe, SwiGlu};
pub use mtp::{Mtp, MtpState};
pub use ple::{Ple, PleState};
pub use ple_io::{ParFor, PleCacheStats, PleIo, PleOptions, PleTable, RowCache};
pub use qsa::{Indexer, Qsa, QsaCache};

/// Element type of the attention K/V and indexer-key caches: the engine's one cache type. F16
/// (llama.cpp's default) rounds the values, and q and the softmax probabilities, to f16; F32
/// keeps them exact; Int8 stores rows with a scale each (`KvRows::Int8`).
pub use crate::KvType;

/// The token mixer of a layer.
#[derive(Debug)]
pub enum Mixer {
    Gdn(Gdn),
    /// QSA (with indexer) or dense attention (without).
    Attn(Qsa),
}

/// One decoder layer.
#[derive(Debug)]
pub struct Layer {
    pub hc_attn: HyperConn,
    pub mixer: Mixer,
    pub hc_ffn: HyperConn,
    pub moe: Moe,
}

/// A loaded model (weights reference the memory-mapped GGUF).
pub struct Qwen4Exp {
    pub hp: HParams,
    pub file: Arc<GgufFile>,
    pub tok_embd: Mat,
    pub output: Mat,
    pub out_hc: HyperConn,
    pub layers: Vec<Layer>,
    pub ple: Option<Ple>,
    /// How multi-token GDN passes run (default: token-by-token recurrence).
    pub gdn_mode: GdnMode,
    /// Load-time warnings (PLE skipped, O_DIRECT fallback), also printed to stderr.
    pub warnings: Vec<String>,
}

/// Per-layer sequence state.
#[derive(Clone, Debug, PartialEq)]
pub enum LayerState {
    Gdn(GdnState),
    Attn(QsaCache),
}

/// Everything one sequence carries between `forward` calls.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqState {
    /// Tokens consumed so far (the next position).
    pub pos: usize,
    /// The float order the CPU runs this sequence in: `Ordered` (`--ordered`) is the device's
    /// own, every operation as the device kernels compute it (bit for bit alike), and the GDN
    /// recurrence token by token as the device's windows run it.
    pub numerics: crate::loaded::Numerics,
    pub layers: Vec<LayerState>,
    pub ple: Option<PleState>,
}

/// What a speculative verify must restore: the recurrent state (GDN layers, PLE predecessors
/// and conv history) is copied; the attention caches are not (they are truncated instead).
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    pub pos: usize,
    /// `Some` for GDN layers, `None` for attention layers.
    pub gdn: Vec<Option<GdnState>>,
    pub ple: Option<PleState>,
}

/// Optional diagnostics of a forward pass.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// `(layer, kept cells per token)` for every indexer-selected attention layer.
    pub qsa_selections: Vec<(usize, Vec<Vec<usize>>)>,
    /// The wide residual `R` after every trunk layer, `[layer][tokens][hc][E]` (the ordered
    /// mode's parity tests compare it with the device's `GpuQwen4ExpSession::trace`).
    pub residuals: Vec<Vec<f32>>,
}

impl Qwen4Exp {
    /// Opens a GGUF (split siblings included) and resolves every tensor.
    pub fn open(path: &Path) -> Result<Qwen4Exp, EngineError> {
        Self::open_with(path, &PleOptions::default())
    }

    /// [`Qwen4Exp::open`] with PLE table options (shard path, I/O mode, cache, skip).
    pub fn open_with(path: &Path, opt: &PleOptions) -> Result<Qwen4Exp, EngineError> {
        let g = GgufFile::open(path).map_err(|source| EngineError::Gguf { path: path.to_path_buf(), source })?;
        Self::from_gguf_with(g, opt)
    }

    pub fn from_gguf(g: GgufFile) -> Result<Qwen4Exp, EngineError> {
        Self::from_gguf_with(g, &PleOptions::default())
    }

    pub fn from_gguf_with(g: GgufFile, opt: &PleOptions) -> Result<Qwen4Exp, EngineError> {
        load::load(Arc::new(g), opt)
    }

    /// Row-cache and read counters of the PLE table (`None` without a PLE block).
    pub fn ple_stats(&self) -> Option<PleCacheStats> {
        self.ple.as_ref().map(|p| p.table.stats())
    }

    pub fn n_vocab(&self) -> usize {
        self.hp.n_vocab
    }

    /// Bytes one position takes in every attention layer's cache as `kv`: K and V rows and
    /// the indexer's key; None on overflow. The memory plan's unit.
    pub fn kv_bytes_per_position(&self, kv: KvType) -> Option<u64> {
        self.layers.iter().try_fold(0u64, |sum, l| match &l.mixer {
            Mixer::Gdn(_) => Some(sum),
            Mixer::Attn(a) => {
                let kv_rows = kv.bytes_for(a.n_head_kv.checked_mul(a.head_dim)?, a.head_dim)?.checked_mul(2)?;
                let kappa = a.indexer.as_ref().map_or(Some(0), |ix| kv.bytes_for(ix.dim, ix.dim))?;
                sum.checked_add(kv_rows)?.checked_add(kappa)
            }
        })
    }

    /// An empty sequence state.
    pub fn new_state(&self, kv: KvType) -> SeqState {
        let layers = self
            .layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Gdn(g) => LayerState::Gdn(g.new_state()),
                Mixer::Attn(a) => LayerState::Attn(a.new_cache(kv)),
            })
            .collect();
        SeqState { pos: 0, numerics: Default::default(), layers, ple: self.ple.as_ref().map(Ple::new_state) }
    }

    /// A checkpoint of `st` for [`Qwen4Exp::restore`]: copies only the fixed-size recurrent
    /// state, so its cost does not grow with the context.
    pub fn checkpoint(&self, st: &SeqState) -> Checkpoint {
        Checkpoint {
            pos: st.pos,
            gdn: st
                .layers
                .iter()
                .map(|l| match l {
                    LayerState::Gdn(g) => Some(g.clone()),
                    LayerState::Attn(_) => None,
                })
                .collect(),
            ple: st.ple.clone(),
        }
    }

    /// Brings `st` back to `cp` (taken from this sequence, which has only advanced since):
    /// recurrent state restored, attention caches truncated to `cp.pos` cells. The result
    /// equals the state at the checkpoint.
    pub fn restore(&self, st: &mut SeqState, cp: Checkpoint) -> Result<(), EngineError> {
        if cp.gdn.len() != st.layers.len() || cp.pos > st.pos {
            return Err(EngineError::Position { expected: st.pos, got: cp.pos });
        }
        let cur = st.pos;
        for (il, (ls, g)) in st.layers.iter_mut().zip(cp.gdn).enumerate() {
            match (ls, g, &self.layers[il].mixer) {
                (LayerState::Gdn(s), Some(g), _) => *s = g,
                (LayerState::Attn(c), None, Mixer::Attn(a)) => {
                    let block = a.indexer.as_ref().map(|ix| (ix.ratio, ix.dim));
                    c.truncate(cp.pos, cur, block);
                }
                _ => return Err(EngineError::StateMismatch { layer: il }),
            }
        }
        st.ple = cp.ple;
        st.pos = cp.pos;
        Ok(())
    }
}
