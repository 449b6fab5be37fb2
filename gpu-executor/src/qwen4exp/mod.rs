//! Flash-Next (qwen4exp) on a gfx11 device: the program of `model::qwen4exp::program` (its one
//! layer order) over the device's operations ([`exec`]), with the weights uploaded once
//! ([`weights`]) and each sequence's state (GR streams, GDN states, QSA caches, PLE history) in
//! device memory. The same code drives the software RDNA3 device and a real card.
//!
//! What runs where: every layer operation is a gfx11 kernel or a device matrix product
//! (`gpu::linear`); the host computes the PLE row ids and reads the rows (`Ple::gather`). The
//! routed experts run by device dispatch (`mmvq_moe_*` read the router's choice on the device)
//! when every expert is resident in an MMVQ type; otherwise the host reads each window's expert
//! ids back and launches the chosen experts (the expert cache's path, which also runs the
//! experts without a slot on the CPU). Windows are up to [`WINDOW`] tokens; without a host
//! readback in them they are captured as graphs once per size and replayed. Prompts of more
//! than [`PROMPT_MIN`] tokens run in prompt chunks of up to `--prefill` tokens ([`prompt`]: the
//! prompt GEMM / MMQ products, the chunked delta rule, each missing expert copied once a
//! chunk). Numerics are the fast mode's: the layer kernels' documented tolerances
//! (`quant::fmath` exp, sigmoid, SiLU), Q8_1 activations for MMVQ weights
//! (tests/gpu/gpu_qwen4exp.rs compares with the CPU backend).

mod exec;
mod mtp;
mod ple_feed;
mod prompt;
mod scratch;
mod weights;

pub use mtp::{GpuMtp, GpuMtpHead};
pub use prompt::{PREFILL_MAX, PROMPT_CHUNK, PROMPT_MIN};

use std::sync::Arc;

use super::abi::MAX_COLS;
use super::device::{DevicePtr, GpuApi};
use super::experts::cache::{AutoFit, CacheStats, ExpertCache};
use super::experts::handoff::ExpertHandoff;
use super::ops::{GpuOps, KvFormat};
use super::resident::{ExpertStacks, Resident};
use super::upload::{Uploader, gpu_err, weights_do_not_fit};
use crate::options::{ExpertCacheSize, GpuOptions};
use cpu_executor::kv_cache::KvType;
use model::Logits;
use model::Mat;
use model::error::{EngineError, Result};
use model::qwen4exp::moe::SwiGlu;
use model::qwen4exp::{PleState, Qwen4Exp};
use weights::{DevMixer, DevWeights};

/// Most tokens of one forward window (a prompt is a sequence of windows).
pub const WINDOW: usize = MAX_COLS;

/// A Flash-Next model resident on a device.
pub struct GpuQwen4Exp {
    /// The host model: its program, shapes, and the PLE table (read on the host).
    pub m: Qwen4Exp,
    /// The launch layer, stream, allocations and expert cache ([`Resident`]).
    pub res: Resident,
    w: DevWeights,
    /// With a PLE block, the mailbox its rows reach a running window through (`ple_feed`).
    ple_feed: Option<ple_feed::PleFeed>,
}

/// One layer's device state.
enum LayerState {
    /// Conv and delta-rule states, their snapshots (speculative rollback) and sizes in bytes.
    Gdn { conv: DevicePtr, delta: DevicePtr, snap: (DevicePtr, DevicePtr), bytes: (usize, usize) },
    /// K, V, κ caches, their int8 scales (0 for f16), block keys, rope table.
    Attn {
        k: DevicePtr,
        v: DevicePtr,
        kappa: DevicePtr,
        k_scale: DevicePtr,
        v_scale: DevicePtr,
        kappa_scale: DevicePtr,
        blocks: DevicePtr,
        rope: DevicePtr,
    },
}

/// The PLE block's sequence state: the host's token history, the device's conv history.
struct PleSession {
    prev: PleState,
    fresh: PleState,
    hist: DevicePtr,
    /// The history's snapshot (speculative rollback).
    snap: DevicePtr,
    hist_bytes: usize,
}

/// What every window of one evaluation does: a graph, the expert handoff, all logits or the
/// last, the wide residuals.
#[derive(Clone, Copy)]
struct WindowMode {
    graph: bool,
    handoff: bool,
    /// Prompt chunks (`prompt`): eager, no handoff, the chunked delta rule, the head from row
    /// `first_logit` (set per window).
    prompt: bool,
    first_logit: usize,
    all: bool,
    hidden: bool,
}

