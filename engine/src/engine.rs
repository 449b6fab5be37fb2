//! The engine facade the commands and the server use: a model, its tokenizer, and helpers to
//! run sequences (prefill + sampled decode) on an [`AnySession`].
//!
//! Two model families sit behind one API: the shared decoder ([`Model`]: gemma3, llama, qwen2,
//! qwen3, qwen3moe) and Flash-Next ([`Qwen4Exp`], its own forward pass and recurrent state).
//! [`AnyModel`] / [`AnySession`] dispatch between them by `general.architecture`, so every
//! command runs on either without knowing which.

use std::path::Path;

use tokenizer::Tokenizer;

use crate::sampler::Sampler;
use cpu_executor::Session;
use cpu_executor::kv_cache::KvType;
use cpu_executor::prelude::*;
pub use gpu_executor::Device;
use model::Logits;
use model::Model;
use model::error::{EngineError, Result};
use model::qwen4exp::{self as q4, PleOptions, Qwen4Exp};

/// How sessions are built (from the validated CLI config).
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Backend of the shared-decoder models (Flash-Next runs on the CPU).
    pub device: Device,
    /// Ordered-numerics mode on both backends (`--ordered`, alias `--ordered-attention`): the
    /// CPU session runs `Session::ordered` (ordered attention, the `quant` crate's scalar
    /// matmul, fmath activations) and the GPU `GpuOptions::ordered`, so `--device cpu` and
    /// `--device emu|hip` compute whole layers and logits bit for bit alike.
    pub ordered_attention: bool,
    /// `--cpu-gemm tiles`: the CPU executor's prompt products through exact-block row tiles
    /// (`Products::Tiles`; GPU backends ignore it).
    pub cpu_tiles: bool,
    pub kv: KvType,
    /// KV capacity in positions (0: the model's training context).
    pub max_context: usize,
    /// Tokens per prefill chunk.
    pub prefill: usize,
    /// PLE table options (Flash-Next models only).
    pub ple: PleOptions,
    /// hipBLASLt calibration table for the GPU backends (`--calibration`); None: the default
    /// location for the device (`gpu::calibrate::default_path`) when such a file exists.
    pub calibration: Option<std::path::PathBuf>,
    /// STRP profile that fills the GPU expert cache at start (`--expert-profile`).
    pub expert_profile: Option<std::path::PathBuf>,
    /// Where `generate` writes this run's routing counts (`--expert-profile-save`).
    pub expert_profile_save: Option<std::path::PathBuf>,
    /// GPU backend settings (`--gpu-*` flags / `STRATA_GPU_*`); `ordered` is set from
    /// `ordered_attention` at load.
    pub gpu: gpu_executor::options::GpuOptions,
    /// `--mmap`: leave every weight memory-mapped (as llama.cpp does by default) instead of
    /// reading the ones the CPU computes with into RAM at load ([`crate::residency`]).
    pub mmap: bool,
    /// `--mmap-experts`: the same for the routed experts only.
    pub mmap_experts: bool,
}

impl RunOptions {
    /// The CPU executor's kernels for these options.
    pub fn products(&self) -> cpu_executor::Products {
        cpu_executor::Products::of(self.ordered_attention, self.cpu_tiles)
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            device: Device::Cpu,
            ordered_attention: false,
            cpu_tiles: false,
            kv: KvType::F16,
            max_context: 4096,
            prefill: 512,
            ple: PleOptions::default(),
            calibration: None,
            expert_profile: None,
            expert_profile_save: None,
            gpu: Default::default(),
            mmap: false,
            mmap_experts: false,
        }
    }
}

/// Either model family (chosen by `general.architecture`).
pub enum AnyModel {
    /// The shared decoder (gemma3, llama, qwen2, qwen3, qwen3moe).
    Std(Box<Model>),
    /// Flash-Next (`qwen4exp`).
    Flash(Box<Qwen4Exp>),
    /// The shared decoder resident on a gfx11 device (hip or the software device).
    #[cfg(feature = "gpu")]
    Gpu(Box<gpu_executor::model::GpuModel>),
    /// Flash-Next resident on a gfx11 device.
    #[cfg(feature = "gpu")]
    FlashGpu(Box<gpu_executor::flash_next::GpuFlashNext>),
}

/// A sequence of either model family.
pub enum AnySession {
    Std(Box<Session>),
    Flash(Box<FlashSession>),
    #[cfg(feature = "gpu")]
    Gpu(Box<gpu_executor::model::GpuSession>),
    #[cfg(feature = "gpu")]
    FlashGpu(Box<gpu_executor::flash_next::GpuFlashSession>),
}

