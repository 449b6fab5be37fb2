//! Qwen3.8-Flash-Next (GGUF architecture `qwen4exp`) on the CPU, matching llama.cpp 0c1e570.
//!
//! A hybrid decoder: Gated DeltaNet layers ([`gdn`]) and sparse-attention layers ([`qsa`])
//! over hyper-connection residual streams ([`gr`]), a 512-expert MoE with a shared expert in
//! every layer ([`moe`]), and one PLE n-gram table block ([`ple`]) before one GDN layer. The
//! exact computation (and the numerics that matter: f16 KV/indexer cache rounding, libstdc++
//! heap-order tie-breaking of the QSA top-k) is described in
//! `testdata/reference/tiny-qwen4exp/README.md`; each module repeats its part.
//!
//! ```text
//! R_t[c] = token_embd[tok_t] for each of the hc streams
//! per layer: R ← PLE(R) (PLE layer only)
//!            (x, inj) = HCmix_attn(R); y = GDN(x) or QSA(x); R ← HCcombine(R, y, inj)
//!            (x, inj) = HCmix_ffn(R);  y = MoE(x);           R ← HCcombine(R, y, inj)
//! logits = W_out · HCmix_head(R)        (no output_norm; W_out falls back to token_embd)
//! ```
//! Use: [`Qwen4Exp::open`], [`Qwen4Exp::new_state`], then [`Qwen4Exp::forward`] with the
//! tokens of one or more steps; logits come back for every position.

pub mod gdn;
pub mod gr;
pub mod hparams;
pub mod linear;
mod load;
pub mod moe;
pub mod ple;
pub mod mtp;
pub mod ple_io;
pub mod program;
pub mod qsa;

use std::path::Path;
use std::sync::Arc;

use gguf::GgufFile;

pub use gdn::{Gdn, GdnMode, GdnState};
pub use gr::HyperConn;
pub use hparams::{HParams, LayerKind, PleParams};
pub use linear::{Mat, MatError};
pub use moe::{Moe, SwiGlu};
pub use mtp::{Mtp, MtpState};
pub use ple::{Ple, PleState};
pub use ple_io::{PleCacheStats, PleIo, PleOptions, PleTable, RowCache};
pub use qsa::{CacheBuf, Indexer, Qsa, QsaCache, heap_select};

/// Everything that can go wrong loading or running a qwen4exp model.
#[derive(Debug, thiserror::Error)]
pub enum Qwen4ExpError {
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error("general.architecture is {0:?}, not \"qwen4exp\"")]
    WrongArchitecture(String),
    #[error("metadata key {key:?} not found")]
    MissingKey { key: String },
    #[error("metadata key {key:?}: {reason}")]
    BadKey { key: String, reason: String },
    #[error("tensor {0:?} not found")]
    MissingTensor(String),
    #[error("tensor {name:?} not found (expected ggml shape {expected:?})")]
    MissingShaped { name: String, expected: Vec<u64> },
    #[error("tensor {name:?}: shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("tensor {name:?}: {source}")]
    Tensor { name: String, source: MatError },
    #[error("tensor {name:?}: cannot dequantize: {reason}")]
    Dequant { name: String, reason: String },
    #[error("forward at position {got}, but the sequence state is at position {expected}")]
    Position { expected: usize, got: usize },
    #[error("token {token} at batch index {index} is outside the vocabulary of {n_vocab}")]
    Token {
        token: u32,
        index: usize,
        n_vocab: usize,
    },
    #[error(
        "this file holds only the MTP (nextn) draft head, not the model trunk: pass it with \
         --mtp and the trunk with -m"
    )]
    MtpOnly,
    #[error("MTP head {path:?}: {reason}")]
    MtpFile {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("MTP head {path:?}: {source}")]
    Mtp {
        path: std::path::PathBuf,
        source: Box<Qwen4ExpError>,
    },
    #[error("MTP head input: {got} hidden values for {tokens} tokens of width {width}")]
    MtpInput {
        got: usize,
        tokens: usize,
        width: usize,
    },
    #[error("metadata key {key:?} is {mtp} in the MTP file but {model} in the model")]
    MtpMismatch {
        key: String,
        mtp: String,
        model: String,
    },
    #[error("sequence state does not fit this model (layer {layer})")]
    StateMismatch { layer: usize },
    #[error(
        "PLE table `per_layer_token_embd.weight` not found in {searched:?}: pass the PLE shard \
         (--ple-gguf FILE), or --ple-skip to run without it (outputs then differ from the model)"
    )]
    PleTableMissing { searched: Vec<std::path::PathBuf> },
    #[error("PLE table {path:?}: {reason}")]
    PleIo {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("PLE layer {layer}: {reason}")]
    Ple { layer: usize, reason: String },
    #[error("qwen4exp on --device {backend}: operation `{op}` (layer {layer}) is not on this backend yet (it has no gfx11 kernel; run with --device cpu)")]
    NotOnBackend { backend: &'static str, op: &'static str, layer: usize },
}