/// One window's logits (all rows or the last), wide residuals (when asked) and the PLE rows
/// gathered for the next window while it ran.
struct WindowOut {
    logits: Vec<f32>,
    wide: Vec<f32>,
    next_ple: Option<Vec<f32>>,
}

/// What a speculative rollback restores: the position and the PLE token history; the device
/// states were copied to the session's snapshot buffers when it was taken. One checkpoint is
/// live at a time (the verify loop takes one per window).
pub struct GpuCheckpoint {
    n_past: usize,
    ple_prev: Option<PleState>,
    /// A device error while copying, reported by the rollback.
    error: Option<String>,
}

/// A Flash-Next sequence on the device.
pub struct GpuQwen4ExpSession {
    pub n_past: usize,
    pub capacity: usize,
    kv: KvFormat,
    layers: Vec<LayerState>,
    ple: Option<PleSession>,
    sc: scratch::Scratch,
    allocs: Vec<DevicePtr>,
    api: Arc<dyn GpuApi>,
    /// Most tokens of one prompt chunk ([`WINDOW`]: prompts run in windows).
    pub chunk: usize,
    /// When set, device counters (software device only) are summed per operation of the program
    /// (`strata bench --device emu`).
    pub profile: Option<super::model::Profile>,
    /// When set, the wide residual `R` after every layer of the next evaluation is copied here,
    /// `[layer][tokens][hc][E]` (parity tests; its windows run eagerly).
    pub trace: Option<Vec<Vec<f32>>>,
    /// Captured windows by token count ([`GpuOptions::graphs`]), and how many windows were
    /// replayed from them or launched eagerly.
    graphs: Vec<(usize, super::device::Graph)>,
    pub graph_replays: usize,
    pub eager_windows: usize,
    /// Why a window failed part-way: its launches may have advanced the recurrent states, so
    /// the sequence cannot go on until [`GpuQwen4ExpSession::reset`] or a rollback.
    failed: Option<String>,
}

impl GpuQwen4ExpSession {
    /// Forgets the sequence: the recurrent states, PLE history and token history start over
    /// (the attention caches are overwritten from position 0). A device error leaves the
    /// session unusable; it is reported by the next evaluation.
    pub fn reset(&mut self) {
        self.n_past = 0;
        self.failed = None;
        for l in &self.layers {
            if let LayerState::Gdn { conv, delta, bytes, .. } = l {
                let _ = self.api.memset(*conv, 0, bytes.0);
                let _ = self.api.memset(*delta, 0, bytes.1);
            }
        }
        if let Some(p) = self.ple.as_mut() {
            p.prev = p.fresh.clone();
            let _ = self.api.memset(p.hist, 0, p.hist_bytes);
        }
    }
}

impl Drop for GpuQwen4ExpSession {
    fn drop(&mut self) {
        for (_, g) in self.graphs.drain(..) {
            let _ = self.api.graph_destroy(g);
        }
        for p in self.allocs.drain(..) {
            let _ = self.api.free(p);
        }
    }
}

impl Drop for GpuQwen4Exp {
    fn drop(&mut self) {
        if let Some(f) = self.ple_feed.take() {
            let _ = f.free(&**self.res.api());
        }
    }
}

