//! The one interface between the engine and its backends: a model placed on a backend
//! ([`LoadedModel`]) and a sequence on it ([`Session`]). Both traits are object safe, so the
//! engine holds a `Box<dyn LoadedModel>` and never matches on the model family or the backend.
//! `cpu-executor` implements them for both families on the CPU, `gpu-executor` on a gfx11
//! device; a build without GPU support places nothing on a device and says so.

use std::any::Any;
use std::path::Path;

use gguf::GgufFile;

use crate::error::Result;
use crate::qwen4exp::Qwen4Exp;
use crate::{Decoder, KvType, Logits, Mat};

/// How a backend computes its products (one mode per session).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    /// The default: llama.cpp's float order for the architectures whose numerics copy it
    /// (`Arch::ggml_exact`), the lane-order fast kernels otherwise.
    #[default]
    Llama,
    /// `--cpu-gemm tiles`: prompt products of the types with row tiles through them, everything
    /// else as [`Numerics::Llama`] (the CPU's choice; the device ignores it).
    Tiles,
    /// `--ordered`: the device's float order on the CPU (ordered attention, the reference
    /// quantizer and dot product, `quant::fmath` activations), so both backends agree bit for bit.
    Ordered,
}

impl Numerics {
    /// The mode of the `--ordered` and `--cpu-gemm tiles` flags (`ordered` wins).
    pub fn of(ordered: bool, tiles: bool) -> Numerics {
        match (ordered, tiles) {
            (true, _) => Numerics::Ordered,
            (false, true) => Numerics::Tiles,
            (false, false) => Numerics::Llama,
        }
    }
}

/// What a new session is sized and run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionConfig {
    pub kv: KvType,
    /// KV capacity in positions.
    pub max_ctx: usize,
    /// Tokens per forward chunk.
    pub prefill_chunk: usize,
    pub numerics: Numerics,
}

/// The model description a backend runs: one of the two families.
#[derive(Clone, Copy)]
pub enum Description<'a> {
    /// The shared decoder (gemma3, llama, qwen2, qwen3, qwen3moe).
    Decoder(&'a Decoder),
    /// Flash-Next (`qwen4exp`).
    Qwen4Exp(&'a Qwen4Exp),
}

/// A model description read from a file, before a backend takes it.
pub enum HostModel {
    Decoder(Box<Decoder>),
    Qwen4Exp(Box<Qwen4Exp>),
}

/// Which host matrices a question is about (they have their own residency flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostWeights {
    /// Every matrix but the routed experts (`--mmap`).
    Dense,
    /// The routed experts (`--mmap-experts`).
    Experts,
}

/// A sequence of some model on some backend: its caches, recurrent state and position.
pub trait Session: Any + Send {
    /// Positions already evaluated.
    fn n_past(&self) -> usize;
    /// Positions the session has room for.
    fn capacity(&self) -> usize;
    /// Forgets the sequence.
    fn reset(&mut self);
    /// Tokens per forward chunk when the session can record the residual stream after every
    /// layer (`STRATA_CHECK_FINITE=1`); None when it cannot.
    fn trace_chunk(&self) -> Option<usize> {
        None
    }
    /// Sets the per-layer trace (`[layer][tokens * n_embd]`), returning the previous one.
    fn set_trace(&mut self, trace: Option<Vec<Vec<f32>>>) -> Option<Vec<Vec<f32>>> {
        let _ = trace;
        None
    }
}

/// A model on a backend, ready to run sessions.
pub trait LoadedModel: Any + Send + Sync {
    /// The description it runs (every backend keeps the host's).
    fn description(&self) -> Description<'_>;
    /// Which backend runs the forward pass, for messages (`cpu`, `hip (gfx1100 ...)`, `emu`).
    fn backend(&self) -> String;
    /// Whether its sessions keep their KV cache in the host's memory (the memory plan's
    /// question: a card's allocator refuses by itself).
    fn kv_in_host_memory(&self) -> bool;