/// Element type of the attention K/V and indexer-key caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    /// llama.cpp's default: values rounded to f16 (and q, softmax probabilities rounded too).
    #[default]
    F16,
    F32,
}

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
}

/// Tokens per internal micro-batch (bounds activation memory like llama.cpp's n_ubatch).
const UBATCH: usize = 512;

impl Qwen4Exp {
    /// Opens a GGUF (split siblings included) and resolves every tensor.
    pub fn open(path: &Path) -> Result<Qwen4Exp, Qwen4ExpError> {
        Self::open_with(path, &PleOptions::default())
    }

    /// [`Qwen4Exp::open`] with PLE table options (shard path, I/O mode, cache, skip).
    pub fn open_with(path: &Path, opt: &PleOptions) -> Result<Qwen4Exp, Qwen4ExpError> {
        Self::from_gguf_with(GgufFile::open(path)?, opt)
    }

    pub fn from_gguf(g: GgufFile) -> Result<Qwen4Exp, Qwen4ExpError> {
        Self::from_gguf_with(g, &PleOptions::default())
    }

    pub fn from_gguf_with(g: GgufFile, opt: &PleOptions) -> Result<Qwen4Exp, Qwen4ExpError> {
        load::load(Arc::new(g), opt)
    }

    /// Row-cache and read counters of the PLE table (`None` without a PLE block).
    pub fn ple_stats(&self) -> Option<PleCacheStats> {
        self.ple.as_ref().map(|p| p.table.stats())
    }

    pub fn n_vocab(&self) -> usize {
        self.hp.n_vocab
    }