impl GpuQwen4Exp {
    /// Uploads `m` to the device behind `api`. Refuses, naming the tensor and the limit, a model
    /// whose dimensions the kernels do not take. With `opts.ordered` the weights stay as stored
    /// for the ordered products and every expert must be resident (the cache runs its misses
    /// with the CPU's fast products).
    pub fn new(m: Qwen4Exp, api: Arc<dyn GpuApi>, opts: GpuOptions) -> Result<GpuQwen4Exp> {
        if !(0.0..=1.0).contains(&opts.pcie_frac) {
            return Err(EngineError::Unsupported(format!(
                "--pcie-frac {}: not a share between 0 and 1",
                opts.pcie_frac
            )));
        }
        let ops = GpuOps::new(api.clone()).map_err(gpu_err("loading the gfx11 kernels"))?;
        let stream = api.stream_create().map_err(gpu_err("creating a stream"))?;
        let n_expert = m.layers.iter().map(|l| l.moe.experts.len()).max().unwrap_or(0);
        let mut opts = opts;
        if opts.ordered {
            // Every expert resident (a device too small for them fails the upload, saying so).
            if let Some(ExpertCacheSize::Slots(n)) =
                opts.expert_cache.filter(|c| matches!(c, ExpertCacheSize::Slots(n) if (*n as usize) < n_expert))
            {
                return Err(EngineError::Unsupported(format!(
                    "qwen4exp on the GPU: --ordered needs every expert resident (--expert-cache {n} of {n_expert}: the cache runs its misses with the CPU's fast products)"
                )));
            }
            opts.expert_cache = None;
        }
        // `auto` starts with empty slots: `fit_expert_cache` sizes them once a session's size is known.
        let cache_slots = match opts.expert_cache {
            Some(ExpertCacheSize::Slots(n)) => Some(n as usize).filter(|&n| n < n_expert),
            Some(ExpertCacheSize::Auto) => Some(0),
            None => None,
        };
        let mut up = Uploader::new(&*api, opts.ordered);
        let w = weights::upload(&mut up, &m, cache_slots).map_err(weights_do_not_fit)?;
        let staging = match cache_slots {
            Some(_) => {
                let widest = w.layers.iter().map(|l| l.moe.experts.one_bytes()).max().unwrap_or(0);
                let base =
                    up.zeroed(crate::experts::staging_ring::StagingRing::bytes(widest)).map_err(weights_do_not_fit)?;
                Some(crate::experts::staging_ring::StagingRing::new(base, widest))
            }
            None => None,
        };
        let (allocs, weight_bytes) = up.finish();
        let expert_cache = cache_slots
            .map(|n| ExpertCache::for_options(m.layers.len(), n_expert, n, &opts, w.expert_bytes()))
            .transpose()?;
        let mut res = Resident::new(ops, opts, stream, allocs, weight_bytes);
        res.handoff = handoff_for(&*api, &m, &w, expert_cache.as_ref())?;
        res.expert_cache = expert_cache;
        res.staging = staging;
        let ple_feed = match &m.ple {
            Some(_) => Some(ple_feed::PleFeed::new(&*api, WINDOW, m.hp.n_embd).map_err(gpu_err("PLE row mailbox"))?),
            None => None,
        };
        Ok(GpuQwen4Exp { m, res, w, ple_feed })
    }

    /// `--expert-cache auto`: gives the MoE layers as many expert slots as fit in the free VRAM
    /// with one session of `max_ctx` positions of `kv` allocated, minus `--vram-reserve-mib`;
    /// every expert resident (no cache) when all fit. Called once, after [`GpuQwen4Exp::new`]
    /// with `auto` (which leaves 0 slots: every expert on the CPU until then).
    pub fn fit_expert_cache(&mut self, kv: KvType, max_ctx: usize) -> Result<AutoFit> {
        self.fit_expert_cache_chunked(kv, max_ctx, WINDOW)
    }

    /// [`GpuQwen4Exp::fit_expert_cache`] for sessions made by
    /// [`GpuQwen4Exp::new_session_chunked`] with `prefill_chunk` (their prompt chunk's
    /// buffers included).
    pub fn fit_expert_cache_chunked(&mut self, kv: KvType, max_ctx: usize, prefill_chunk: usize) -> Result<AutoFit> {
        let api = self.res.ops.api().clone();
        let n_expert = self.m.layers.iter().map(|l| l.moe.experts.len()).max().unwrap_or(0);
        let mut slot_bytes = 0u64;
        for l in &self.m.layers {
            for w in [&l.moe.experts[0].gate, &l.moe.experts[0].up, &l.moe.experts[0].down] {
                let (_, d) = super::upload::device_layout(false, w.data(), w.ty, w.rows, w.cols, 1, "expert")?;
                slot_bytes += d.mat_bytes as u64;
            }
        }
        let fit = super::experts::cache::fit_auto(
            &*api,
            self.res.opts.vram_reserve_mib,
            slot_bytes,
            n_expert,
            max_ctx,
            || self.new_session_chunked(kv, max_ctx, prefill_chunk),
        )?;
        let mut up = Uploader::new(&*api, false);
        let slots = (!fit.all_resident()).then_some(fit.slots);
        weights::resize_experts(&mut up, &self.m, &mut self.w, slots)?;
        let (allocs, bytes) = up.finish();
        let cache = slots
            .map(|n| ExpertCache::for_options(self.m.layers.len(), n_expert, n, &self.res.opts, self.w.expert_bytes()))
            .transpose()?;
        self.res.replace_expert_cache(allocs, bytes, cache)?;
        self.res.handoff = handoff_for(&*api, &self.m, &self.w, self.res.expert_cache.as_ref())?;
        Ok(fit)
    }