/// A Flash-Next sequence: its state plus the capacity limit the commands enforce.
pub struct FlashSession {
    pub st: q4::SeqState,
    pub capacity: usize,
    /// The empty state, for [`AnySession::reset`].
    fresh: q4::SeqState,
}

/// `STRATA_CHECK_FINITE=1`: scan the residual stream after every layer (read once).
fn check_layers() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("STRATA_CHECK_FINITE").is_ok_and(|v| v == "1"))
}

/// The first row of `logits` (rows of `n_vocab`; the last token's row for `Logits::Last`)
/// holding a NaN or an infinity is an error naming its position and token.
fn check_logits(logits: &[f32], n_vocab: usize, pos0: usize, tokens: &[u32], want: Logits) -> Result<()> {
    if n_vocab == 0 || logits.iter().all(|x| x.is_finite()) {
        return Ok(());
    }
    let first_row = if want == Logits::All { 0 } else { tokens.len().saturating_sub(1) };
    for (r, row) in logits.chunks(n_vocab).enumerate() {
        let count = row.iter().filter(|x| !x.is_finite()).count();
        if count > 0 {
            let i = (first_row + r).min(tokens.len().saturating_sub(1));
            return Err(EngineError::NonFinite {
                position: pos0 + i,
                token: tokens.get(i).copied().unwrap_or(0),
                layer: None,
                count,
                of: row.len(),
            });
        }
    }
    Ok(())
}

/// In a per-layer trace (`[layer][tokens * n_embd]`), the first layer holding a non-finite
/// value: (layer, token row, non-finite values in that row, row width).
fn first_non_finite_layer(trace: &[Vec<f32>], n_tokens: usize) -> Option<(usize, usize, usize, usize)> {
    trace.iter().enumerate().find_map(|(layer, x)| {
        let d = x.len() / n_tokens.max(1);
        if d == 0 {
            return None;
        }
        x.chunks(d).enumerate().find_map(|(row, v)| {
            let count = v.iter().filter(|x| !x.is_finite()).count();
            (count > 0).then_some((layer, row, count, d))
        })
    })
}

impl AnySession {
    /// Tokens per forward chunk of a session with a per-layer trace (None: Flash-Next).
    fn trace_chunk(&self) -> Option<usize> {
        match self {
            AnySession::Std(s) => Some(s.prefill_chunk.max(1)),
            AnySession::Flash(_) => None,
            #[cfg(feature = "gpu")]
            AnySession::Gpu(g) => Some(g.chunk.max(1)),
            #[cfg(feature = "gpu")]
            AnySession::FlashGpu(_) => None,
        }
    }

    /// Sets the per-layer trace, returning the previous one.
    fn set_trace(&mut self, t: Option<Vec<Vec<f32>>>) -> Option<Vec<Vec<f32>>> {
        match self {
            AnySession::Std(s) => std::mem::replace(&mut s.trace, t),
            AnySession::Flash(_) => None,
            #[cfg(feature = "gpu")]
            AnySession::Gpu(g) => std::mem::replace(&mut g.trace, t),
            #[cfg(feature = "gpu")]
            AnySession::FlashGpu(_) => None,
        }
    }

    /// Positions already evaluated.
    pub fn n_past(&self) -> usize {
        match self {
            AnySession::Std(s) => s.n_past,
            AnySession::Flash(f) => f.st.pos,
            #[cfg(feature = "gpu")]
            AnySession::Gpu(g) => g.n_past,
            #[cfg(feature = "gpu")]
            AnySession::FlashGpu(g) => g.n_past,
        }
    }
    pub fn capacity(&self) -> usize {
        match self {
            AnySession::Std(s) => s.capacity(),
            AnySession::Flash(f) => f.capacity,
            #[cfg(feature = "gpu")]
            AnySession::Gpu(g) => g.capacity,
            #[cfg(feature = "gpu")]
            AnySession::FlashGpu(g) => g.capacity,
        }
    }
    /// Forgets the sequence.
    pub fn reset(&mut self) {
        match self {
            AnySession::Std(s) => s.reset(),
            AnySession::Flash(f) => f.st = f.fresh.clone(),
            // The cache rows are overwritten by the next evaluation.
            #[cfg(feature = "gpu")]
            AnySession::Gpu(g) => g.n_past = 0,
            // The recurrent and PLE state must start over too: a Flash-Next device session
            // resets by value.
            #[cfg(feature = "gpu")]
            AnySession::FlashGpu(g) => g.reset(),
        }
    }
}