    /// A fresh sequence; fails only when its memory cannot be allocated.
    fn new_session(&self, cfg: &SessionConfig) -> Result<Box<dyn Session>>;
    /// Appends `tokens` to the sequence and writes logits to `out` (`[1][vocab]` for
    /// [`Logits::Last`], `[tokens.len()][vocab]` for [`Logits::All`]); unchecked for NaN.
    fn eval(&self, s: &mut dyn Session, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()>;
    /// All logits of `tokens` and a hidden state of every position (`[tokens.len()][d]`;
    /// Flash-Next: the wide residual its MTP head reads). Default: no hidden states.
    fn eval_hidden(&self, s: &mut dyn Session, tokens: &[u32]) -> Result<(Vec<f32>, Vec<f32>)> {
        let mut out = Vec::new();
        self.eval(s, tokens, Logits::All, &mut out)?;
        Ok((out, Vec::new()))
    }
    /// What [`LoadedModel::rollback`] needs to take `s` back to its current position.
    /// Default: the position (a KV-only sequence).
    fn checkpoint(&self, s: &dyn Session) -> Box<dyn Any> {
        Box::new(s.n_past())
    }
    /// `s` has consumed `keep` and then rejected tokens since `cp`; afterwards it equals the
    /// state after consuming `keep` only. Returns how many tokens were recomputed (0 when a
    /// KV-only sequence truncates: the cells after it are overwritten later).
    fn rollback(&self, s: &mut dyn Session, cp: Box<dyn Any>, keep: &[u32]) -> Result<usize>;
    /// Whether a sequence's whole state is its KV cache (the shared decoder), so that it can be
    /// truncated; false for Flash-Next, whose GDN and PLE states hold every token.
    fn kv_only(&self) -> bool {
        matches!(self.description(), Description::Decoder(_))
    }
    /// Takes `s` back to its first `n_past` tokens when its state is its KV cache alone (the
    /// shared decoder: later cells are overwritten later; Gemma's sliding window is a mask
    /// over the whole cache). Returns false, `s` untouched, for a recurrent model (Flash-Next's
    /// GDN and PLE states hold every token: only a checkpoint takes it back) or an `n_past`
    /// past the sequence.
    fn truncate(&self, s: &mut dyn Session, n_past: usize) -> Result<bool> {
        if !self.kv_only() || n_past > s.n_past() {
            return Ok(false);
        }
        self.rollback(s, Box::new(n_past), &[])?;
        Ok(true)
    }

    /// The device expert cache's counters since load (None without one).
    fn expert_cache_stats(&self) -> Option<experts::counters::CacheStats> {
        None
    }
    /// Writes the expert cache's routing counts; Ok(false) without an expert cache.
    fn save_expert_profile(&self, path: &Path) -> Result<bool> {
        let _ = path;
        Ok(false)
    }
    /// The host matrices this backend computes with (what RAM residency may copy): all of
    /// them on the CPU; on a device only the routed experts an expert cache reads on misses.
    fn host_matrices(&mut self, which: HostWeights) -> Vec<&mut Mat>;

    fn n_vocab(&self) -> usize {
        self.description().n_vocab()
    }
    /// The GGUF the model was loaded from (first shard).
    fn gguf(&self) -> &GgufFile {
        self.description().gguf()
    }
    fn n_ctx_train(&self) -> usize {
        self.description().n_ctx_train()
    }
    fn kv_bytes_per_position(&self, kv: KvType) -> Option<u64> {
        self.description().kv_bytes_per_position(kv)
    }
}

impl<'a> Description<'a> {
    pub fn n_vocab(self) -> usize {
        match self {
            Description::Decoder(m) => m.n_vocab,
            Description::Qwen4Exp(m) => m.n_vocab(),
        }
    }
    /// The GGUF the model was read from (first shard).
    pub fn gguf(self) -> &'a GgufFile {
        match self {
            Description::Decoder(m) => &m.gguf,
            Description::Qwen4Exp(m) => &m.file,
        }
    }
    /// Training context length (0 if the file does not say).
    pub fn n_ctx_train(self) -> usize {
        match self {
            Description::Decoder(m) => m.hp.n_ctx_train,
            Description::Qwen4Exp(m) => m.hp.n_ctx_train,
        }
    }
    /// KV bytes one position takes (None on overflow).
    pub fn kv_bytes_per_position(self, kv: KvType) -> Option<u64> {
        match self {
            Description::Decoder(m) => m.kv_bytes_per_position(kv),
            Description::Qwen4Exp(m) => m.kv_bytes_per_position(kv),
        }
    }
}

impl HostModel {
    pub fn description(&self) -> Description<'_> {
        match self {
            HostModel::Decoder(m) => Description::Decoder(m),
            HostModel::Qwen4Exp(m) => Description::Qwen4Exp(m),
        }
    }
}

/// The position a KV-only checkpoint ([`LoadedModel::checkpoint`]'s default) holds.
pub fn checkpoint_position(cp: Box<dyn Any>) -> Result<usize> {
    cp.downcast::<usize>().map(|p| *p).map_err(|_| crate::error::EngineError::SessionMismatch)
}