    /// The expert cache (`--expert-cache N` with fewer slots than experts).
    pub fn expert_cache(&self) -> Option<&ExpertCache> {
        self.res.expert_cache.as_ref()
    }

    /// The expert cache's counters (`--expert-cache N` with fewer slots than experts).
    pub fn expert_cache_stats(&self) -> Option<CacheStats> {
        self.res.expert_cache_stats()
    }

    /// Fills the expert cache's slots from an STRP profile (`--expert-profile`, most-routed
    /// first). Returns how many experts were copied.
    pub fn fill_expert_cache(&self, path: &std::path::Path) -> Result<usize> {
        self.res.fill_expert_cache(path, self)
    }

    /// Writes this run's routing counts as an STRP profile (`--expert-profile-save`).
    pub fn save_expert_profile(&self, path: &std::path::Path) -> Result<()> {
        self.res.save_expert_profile(path)
    }

    /// The GPU settings the model was loaded with.
    pub fn opts(&self) -> &GpuOptions {
        &self.res.opts
    }

    pub fn api(&self) -> &Arc<dyn GpuApi> {
        self.res.ops.api()
    }

    pub fn n_vocab(&self) -> usize {
        self.m.hp.n_vocab
    }

    /// An empty sequence of up to `max_ctx` positions with caches of type `kv` (f16 or int8;
    /// the device has no f32 cache), whose prompts run in windows of [`WINDOW`] like decode
    /// steps ([`GpuQwen4Exp::new_session_chunked`] for prompt chunks).
    pub fn new_session(&self, kv: KvType, max_ctx: usize) -> Result<GpuQwen4ExpSession> {
        self.new_session_chunked(kv, max_ctx, WINDOW)
    }

    /// The tokens of one prompt chunk of a session of `max_ctx` positions made with
    /// `prefill_chunk` ([`GpuQwen4Exp::new_session_chunked`]): `--prefill` up to
    /// [`PREFILL_MAX`] and the context, or a window.
    pub fn prompt_chunk(&self, max_ctx: usize, prefill_chunk: usize) -> usize {
        prompt::chunk_cols(&self.res.opts, prefill_chunk).min(max_ctx.max(WINDOW))
    }

    /// [`GpuQwen4Exp::new_session`] whose prompts (calls of more than [`PROMPT_MIN`] tokens)
    /// run in chunks of `prefill_chunk` tokens (`--prefill`), at most [`PREFILL_MAX`]
    /// (`prompt::chunk_cols`: windows in the ordered mode, with `--gpu-prefill mmvq` or a
    /// `prefill_chunk` of at most [`WINDOW`]). Decode and verify windows are unchanged.
    pub fn new_session_chunked(&self, kv: KvType, max_ctx: usize, prefill_chunk: usize) -> Result<GpuQwen4ExpSession> {
        let api = self.res.ops.api().clone();
        let fmt = kv_format(kv)?;
        let capacity = max_ctx.max(1);
        for (il, l) in self.w.layers.iter().enumerate() {
            if let DevMixer::Attn(a) = &l.mixer {
                check_cells(a, il, capacity)?;
            }
        }
        let mut up = Uploader::new(&*api, false);
        let mut ropes: Vec<((u32, u32), DevicePtr)> = Vec::new();
        let mut layers = Vec::with_capacity(self.w.layers.len());
        for l in &self.w.layers {
            layers.push(match &l.mixer {
                DevMixer::Gdn(g) => {
                    let bytes = (g.shape.conv_state_len().max(1) * 4, g.shape.delta_state_len() * 4);
                    let (conv, delta) = (up.zeroed(bytes.0)?, up.zeroed(bytes.1)?);
                    LayerState::Gdn { conv, delta, snap: (up.zeroed(bytes.0)?, up.zeroed(bytes.1)?), bytes }
                }
                DevMixer::Attn(a) => attn_state(&mut up, a, fmt, capacity, &mut ropes)?,
            });
        }
        let ple = match (&self.m.ple, &self.w.ple) {
            (Some(p), Some(dp)) => {
                let hist_bytes = dp.shape.hist_len().max(1) * 4;
                Some(PleSession {
                    prev: p.new_state(),
                    fresh: p.new_state(),
                    hist: up.zeroed(hist_bytes)?,
                    snap: up.zeroed(hist_bytes)?,
                    hist_bytes,
                })
            }
            _ => None,
        };
        let chunk = self.prompt_chunk(capacity, prefill_chunk);
        let sc = scratch::Scratch::new(&mut up, self, capacity, None, chunk)?;
        Ok(GpuQwen4ExpSession {
            n_past: 0,
            capacity,
            kv: fmt,
            layers,
            ple,
            sc,
            allocs: up.finish().0,
            api,
            chunk,
            profile: None,
            trace: None,
            graphs: Vec::new(),
            graph_replays: 0,
            eager_windows: 0,
            failed: None,
        })
    }