impl AnyModel {
    pub fn n_vocab(&self) -> usize {
        match self {
            AnyModel::Std(m) => m.n_vocab,
            AnyModel::Flash(m) => m.n_vocab(),
            #[cfg(feature = "gpu")]
            AnyModel::Gpu(m) => m.n_vocab(),
            #[cfg(feature = "gpu")]
            AnyModel::FlashGpu(m) => m.n_vocab(),
        }
    }

    /// The GGUF the model was loaded from (first shard).
    pub fn gguf(&self) -> &gguf::GgufFile {
        match self {
            AnyModel::Std(m) => &m.gguf,
            AnyModel::Flash(m) => &m.file,
            #[cfg(feature = "gpu")]
            AnyModel::Gpu(m) => &m.model.gguf,
            #[cfg(feature = "gpu")]
            AnyModel::FlashGpu(m) => &m.m.file,
        }
    }

    /// Training context length (0 if the file does not say).
    pub fn n_ctx_train(&self) -> usize {
        match self {
            AnyModel::Std(m) => m.hp.n_ctx_train,
            AnyModel::Flash(m) => m.hp.n_ctx_train,
            #[cfg(feature = "gpu")]
            AnyModel::Gpu(m) => m.model.hp.n_ctx_train,
            #[cfg(feature = "gpu")]
            AnyModel::FlashGpu(m) => m.m.hp.n_ctx_train,
        }
    }

    /// What a session of the configured context needs (the memory plan, checked at load).
    pub fn session_plan(&self, opts: &RunOptions) -> crate::memory::SessionPlan {
        let positions = context_positions(opts.max_context, self.n_ctx_train());
        let kv_per_position = match self {
            AnyModel::Std(m) => m.kv_bytes_per_position(opts.kv),
            AnyModel::Flash(m) => m.kv_bytes_per_position(opts.kv),
            #[cfg(feature = "gpu")]
            AnyModel::Gpu(m) => m.model.kv_bytes_per_position(opts.kv),
            #[cfg(feature = "gpu")]
            AnyModel::FlashGpu(m) => m.m.kv_bytes_per_position(opts.kv),
        };
        crate::memory::SessionPlan { positions, from_training: opts.max_context == 0, kv: opts.kv, kv_per_position }
    }

    /// Whether sessions keep their KV cache in the host's memory: on the CPU, and on the
    /// software device, whose memory is the host's (a card's allocator refuses by itself).
    pub fn kv_in_host_memory(&self, opts: &RunOptions) -> bool {
        matches!(self, AnyModel::Std(_) | AnyModel::Flash(_)) || opts.device == Device::Emu
    }

    /// A fresh sequence with room for `max_ctx` positions. Flash-Next caches are f16 (the
    /// engine checks `--kv` at load).
    /// Fails only when device memory cannot be allocated.
    pub fn new_session(&self, kv: KvType, max_ctx: usize, prefill_chunk: usize) -> Result<AnySession> {
        self.new_session_with(kv, max_ctx, prefill_chunk, cpu_executor::Products::Llama)
    }

    /// [`AnyModel::new_session`] with the CPU backend's kernels chosen (`Session::ordered`,
    /// `Session::tiles`; a GPU model's mode is fixed at load, `GpuOptions::ordered`).
    pub fn new_session_with(
        &self,
        kv: KvType,
        max_ctx: usize,
        prefill_chunk: usize,
        products: cpu_executor::Products,
    ) -> Result<AnySession> {
        Ok(match self {
            AnyModel::Std(m) => {
                let mut s = m.try_new_session(kv, max_ctx, prefill_chunk)?;
                let ordered = products == cpu_executor::Products::Ordered;
                s.ordered_attention = ordered;
                s.ordered = ordered;
                s.tiles = products == cpu_executor::Products::Tiles;
                AnySession::Std(Box::new(s))
            }
            AnyModel::Flash(m) => {
                let st = m.new_state(kv);
                AnySession::Flash(Box::new(FlashSession { fresh: st.clone(), st, capacity: max_ctx }))
            }
            #[cfg(feature = "gpu")]
            AnyModel::Gpu(m) => AnySession::Gpu(Box::new(m.new_session(kv, max_ctx, prefill_chunk)?)),
            #[cfg(feature = "gpu")]
            AnyModel::FlashGpu(m) => {
                AnySession::FlashGpu(Box::new(m.new_session_chunked(kv, max_ctx, prefill_chunk)?))
            }
        })
    }