    /// An empty sequence state.
    pub fn new_state(&self, kv: KvType) -> SeqState {
        let layers = self
            .layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Gdn(g) => LayerState::Gdn(g.new_state()),
                Mixer::Attn(_) => LayerState::Attn(QsaCache::new(kv == KvType::F16)),
            })
            .collect();
        SeqState {
            pos: 0,
            layers,
            ple: self.ple.as_ref().map(Ple::new_state),
        }
    }

    /// Runs `tokens` at positions `start_pos..` (which must equal `st.pos`) and returns the
    /// logits of every position, `[tokens.len()][n_vocab]`.
    pub fn forward(
        &self,
        st: &mut SeqState,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<Vec<f32>, Qwen4ExpError> {
        self.forward_traced(st, tokens, start_pos, None)
    }

    /// [`Qwen4Exp::forward`] that also records diagnostics.
    pub fn forward_traced(
        &self,
        st: &mut SeqState,
        tokens: &[u32],
        start_pos: usize,
        trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, Qwen4ExpError> {
        self.forward_full(st, tokens, start_pos, trace, None)
    }

    /// [`Qwen4Exp::forward`] that also returns every position's wide residual, the `hc`
    /// hyper-connection streams before the output mixer, `[tokens.len()][hc][n_embd]`: what
    /// the MTP head reads (the published heads' `nextn.hnorm` is `[hc·n_embd]`).
    pub fn forward_hidden(
        &self,
        st: &mut SeqState,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), Qwen4ExpError> {
        let mut hidden = vec![0f32; tokens.len() * self.hp.hc * self.hp.n_embd];
        let logits = self.forward_full(st, tokens, start_pos, None, Some(&mut hidden))?;
        Ok((logits, hidden))
    }

    fn forward_full(
        &self,
        st: &mut SeqState,
        tokens: &[u32],
        start_pos: usize,
        mut trace: Option<&mut Trace>,
        mut hidden: Option<&mut [f32]>,
    ) -> Result<Vec<f32>, Qwen4ExpError> {
        if st.layers.len() != self.layers.len() || st.ple.is_some() != self.ple.is_some() {
            return Err(Qwen4ExpError::StateMismatch {
                layer: st.layers.len().min(self.layers.len()),
            });
        }
        if start_pos != st.pos {
            return Err(Qwen4ExpError::Position {
                expected: st.pos,
                got: start_pos,
            });
        }
        if let Some((index, &token)) = tokens
            .iter()
            .enumerate()
            .find(|(_, t)| **t as usize >= self.hp.n_vocab)
        {
            return Err(Qwen4ExpError::Token {
                token,
                index,
                n_vocab: self.hp.n_vocab,
            });
        }
        let mut logits = vec![0f32; tokens.len() * self.hp.n_vocab];
        for (ci, chunk) in tokens.chunks(UBATCH).enumerate() {
            let out = &mut logits[ci * UBATCH * self.hp.n_vocab..][..chunk.len() * self.hp.n_vocab];
            let w = self.hp.hc * self.hp.n_embd;
            let h = hidden
                .as_deref_mut()
                .map(|h| &mut h[ci * UBATCH * w..][..chunk.len() * w]);
            self.ubatch(st, chunk, out, trace.as_deref_mut(), h)?;
        }
        Ok(logits)
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
    pub fn restore(&self, st: &mut SeqState, cp: Checkpoint) -> Result<(), Qwen4ExpError> {
        if cp.gdn.len() != st.layers.len() || cp.pos > st.pos {
            return Err(Qwen4ExpError::Position {
                expected: st.pos,
                got: cp.pos,
            });
        }
        let cur = st.pos;
        for (il, (ls, g)) in st.layers.iter_mut().zip(cp.gdn).enumerate() {
            match (ls, g, &self.layers[il].mixer) {
                (LayerState::Gdn(s), Some(g), _) => *s = g,
                (LayerState::Attn(c), None, Mixer::Attn(a)) => {
                    let block = a.indexer.as_ref().map(|ix| (ix.ratio, ix.dim));
                    c.truncate(cp.pos, cur, block);
                }
                _ => return Err(Qwen4ExpError::StateMismatch { layer: il }),
            }
        }
        st.ple = cp.ple;
        st.pos = cp.pos;
        Ok(())
    }

    /// Greedy decoding: feeds `prompt` (positions from `st.pos`), then `n_gen` argmax tokens
    /// one forward call each (lowest id on ties). Returns the generated ids.
    pub fn generate_greedy(
        &self,
        st: &mut SeqState,
        prompt: &[u32],
        n_gen: usize,
    ) -> Result<Vec<u32>, Qwen4ExpError> {
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

    /// One micro-batch at `st.pos`: the program of [`program::forward`] on the CPU.
    fn ubatch(
        &self,
        st: &mut SeqState,
        toks: &[u32],
        logits: &mut [f32],
        trace: Option<&mut Trace>,
        hidden: Option<&mut [f32]>,
    ) -> Result<(), Qwen4ExpError> {
        let mut chunk = crate::cpu::flash_next::CpuFlashChunk::new(self, st, toks, logits, trace, hidden);
        program::forward(&mut chunk, self)?;
        st.pos += toks.len();
        Ok(())
    }
}