    /// Appends `tokens` to the sequence and writes their logits to `out` (`[n][n_vocab]`, or the
    /// last row), in windows of up to [`WINDOW`] tokens, or a prompt (more than [`PROMPT_MIN`]
    /// tokens) in the session's prompt chunks.
    pub fn eval(&self, s: &mut GpuQwen4ExpSession, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()> {
        self.eval_hidden(s, tokens, want, out, None)
    }

    /// [`GpuQwen4Exp::eval`] that also writes every token's wide residual to `hidden`
    /// (`[n][hc][n_embd]`, the streams before the output mixer: what the MTP head reads).
    pub fn eval_hidden(
        &self,
        s: &mut GpuQwen4ExpSession,
        tokens: &[u32],
        want: Logits,
        out: &mut Vec<f32>,
        mut hidden: Option<&mut Vec<f32>>,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        let needed = s.n_past + tokens.len();
        if needed > s.capacity {
            return Err(EngineError::ContextFull { needed, capacity: s.capacity });
        }
        if let Some(index) = tokens.iter().position(|&t| t as usize >= self.m.hp.n_vocab) {
            return Err(EngineError::BadTokenAt { token: tokens[index], index, n_vocab: self.m.hp.n_vocab });
        }
        if let Some(why) = &s.failed {
            return Err(EngineError::Gpu(format!(
                "qwen4exp: an earlier window of this sequence failed ({why}); its recurrent state is lost: reset the session or roll back to a checkpoint"
            )));
        }
        out.clear();
        if let Some(h) = hidden.as_deref_mut() {
            h.clear();
        }
        if let Some(t) = s.trace.as_mut() {
            t.clear();
        }
        if s.profile.is_some() {
            // Counters of earlier launches are not this evaluation's.
            let _ = self.res.ops.api().take_stats();
        }
        let prompt = tokens.len() > PROMPT_MIN && s.chunk > WINDOW;
        let mode = WindowMode {
            graph: self.capturable(s),
            handoff: self.by_handoff(s),
            prompt,
            first_logit: 0,
            all: want == Logits::All,
            hidden: hidden.is_some(),
        };
        let windows: Vec<&[u32]> = tokens.chunks(if prompt { s.chunk } else { WINDOW }).collect();
        let n_windows = windows.len();
        let mut ple_rows = None;
        for (i, win) in windows.iter().enumerate() {
            let last = i + 1 == n_windows;
            // A prompt chunk's head runs only for the logits that are read.
            let first_logit = match (want, last) {
                (Logits::All, _) => 0,
                (Logits::Last, true) => win.len() - 1,
                (Logits::Last, false) => win.len(),
            };
            // A prompt chunk gathers the next chunk's PLE rows while it runs; a window is fed its
            // own while it runs (`ple_feed`).
            let next = windows.get(i + 1).copied().filter(|_| prompt);
            let done = self.window(s, win, ple_rows.take(), next, WindowMode { first_logit, ..mode });
            // Admissions and swaps land even after a failed window (the slot table the device
            // copies next must only name experts that are in their slots).
            self.res.adapt_expert_cache(win.len(), self)?;
            let done = done.inspect_err(|e| s.failed = Some(e.to_string()))?;
            if want == Logits::All || last {
                out.extend_from_slice(&done.logits);
            }
            if let Some(h) = hidden.as_deref_mut() {
                h.extend_from_slice(&done.wide);
            }
            ple_rows = done.next_ple;
        }
        Ok(())
    }

    /// One window's launches (through the expert handoff when `mode.handoff`) with its PLE rows:
    /// gathered already (`ple_rows`), read while the launches run (a window, `ple_feed`), or
    /// gathered now; a prompt chunk then gathers the rows of the `next` one while it runs.
    fn window(
        &self,
        s: &mut GpuQwen4ExpSession,
        win: &[u32],
        ple_rows: Option<Vec<f32>>,
        next: Option<&[u32]>,
        mode: WindowMode,
    ) -> Result<WindowOut> {
        // A window (not a prompt chunk) whose rows are not gathered yet gets them through the
        // feed: their ids now, the reads while the launches run.
        let fed = match (&self.m.ple, &self.ple_feed, s.ple.as_mut(), &ple_rows, mode.prompt) {
            (Some(p), Some(_), Some(ps), None, false) => Some((
                p,
                p.row_ids(win, &mut ps.prev).map_err(|reason| EngineError::Ple { layer: p.params.layer, reason })?,
            )),
            _ => None,
        };
        let rows = match (ple_rows, &fed) {
            (Some(r), _) => exec::PleRows::Gathered(r),
            (None, Some(_)) => exec::PleRows::Fed,
            (None, None) => exec::PleRows::Now,
        };
        let mut chunk = exec::GpuQwen4ExpChunk::new(self, s, win, mode.graph, rows)?;
        if mode.prompt {
            chunk = chunk.prompt_chunk(mode.first_logit);
        }
        let (api, st) = (&**self.res.ops.api(), &self.res.stream);
        let launches = |chunk: &mut exec::GpuQwen4ExpChunk<'_>| match (
            mode.handoff && !mode.prompt,
            &self.res.handoff,
            &self.res.expert_cache,
        ) {
            (true, Some(h), Some(c)) => {
                let n = win.len();
                h.run_window(
                    api,
                    st,
                    c,
                    n,
                    || chunk.run(),
                    &|p| self.handoff_misses(p, n),
                    |e| EngineError::Gpu(format!("qwen4exp expert handoff: {e}")),
                )
            }
            _ => chunk.run(),
        };
        match (fed, &self.ple_feed) {
            (Some((p, ids)), Some(feed)) => feed.run(api, st, p, &ids, || launches(&mut chunk))?,
            _ => launches(&mut chunk)?,
        }
        let next_ple = next.map(|t| chunk.gather_next(t)).transpose()?.flatten();
        let (logits, wide) = chunk.finish(mode.all, mode.hidden)?;
        Ok(WindowOut { logits, wide, next_ple })
    }