    /// The GPU expert cache's counters since load (`--expert-cache` with fewer slots than
    /// experts; None otherwise).
    pub fn expert_cache_stats(&self) -> Option<experts::counters::CacheStats> {
        match self {
            #[cfg(feature = "gpu")]
            AnyModel::Gpu(m) => m.expert_cache_stats(),
            #[cfg(feature = "gpu")]
            AnyModel::FlashGpu(m) => m.expert_cache_stats(),
            _ => None,
        }
    }

    /// Writes the GPU expert cache's routing counts (`--expert-profile-save`); Ok(false) when
    /// the model has no expert cache.
    pub fn save_expert_profile(&self, path: &Path) -> Result<bool> {
        match self {
            #[cfg(feature = "gpu")]
            AnyModel::Gpu(m) if m.expert_cache_stats().is_some() => m.save_expert_profile(path).map(|()| true),
            #[cfg(feature = "gpu")]
            AnyModel::FlashGpu(m) if m.expert_cache_stats().is_some() => m.save_expert_profile(path).map(|()| true),
            _ => {
                let _ = path;
                Ok(false)
            }
        }
    }

    /// Reads the routed experts this model computes on the CPU into RAM if they fit in
    /// `budget` bytes ([`crate::residency`]): every expert of a CPU model, the host copies an
    /// expert cache's misses read on a GPU; None when there are none (a dense model, or every
    /// expert resident in VRAM).
    pub fn read_experts_into_ram(&mut self, budget: Option<u64>) -> Option<crate::residency::Placement> {
        use crate::residency::{Weights::Experts, decoder_experts, flash_next_experts, read_into_ram};
        match self {
            AnyModel::Std(m) if m.hp.moe.is_some() => Some(read_into_ram(Experts, decoder_experts(m), budget)),
            AnyModel::Flash(q) => Some(read_into_ram(Experts, flash_next_experts(q), budget)),
            #[cfg(feature = "gpu")]
            AnyModel::Gpu(g) if g.expert_cache_stats().is_some() => {
                Some(read_into_ram(Experts, decoder_experts(&mut g.model), budget))
            }
            #[cfg(feature = "gpu")]
            AnyModel::FlashGpu(g) if g.expert_cache_stats().is_some() => {
                Some(read_into_ram(Experts, flash_next_experts(&mut g.m), budget))
            }
            _ => None,
        }
    }

    /// Reads the other matrices a CPU model computes with (projections, routers, shared
    /// experts, the head) into RAM if they fit in `budget` bytes ([`crate::residency`]); None
    /// on a GPU (its copy is in VRAM).
    pub fn read_dense_into_ram(&mut self, budget: Option<u64>) -> Option<crate::residency::Placement> {
        use crate::residency::{Weights::Dense, decoder_dense, flash_next_dense, read_into_ram};
        match self {
            AnyModel::Std(m) => Some(read_into_ram(Dense, decoder_dense(m), budget)),
            AnyModel::Flash(q) => Some(read_into_ram(Dense, flash_next_dense(q), budget)),
            #[cfg(feature = "gpu")]
            AnyModel::Gpu(_) | AnyModel::FlashGpu(_) => None,
        }
    }

    /// At load: the dense weights, then the routed experts, into RAM as far as the available
    /// memory goes, unless `--mmap` / `--mmap-experts` keep them mapped; prints why any stay
    /// mapped.
    fn place_host_weights(&mut self, opts: &RunOptions) {
        use crate::residency::Weights;
        if opts.mmap {
            return;
        }
        let mut budget = crate::residency::ram_budget();
        if let Some(p) = self.read_dense_into_ram(budget) {
            budget = budget.map(|b| b.saturating_sub(p.in_ram()));
            if let Some(msg) = p.message(Weights::Dense) {
                eprintln!("{msg}");
            }
        }
        if !opts.mmap_experts
            && let Some(msg) = self.read_experts_into_ram(budget).and_then(|p| p.message(Weights::Experts))
        {
            eprintln!("{msg}");
        }
    }

    /// The GPU options the model runs with on its device (what the engine made of the
    /// configured ones: Flash-Next's expert cache defaults to `auto`, `--ordered` fixes the
    /// attention mode); None on the CPU, where they do not apply.
    pub fn gpu_options(&self) -> Option<gpu_executor::GpuOptions> {
        match self {
            #[cfg(feature = "gpu")]
            AnyModel::Gpu(m) => Some(*m.opts()),
            #[cfg(feature = "gpu")]
            AnyModel::FlashGpu(m) => Some(*m.opts()),
            _ => None,
        }
    }