/// The session type a backend's model expects, or [`crate::error::EngineError::SessionMismatch`].
pub fn downcast_session<S: Session>(s: &mut dyn Session) -> Result<&mut S> {
    s.downcast_mut::<S>().ok_or(crate::error::EngineError::SessionMismatch)
}

impl dyn Session {
    /// The backend's own session type, when this is one.
    pub fn downcast_ref<S: Session>(&self) -> Option<&S> {
        (self as &dyn Any).downcast_ref()
    }

    pub fn downcast_mut<S: Session>(&mut self) -> Option<&mut S> {
        (self as &mut dyn Any).downcast_mut()
    }
}

impl dyn LoadedModel {
    /// The backend's own model type, when this is one (the MTP head on a device, the CPU
    /// decoder's profile).
    pub fn downcast_ref<M: LoadedModel>(&self) -> Option<&M> {
        (self as &dyn Any).downcast_ref()
    }
}

impl Decoder {
    /// The shared decoder's host matrices. Dense: every layer's projections (and MoE router),
    /// the output head, and the token embedding when it is the head's own bytes (tied); an
    /// untied embedding is only read a row a token and stays mapped. Experts: its MoE stacks.
    pub fn host_matrices(&mut self, which: HostWeights) -> Vec<&mut Mat> {
        let w = &mut self.w;
        if which == HostWeights::Experts {
            return w
                .layers
                .iter_mut()
                .flat_map(|l| match &mut l.ffn.ffn {
                    crate::Ffn::Moe { gate, up, down, .. } => vec![gate, up, down],
                    crate::Ffn::Dense { .. } => Vec::new(),
                })
                .collect();
        }
        let tied = w.tok_embd.data().as_ptr() == w.output.data().as_ptr();
        let mut out: Vec<&mut Mat> = vec![&mut w.output];
        if tied {
            out.push(&mut w.tok_embd);
        }
        for l in w.layers.iter_mut() {
            let a = &mut l.attn;
            out.extend([&mut a.wq, &mut a.wk, &mut a.wv, &mut a.wo]);
            match &mut l.ffn.ffn {
                crate::Ffn::Dense { gate, up, down } => out.extend([gate, up, down]),
                crate::Ffn::Moe { router, .. } => out.push(router),
            }
        }
        out
    }
}

impl Qwen4Exp {
    /// Flash-Next's host matrices. Dense: the GR mixers, GDN and attention projections (with
    /// the indexer's), routers, shared experts, the PLE block's projections, the head, and the
    /// token embedding when it is the head's bytes (the PLE table is read by rows from its own
    /// file, `ple_io`). Experts: the routed experts (not the shared ones).
    pub fn host_matrices(&mut self, which: HostWeights) -> Vec<&mut Mat> {
        use crate::qwen4exp::{HyperConn, Mixer};
        fn gr(h: &mut HyperConn) -> impl Iterator<Item = &mut Mat> {
            [&mut h.down, &mut h.up].into_iter().chain(h.inject.as_mut())
        }
        if which == HostWeights::Experts {
            return self
                .layers
                .iter_mut()
                .flat_map(|l| l.moe.experts.iter_mut().flat_map(|e| [&mut e.gate, &mut e.up, &mut e.down]))
                .collect();
        }
        let tied = self.tok_embd.data().as_ptr() == self.output.data().as_ptr();
        let mut out: Vec<&mut Mat> = vec![&mut self.output];
        if tied {
            out.push(&mut self.tok_embd);
        }
        out.extend(gr(&mut self.out_hc));
        if let Some(p) = self.ple.as_mut() {
            out.extend([&mut p.key, &mut p.value]);
        }
        for l in self.layers.iter_mut() {
            out.extend(gr(&mut l.hc_attn));
            out.extend(gr(&mut l.hc_ffn));
            match &mut l.mixer {
                Mixer::Gdn(g) => out.extend([&mut g.qkv, &mut g.gate, &mut g.beta, &mut g.alpha, &mut g.out]),
                Mixer::Attn(a) => {
                    out.extend([&mut a.q, &mut a.k, &mut a.v, &mut a.o]);
                    if let Some(ix) = a.indexer.as_mut() {
                        out.extend([&mut ix.q, &mut ix.k]);
                    }
                }
            }
            let moe = &mut l.moe;
            out.extend([
                &mut moe.router,
                &mut moe.shared_gate,
                &mut moe.shared.gate,
                &mut moe.shared.up,
                &mut moe.shared.down,
            ]);
        }
        out
    }
}