    /// Whether `s`'s windows run their routed experts through the expert cache's handoff
    /// (`super::experts::handoff`): a cache, every layer's experts in an MMVQ type (device
    /// dispatch), and no profiling (which reads the choice back to count experts) or trace.
    fn by_handoff(&self, s: &GpuQwen4ExpSession) -> bool {
        self.res.handoff.is_some()
            && self.res.expert_cache.is_some()
            && s.profile.is_none()
            && s.trace.is_none()
            && self.w.layers.iter().all(|l| exec::moe_on_device(&self.res.opts, &l.moe))
    }

    /// Whether `s`'s windows run as graphs: `--gpu-graphs on`, and nothing in a window reads
    /// back to the host (every MoE layer by device dispatch, all experts resident or through the
    /// handoff) or between operations (profiling, the trace).
    fn capturable(&self, s: &GpuQwen4ExpSession) -> bool {
        self.res.opts.graphs
            && s.profile.is_none()
            && s.trace.is_none()
            && self.w.layers.iter().all(|l| exec::moe_on_device(&self.res.opts, &l.moe))
            && (self.res.expert_cache.is_none() || self.by_handoff(s))
    }

    /// Host side of the handoff for one layer: the rows of the experts without a slot, on the
    /// cache's CPU pool, each at its slot (`[n·k][n_embd]`; hits stay zero).
    fn handoff_misses(
        &self,
        p: &super::experts::handoff::Published,
        n: usize,
    ) -> std::result::Result<super::experts::handoff::Answer, super::device::GpuError> {
        use super::device::GpuError;
        let Some(cache) = &self.res.expert_cache else {
            return Err(GpuError::Launch { kernel: "qwen4exp moe".into(), what: "no expert cache".into() });
        };
        let (e, k) = (self.m.hp.n_embd, p.ids.len() / n.max(1));
        let host = &self.m.layers[p.layer].moe.experts;
        // Each token's input is quantized once for every expert the CPU computes for it alone,
        // at the first of them (a layer of hits needs none).
        let shared = std::sync::OnceLock::new();
        p.miss_rows(cache, e, |id, slots| {
            Ok(exec::expert_rows(
                &host[id],
                &p.x,
                slots,
                k,
                e,
                shared.get_or_init(|| exec::shared_acts(host.first(), &p.x, e)),
            ))
        })
    }