    /// Which backend runs the forward pass, for messages (`cpu`, `hip (gfx1100 ...)`, `emu`).
    pub fn backend(&self) -> String {
        match self {
            AnyModel::Std(_) | AnyModel::Flash(_) => "cpu".into(),
            #[cfg(feature = "gpu")]
            AnyModel::Gpu(m) => {
                let i = m.api().info();
                format!("{:?} ({}, {})", i.backend, i.name, i.arch).to_lowercase()
            }
            #[cfg(feature = "gpu")]
            AnyModel::FlashGpu(m) => {
                let i = m.api().info();
                format!("{:?} ({}, {})", i.backend, i.name, i.arch).to_lowercase()
            }
        }
    }

    /// Appends `tokens` to the sequence and writes logits to `out` (see [`Model::eval`]).
    ///
    /// Logits that are not all finite are an error ([`EngineError::NonFinite`], naming the
    /// position): NaN weights or metadata otherwise make greedy sampling pick token 0 forever.
    /// With `STRATA_CHECK_FINITE=1`, the shared decoder runs chunk by chunk with the session's
    /// per-layer trace on, and the error names the first layer whose output held a NaN or
    /// infinity (slower: the residual stream is copied after every layer).
    pub fn eval(&self, s: &mut AnySession, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()> {
        let pos0 = s.n_past();
        if check_layers()
            && let Some(chunk) = s.trace_chunk()
        {
            return self.eval_checked(s, chunk, tokens, want, out);
        }
        self.eval_backend(s, tokens, want, out)?;
        check_logits(out, self.n_vocab(), pos0, tokens, want)
    }

    /// [`AnyModel::eval`] with the per-layer scan (`STRATA_CHECK_FINITE=1`).
    fn eval_checked(
        &self,
        s: &mut AnySession,
        chunk: usize,
        tokens: &[u32],
        want: Logits,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        out.clear();
        let mut piece_out = Vec::new();
        let n_pieces = tokens.len().div_ceil(chunk);
        for (i, piece) in tokens.chunks(chunk).enumerate() {
            let pos = s.n_past();
            s.set_trace(Some(Vec::new()));
            let r = self.eval_backend(
                s,
                piece,
                if want == Logits::All { Logits::All } else { Logits::Last },
                &mut piece_out,
            );
            let trace = s.set_trace(None).unwrap_or_default();
            r?;
            if let Some((layer, row, count, of)) = first_non_finite_layer(&trace, piece.len()) {
                return Err(EngineError::NonFinite {
                    position: pos + row,
                    token: piece[row],
                    layer: Some(layer),
                    count,
                    of,
                });
            }
            check_logits(&piece_out, self.n_vocab(), pos, piece, want)?;
            if want == Logits::All || i + 1 == n_pieces {
                out.extend_from_slice(&piece_out);
            }
        }
        Ok(())
    }

    /// The backend's forward pass, unchecked.
    fn eval_backend(&self, s: &mut AnySession, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()> {
        match (self, s) {
            (AnyModel::Std(m), AnySession::Std(s)) => m.eval(s, tokens, want, out),
            (AnyModel::Flash(m), AnySession::Flash(f)) => {
                if tokens.is_empty() {
                    return Err(EngineError::EmptyInput);
                }
                let needed = f.st.pos + tokens.len();
                if needed > f.capacity {
                    return Err(EngineError::ContextFull { needed, capacity: f.capacity });
                }
                let pos = f.st.pos;
                let mut l = m.forward(&mut f.st, tokens, pos)?;
                if want == Logits::Last {
                    let nv = m.n_vocab();
                    l.drain(..l.len() - nv);
                }
                *out = l;
                Ok(())
            }
            #[cfg(feature = "gpu")]
            (AnyModel::Gpu(m), AnySession::Gpu(s)) => m.eval(s, tokens, want, out),
            #[cfg(feature = "gpu")]
            (AnyModel::FlashGpu(m), AnySession::FlashGpu(s)) => m.eval(s, tokens, want, out),
            _ => Err(EngineError::SessionMismatch),
        }
    }
}

pub struct Engine {
    pub model: AnyModel,
    pub tokenizer: Tokenizer,
    pub opts: RunOptions,
    /// The file given to [`Engine::load`].
    pub path: std::path::PathBuf,
}

/// Returns the heap's free pages to the OS (glibc keeps them otherwise, and they count in the
/// process's resident size).
fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Puts a shared-decoder model on the chosen device.
fn place(model: Model, opts: &RunOptions) -> Result<AnyModel> {
    let (device, calibration, ordered, gpu) =
        (opts.device, opts.calibration.as_deref(), opts.ordered_attention, opts.gpu);
    let (kv, max_context, prefill) = (opts.kv, opts.max_context, opts.prefill);
    let expert_profile = opts.expert_profile.as_deref();
    #[cfg(feature = "gpu")]
    {
        use gpu_executor::device::{Device, GpuError, open_device_with};
        let kind = match device {
            Device::Cpu => return Ok(AnyModel::Std(Box::new(model))),
            Device::Auto => Device::Auto,
            Device::Hip => Device::Hip,
            Device::Emu => Device::Emu,
        };
        let api = match open_device_with(kind, &gpu) {
            Ok(api) => api,
            Err(GpuError::NoUsableGpu(why)) => {
                // No ROCm at all is the normal CPU-only machine: stay quiet then.
                if !matches!(*why, GpuError::LibraryNotFound { .. }) {
                    eprintln!("strata: no usable GPU ({why}); running on the CPU");
                }
                return Ok(AnyModel::Std(Box::new(model)));
            }
            Err(e) => return Err(EngineError::Gpu(format!("--device {}: {e}", device.name()))),
        };
        let mut opts = gpu;
        opts.ordered |= ordered;
        let mut m = gpu_executor::model::GpuModel::new(model, std::sync::Arc::from(api), opts)?;
        if opts.expert_cache == Some(gpu_executor::options::ExpertCacheSize::Auto) {
            let ctx = context_positions(max_context, m.model.hp.n_ctx_train);
            if let Some(fit) = m.fit_expert_cache(kv, ctx, prefill)? {
                eprintln!("strata: {fit}");
            }
        }
        attach_calibration(&mut m, calibration)?;
        if let Some(p) = expert_profile {
            let n = m.fill_expert_cache(p)?;
            eprintln!("strata: expert cache: {n} experts copied from {}", p.display());
        }
        Ok(AnyModel::Gpu(Box::new(m)))
    }
    #[cfg(not(feature = "gpu"))]
    let _ = (calibration, ordered, gpu, expert_profile, kv, max_context, prefill);
    #[cfg(not(feature = "gpu"))]
    match device {
        Device::Cpu | Device::Auto => Ok(AnyModel::Std(Box::new(model))),
        Device::Hip | Device::Emu => Err(EngineError::Unsupported(format!(
            "--device {} needs a build with GPU support (cargo build --features gpu)",
            device.name()
        ))),
    }
}

/// The KV capacity of a session: `--max-context`, or the model's training context for 0.
fn context_positions(max_context: usize, n_ctx_train: usize) -> usize {
    if max_context == 0 { n_ctx_train.max(1) } else { max_context }
}

/// Sizes a Flash-Next device model's expert cache (`auto`, the default for this architecture;
/// said only when not every expert fits or `auto` was asked for) and fills it from
/// `--expert-profile`, when one is given.
#[cfg(feature = "gpu")]
fn prepare_flash_expert_cache(g: &mut gpu_executor::flash_next::GpuFlashNext, opts: &RunOptions) -> Result<()> {
    if g.opts().expert_cache == Some(gpu_executor::options::ExpertCacheSize::Auto) {
        let ctx = context_positions(opts.max_context, g.m.hp.n_ctx_train);
        let fit = g.fit_expert_cache_chunked(opts.kv, ctx, opts.prefill)?;
        if !fit.all_resident() || opts.gpu.expert_cache.is_some() {
            eprintln!("strata: {fit}");
        }
    }
    if let Some(p) = opts.expert_profile.as_deref() {
        let n = g.fill_expert_cache(p)?;
        eprintln!("strata: expert cache: {n} experts copied from {}", p.display());
    }
    Ok(())
}

/// Loads the hipBLASLt calibration table (gpu/calibrate.rs): the one given (`--calibration`,
/// an error when it cannot be used), else the device's default file when present (a warning
/// when it cannot be used). Without hipBLASLt on the device, a given table is an error.
#[cfg(feature = "gpu")]
fn attach_calibration(m: &mut gpu_executor::model::GpuModel, given: Option<&Path>) -> Result<()> {
    use gpu_executor::calibrate::{CalibrationTable, default_path};
    let info = m.api().info().clone();
    let Some(ver) = info.blas_lt_version.as_deref() else {
        if let Some(p) = given {
            return Err(EngineError::Gpu(format!(
                "--calibration {}: this device has no usable hipBLASLt ({})",
                p.display(),
                info.blas_lt.as_deref().unwrap_or("not found")
            )));
        }
        return Ok(());
    };
    let (path, explicit) = match given {
        Some(p) => (p.to_path_buf(), true),
        None => match default_path(&info.arch, ver) {
            Some(p) if p.is_file() => (p, false),
            _ => return Ok(()),
        },
    };
    match CalibrationTable::load(&path, &info.arch, ver) {
        Ok(t) => m.set_calibration(t, path),
        Err(e) if explicit => Err(EngineError::Gpu(e.to_string())),
        Err(e) => {
            eprintln!("strata: ignoring the default calibration table: {e}");
            Ok(())
        }
    }
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// An end-of-generation token was sampled (not included in the output).
    Eog,
    /// The requested number of tokens was produced.
    Length,
    /// The callback asked to stop.
    Callback,
}

impl Engine {
    pub fn load(path: &Path, opts: RunOptions) -> Result<Engine> {
        let mut gguf =
            gguf::GgufFile::open(path).map_err(|source| EngineError::Gguf { path: path.to_path_buf(), source })?;
        // Built before the model so that the metadata's copy of the vocabulary can go back to
        // the OS (peak RSS, issue 16: Gemma 3's is ~30 MB); its error is reported after the
        // model's (a file that is no model at all, e.g. an MTP head, says so first).
        let tokenizer = Tokenizer::from_gguf(&gguf);
        if tokenizer.is_ok() {
            gguf.release_arrays(&[
                "tokenizer.ggml.tokens",
                "tokenizer.ggml.scores",
                "tokenizer.ggml.token_type",
                "tokenizer.ggml.merges",
            ]);
            release_free_heap();
        }
        let model = if model::Arch::of(&gguf, path)? == model::Arch::Qwen4Exp {
            let q4_err = |e: EngineError| e.in_file(path);
            // --ordered: the CPU in the device's float order (a device model takes the mode
            // from `GpuOptions::ordered`).
            let load = |gguf| {
                Qwen4Exp::from_gguf_with(gguf, &opts.ple).map(|mut m| {
                    m.ordered = opts.ordered_attention;
                    m
                })
            };
            let m = load(gguf).map_err(q4_err)?;
            #[cfg(feature = "gpu")]
            let mut gopts = opts.gpu;
            #[cfg(feature = "gpu")]
            {
                gopts.ordered |= opts.ordered_attention;
                // Flash-Next's experts rarely all fit a card: size the cache from the free VRAM
                // unless told otherwise (every expert resident when they do fit).
                gopts.expert_cache = gopts.expert_cache.or(Some(gpu_executor::options::ExpertCacheSize::Auto));
            }
            match opts.device {
                #[cfg(feature = "gpu")]
                Device::Hip | Device::Emu => {
                    let api = gpu_executor::device::open_device_with(opts.device, &gopts)
                        .map_err(|e| EngineError::Gpu(format!("--device {}: {e}", opts.device.name())))?;
                    let mut g = gpu_executor::flash_next::GpuFlashNext::new(m, std::sync::Arc::from(api), gopts)?;
                    prepare_flash_expert_cache(&mut g, &opts)?;
                    AnyModel::FlashGpu(Box::new(g))
                }
                // A usable card when there is one (never the software device); a model the card
                // cannot take (its memory, a dimension) runs on the CPU, with the reason.
                #[cfg(feature = "gpu")]
                Device::Auto => match gpu_executor::device::open_device_with(Device::Auto, &gopts) {
                    Ok(api) => match gpu_executor::flash_next::GpuFlashNext::new(m, std::sync::Arc::from(api), gopts) {
                        Ok(mut g) => {
                            prepare_flash_expert_cache(&mut g, &opts)?;
                            AnyModel::FlashGpu(Box::new(g))
                        }
                        Err(why) => {
                            eprintln!("strata: {} does not run on the GPU ({why}); running on the CPU", path.display());
                            let gguf = gguf::GgufFile::open(path)
                                .map_err(|source| EngineError::Gguf { path: path.to_path_buf(), source })?;
                            AnyModel::Flash(Box::new(load(gguf).map_err(q4_err)?))
                        }
                    },
                    Err(gpu_executor::device::GpuError::NoUsableGpu(why)) => {
                        if !matches!(*why, gpu_executor::device::GpuError::LibraryNotFound { .. }) {
                            eprintln!("strata: no usable GPU ({why}); running on the CPU");
                        }
                        AnyModel::Flash(Box::new(m))
                    }
                    Err(e) => return Err(EngineError::Gpu(format!("--device auto: {e}"))),
                },
                #[cfg(not(feature = "gpu"))]
                Device::Hip | Device::Emu => {
                    return Err(EngineError::Unsupported(format!(
                        "--device {} needs a build with GPU support (cargo build --features gpu)",
                        opts.device.name()
                    )));
                }
                #[cfg(not(feature = "gpu"))]
                Device::Auto => AnyModel::Flash(Box::new(m)),
                Device::Cpu => AnyModel::Flash(Box::new(m)),
            }
        } else {
            place(Model::from_gguf(gguf, path)?, &opts)?
        };
        let mut model = model;
        model.place_host_weights(&opts);
        let tokenizer = tokenizer.map_err(|source| EngineError::Tokenizer { path: path.to_path_buf(), source })?;
        // As llama.cpp: one vocabulary. A tokenizer larger than the embedding makes ids the
        // model cannot take; a smaller one, ids the model samples that decode to nothing.
        if tokenizer.vocab_size() != model.n_vocab() {
            return Err(EngineError::VocabMismatch {
                tokenizer: tokenizer.vocab_size(),
                tensor: "token_embd.weight",
                rows: model.n_vocab(),
            });
        }
        model
            .session_plan(&opts)
            .check(model.kv_in_host_memory(&opts).then(experts::source::mem_available).flatten())?;
        Ok(Engine { model, tokenizer, opts, path: path.to_path_buf() })
    }

    /// KV capacity for new sessions.
    pub fn context_size(&self) -> usize {
        context_positions(self.opts.max_context, self.model.n_ctx_train())
    }

    pub fn new_session(&self) -> Result<AnySession> {
        self.model.new_session_with(self.opts.kv, self.context_size(), self.opts.prefill, self.opts.products())
    }

    /// Encodes a prompt the way llama.cpp's examples do (BOS per the model, no special parsing
    /// unless asked).
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        self.tokenizer.encode(text, self.tokenizer.add_bos(), parse_special)
    }

    /// Why `text` encoded to no tokens at all, for the error a user sees.
    pub fn empty_prompt(&self, text: &str) -> String {
        let bos = if self.tokenizer.add_bos() { "" } else { " and this model adds no BOS token" };
        if text.is_empty() {
            format!("the prompt is empty{bos}: nothing to evaluate (give some text, or token ids with --tokens)")
        } else {
            format!(
                "the prompt {text:?} encodes to no tokens (none of its bytes is in the vocabulary){bos}: nothing to evaluate"
            )
        }
    }

    /// Evaluates `prompt` on a fresh session state and samples up to `n` tokens, calling
    /// `on_token` for each (return false to stop). Returns the tokens and why it stopped.
    pub fn generate(
        &self,
        sess: &mut AnySession,
        prompt: &[u32],
        n: usize,
        sampler: &mut Sampler,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, Stop)> {
        let needed = sess.n_past() + prompt.len() + n.saturating_sub(1);
        if needed > sess.capacity() {
            return Err(EngineError::ContextFull { needed, capacity: sess.capacity() });
        }
        let mut logits = Vec::new();
        self.model.eval(sess, prompt, Logits::Last, &mut logits)?;
        for &t in prompt {
            sampler.accept(t);
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let t = sampler.sample(&logits);
            if self.tokenizer.is_eog(t) {
                return Ok((out, Stop::Eog));
            }
            sampler.accept(t);
            out.push(t);
            if !on_token(t) {
                return Ok((out, Stop::Callback));
            }
            if out.len() < n {
                self.model.eval(sess, &[t], Logits::Last, &mut logits)?;
            }
        }
        Ok((out, Stop::Length))
    }
}

/// Turns a stream of token byte strings into valid UTF-8 text pieces, holding back incomplete
/// multi-byte sequences (byte-fallback tokens split characters).
#[derive(Default)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    /// Adds bytes; returns the longest complete UTF-8 prefix (invalid bytes become U+FFFD).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..good]).expect("validated prefix"));
                    match e.error_len() {
                        // Incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is left (lossy).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::TextStream;

    #[test]
    fn text_stream_holds_split_characters() {
        let mut t = TextStream::default();
        let e = "é".as_bytes();
        assert_eq!(t.push(&e[..1]), "");
        assert_eq!(t.push(&e[1..]), "é");
        assert_eq!(t.push(b"a\xffb"), "a\u{FFFD}b");
    }
}