    /// Copies every recurrent state (GDN conv and delta rule, PLE history) of `s` to its snapshot
    /// (`to_snapshot`) or back, on the model's stream.
    fn copy_states(
        &self,
        s: &GpuQwen4ExpSession,
        to_snapshot: bool,
    ) -> std::result::Result<(), super::device::GpuError> {
        // (live buffer, its snapshot, bytes)
        let mut copies = Vec::new();
        for l in &s.layers {
            if let LayerState::Gdn { conv, delta, snap, bytes } = l {
                copies.extend([(*conv, snap.0, bytes.0), (*delta, snap.1, bytes.1)]);
            }
        }
        if let Some(p) = &s.ple {
            copies.push((p.hist, p.snap, p.hist_bytes));
        }
        let api = self.res.ops.api();
        for (live, snap, bytes) in copies {
            let (dst, src) = if to_snapshot { (snap, live) } else { (live, snap) };
            api.memcpy_dtod_async(&self.res.stream, dst, src, bytes)?;
        }
        Ok(())
    }

    /// A checkpoint of `s` for [`GpuQwen4Exp::rollback`]: its recurrent states copied to the
    /// session's snapshot buffers (fixed size; the attention caches are not copied: a rollback
    /// moves the position back and the next windows overwrite the cells).
    pub fn checkpoint(&self, s: &GpuQwen4ExpSession) -> GpuCheckpoint {
        let error = self.copy_states(s, true).err().map(|e| e.to_string());
        GpuCheckpoint { n_past: s.n_past, ple_prev: s.ple.as_ref().map(|p| p.prev.clone()), error }
    }

    /// Puts `s` back to `cp` (the latest checkpoint of `s`).
    pub fn rollback(&self, s: &mut GpuQwen4ExpSession, cp: GpuCheckpoint) -> Result<()> {
        if let Some(e) = cp.error {
            return Err(EngineError::Gpu(format!("qwen4exp checkpoint: {e}")));
        }
        self.copy_states(s, false).map_err(gpu_err("qwen4exp rollback"))?;
        s.n_past = cp.n_past;
        s.failed = None;
        if let (Some(p), Some(prev)) = (s.ple.as_mut(), cp.ple_prev) {
            p.prev = prev;
        }
        Ok(())
    }
}

/// The per-layer handoff of a model with an expert cache (None without one), its device
/// weights `w`; with `--pcie-frac`, the experts in RAM mapped for the device (each layer's
/// experts must be one range there: a stack as the loader split it).
fn handoff_for(
    api: &dyn GpuApi,
    m: &Qwen4Exp,
    w: &DevWeights,
    cache: Option<&ExpertCache>,
) -> Result<Option<ExpertHandoff>> {
    let (Some(l), Some(cache)) = (m.layers.first(), cache) else { return Ok(None) };
    let n_expert = m.layers.iter().map(|l| l.moe.experts.len()).max().unwrap_or(0);
    let pcie = if cache.streams() {
        let mut stacks = Vec::with_capacity(m.layers.len());
        for (il, (h, d)) in m.layers.iter().zip(&w.layers).enumerate() {
            let f = &d.moe.experts.stack;
            if ![f.gate.kind, f.up.kind, f.down.kind].iter().all(|k| matches!(k, crate::upload::MatKind::Q(_))) {
                stacks.push(None);
                continue;
            }
            let joined = |pick: fn(&SwiGlu) -> &Mat, name: &str| {
                let mats: Vec<&Mat> = h.moe.experts.iter().map(pick).collect();
                Mat::joined(&mats).ok_or_else(|| EngineError::Unsupported(format!("--pcie-frac: blk.{il}.ffn_{name}_exps is not one range in RAM (experts split apart); use --pcie-frac 0")))
            };
            stacks.push(Some([
                (joined(|x| &x.gate, "gate")?, f.gate),
                (joined(|x| &x.up, "up")?, f.up),
                (joined(|x| &x.down, "down")?, f.down),
            ]));
        }
        Some(super::experts::pcie::PcieExperts::register(api, &stacks).map_err(gpu_err("--pcie-frac"))?)
    } else {
        None
    };
    ExpertHandoff::new(
        api,
        m.layers.len(),
        (0..m.layers.len()).collect(),
        n_expert,
        l.moe.spec.n_expert_used,
        m.hp.n_embd,
        pcie,
    )
    .map(Some)
    .map_err(gpu_err("qwen4exp expert handoff buffers"))
}

/// The attention kernel keeps a token's scores in LDS: a dense layer attends to every cell, an
/// indexed one to at most its budget.
fn check_cells(a: &weights::DevQsa, il: usize, capacity: usize) -> Result<()> {
    let cells = a.shape.indexer.map_or(capacity, |ix| capacity.min(ix.budget() as usize));
    if cells > super::abi::QSA_MAX_CELLS as usize {
        return Err(EngineError::Unsupported(format!(
            "qwen4exp on the GPU: layer {il} attends to {cells} cells at this context ({capacity}); the attention kernel takes at most {} (use --max-context {} or --device cpu)",
            super::abi::QSA_MAX_CELLS,
            super::abi::QSA_MAX_CELLS
        )));
    }
    Ok(())
}

/// An attention layer's caches for `capacity` positions of `fmt` (rope tables shared by layers
/// with the same base and roped dims through `ropes`).
fn attn_state(
    up: &mut Uploader,
    a: &weights::DevQsa,
    fmt: KvFormat,
    capacity: usize,
    ropes: &mut Vec<((u32, u32), DevicePtr)>,
) -> Result<LayerState> {
    let s = &a.shape;
    let esz = if fmt == KvFormat::Int8 { 1 } else { 2 };
    let (kv_row, idim) = ((s.n_head_kv * s.head_dim) as usize, s.indexer.map_or(1, |ix| ix.dim as usize));
    let ratio = s.indexer.map_or(1, |ix| ix.ratio as usize);
    let key = (a.rope_base.to_bits(), s.n_rot);
    let rope = match ropes.iter().find(|(k, _)| *k == key) {
        Some((_, p)) => *p,
        None => {
            let p = up.f32s(&GpuOps::rope_table_ggml(a.rope_base, 1.0, s.n_rot as usize, capacity))?;
            ropes.push((key, p));
            p
        }
    };
    let int8 = fmt == KvFormat::Int8;
    Ok(LayerState::Attn {
        k: up.zeroed(capacity * kv_row * esz)?,
        v: up.zeroed(capacity * kv_row * esz)?,
        kappa: up.zeroed(capacity * idim * esz)?,
        k_scale: if int8 { up.zeroed(capacity * s.n_head_kv as usize * 4)? } else { 0 },
        v_scale: if int8 { up.zeroed(capacity * s.n_head_kv as usize * 4)? } else { 0 },
        kappa_scale: if int8 { up.zeroed(capacity * 4)? } else { 0 },
        blocks: up.zeroed((capacity / ratio).max(1) * idim * 4)?,
        rope,
    })
}

/// The device format of a cache type (the device has no f32 cache).
fn kv_format(kv: KvType) -> Result<KvFormat> {
    match kv {
        KvType::F16 => Ok(KvFormat::F16),
        KvType::Int8 => Ok(KvFormat::Int8),
        KvType::F32 => {
            Err(EngineError::Unsupported("--kv f32 runs on the CPU only (the device caches are f16 or int8)".into()))
        }
    }
}

/// Flash-Next's expert stacks: each routed expert's gate, up and down, laid out as at upload.
impl ExpertStacks for GpuQwen4Exp {
    fn n_expert(&self) -> usize {
        self.m.layers.iter().map(|l| l.moe.experts.len()).max().unwrap_or(0)
    }

    fn expert_parts(
        &self,
        layer: usize,
        expert: usize,
        slot: usize,
    ) -> Result<Vec<(DevicePtr, std::borrow::Cow<'_, [u8]>)>> {
        let host = self.m.layers[layer]
            .moe
            .experts
            .get(expert)
            .ok_or_else(|| EngineError::Gpu(format!("qwen4exp layer {layer} has no expert {expert}")))?;
        self.w.layers[layer].moe.experts.parts(host, slot).map_err(|w| {
            EngineError::Gpu(format!("qwen4exp layer {layer}: copying expert {expert} into slot {slot}: {w}"))
        })
    }
}
