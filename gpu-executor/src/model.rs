//! The shared decoder (gemma3, llama, qwen2, qwen3, qwen3moe) on a gfx11 device, through
//! [`GpuOps`] over `dyn GpuApi`: the same code drives the software RDNA3 device (`emu`) and a
//! real card (`hip`).
//!
//! Weights are uploaded once, as stored: the MMVQ types (Q8_0, Q4_K, Q6_K, IQ3_XXS) stay
//! quantized and run through `mmvq` against Q8_1 activations; every other type is dequantized
//! on the host to f32 at upload and runs through the GEMM entry point (hipBLAS on a card, a host
//! GEMM on the software device). Tokens are evaluated in windows of up to [`MAX_COLS`] (one
//! MMVQ launch per projection per window, the speculative-verification shape); a longer prompt
//! is a sequence of such windows.
//!
//! The routed-expert FFN has two paths ([`MoePath`]): device dispatch (decode windows) — the
//! `mmvq_moe_*` kernels read the router's choice from a device buffer, so the whole window is
//! launch-only and graph-capturable; and host readback (long prompt chunks, F32/F16 experts,
//! the ordered-numerics mode) — the choice is copied to the host (one small synchronous copy
//! per MoE layer and window) and each selected expert runs on the tokens that chose it, like
//! the CPU backend. Both give the same bits.
//!
//! Numerics differ from the CPU backend only where the kernels do: Q8_1 instead of Q8_K
//! activations, the GELU/SiLU and norm reductions. Attention has an ordered mode
//! ([`AttnMode::Ordered`], the default) that is bit-identical to
//! `cpu::attention::attend_ordered` (tests/gpu/gpu_model.rs checks layers and greedy tokens).
//! The ordered-numerics mode ([`GpuOptions::ordered`]) removes the other differences: with the
//! CPU's `Session::ordered`, every layer and the logits are bit-identical
//! (tests/gpu/gpu_model_ordered.rs).

use std::sync::Arc;

use super::abi::MAX_COLS;
use super::device::{DevicePtr, GpuApi, GpuError};
use super::experts::cache::{CacheStats, ExpertCache};
use super::experts::staging_ring::StagingRing;
use super::ops::{AttnMode, GpuOps, KvFormat};
use super::resident::Resident;
use super::upload::{DevMat, MatKind, Uploader, gpu_err, q8_1_bytes, u32_bytes, weights_do_not_fit};
pub use crate::options::{ExpertCacheSize, GEMM_MIN_TOKENS, GpuOptions, MoePath, PrefillPath};
use cpu_executor::kv_cache::KvType;
use model::decoder::WeightName;
use model::error::{EngineError, Result};
use model::{Act, Decoder, DecoderWeights, Ffn, LayerKind, Logits};

/// A model resident on a device.
pub struct GpuModel {
    pub model: Decoder,
    /// The launch layer, stream, allocations and expert cache ([`Resident`]).
    pub res: Resident,
    /// Every weight on the device, as `model::decoder` lists them.
    pub(super) w: DecoderWeights<DevMat, DevicePtr>,
    /// Distinct (rope base, rope scale) pairs; sessions build one cos/sin table per entry.
    pub(super) rope_params: Vec<(f32, f32)>,
    /// f32 bytes of the largest quantized layer matrix (the GEMM path's scratch).
    pub(super) dequant_scratch_bytes: usize,
    /// hipBLASLt calibration table (`--calibration`), consulted by `gemm`; None: hipBLAS only.
    pub(super) lt: Option<super::calibrate::LtDispatch>,
    /// Ordered mode: activations quantized for `mmv_ordered` (room for [`MAX_COLS`] columns
    /// of the widest input as f32; windows are at most that wide) and the f16 GELU table
    /// (Gemma); 0 otherwise.
    pub(super) xo: DevicePtr,
    pub(super) gelu_table: DevicePtr,
    /// Every MoE layer's expert gate/up/down matrices have an MMVQ type (device dispatch possible).
    pub(super) moe_quantized: bool,
}

/// Per-sequence device state: KV cache, rope tables, scratch.
pub struct GpuSession {
    pub n_past: usize,
    pub capacity: usize,
    /// Most tokens one forward call takes (a window, or a prompt chunk on the GEMM path).
    pub chunk: usize,
    pub(super) kv: Vec<[DevicePtr; 4]>,
    pub(super) fmt: KvFormat,
    pub(super) rope_tables: Vec<DevicePtr>,
    pub(super) sc: Scratch,
    allocs: Vec<DevicePtr>,
    api: Arc<dyn GpuApi>,
    /// When set, the residual stream after every layer of the next evaluation is copied here
    /// (`[layer][tokens * n_embd]`; parity tests).
    pub trace: Option<Vec<Vec<f32>>>,
    /// When set, device counters (software device only) are summed per part of the forward
    /// pass (`strata bench --device emu`).
    pub profile: Option<Profile>,
    /// Captured decode windows, by (tokens, first logits row).
    graphs: Vec<((usize, usize), super::device::Graph)>,
    /// Graph replays and eager windows so far (tests, bench).
    pub graph_replays: usize,
    pub eager_windows: usize,
}

/// Counters of one part of the forward pass, summed over windows.
#[derive(Clone, Debug, Default)]
pub struct PartStats {
    /// Kernel launches and their wave instructions.
    pub launches: u64,
    pub instructions: u64,
    pub global_bytes: u64,
    /// Bytes the part must move at least: weights read + KV read/written + activations.
    pub ideal_bytes: u64,
}

/// Per-part counters: `embed`, `attention`, `ffn` (dense or routed), `head`.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub parts: std::collections::BTreeMap<&'static str, PartStats>,
    pub tokens: u64,
}

impl Drop for GpuSession {
    fn drop(&mut self) {
        for (_, g) in self.graphs.drain(..) {
            let _ = self.api.graph_destroy(g);
        }
        for p in self.allocs.drain(..) {
            let _ = self.api.free(p);
        }
    }
}

/// Device scratch sized for one window of [`MAX_COLS`] tokens.
pub(super) struct Scratch {
    /// Tokens the buffers hold (the session's chunk).
    pub chunk: usize,
    pub ids: DevicePtr,
    pub pos: DevicePtr,
    pub x: DevicePtr,
    pub xn: DevicePtr,
    pub q: DevicePtr,
    pub k: DevicePtr,
    pub v: DevicePtr,
    pub att: DevicePtr,
    pub o: DevicePtr,
    pub gate: DevicePtr,
    pub up: DevicePtr,
    pub act: DevicePtr,
    /// Q8_1 activations of up to MAX_COLS columns of the widest input.
    pub xq: DevicePtr,
    pub logits: DevicePtr,
    // MoE
    pub router: DevicePtr,
    pub sel_ids: DevicePtr,
    pub sel_w: DevicePtr,
    pub map: DevicePtr,
    /// Each slot's expert-cache slot (`moe_slot_map`, the handoff path).
    pub sel_slots: DevicePtr,
    /// Q8_1 activations gathered per expert.
    pub xq_e: DevicePtr,
    /// Expert outputs, one row of n_embd per (token, slot); after the first `chunk * k` rows,
    /// `MAX_COLS * k` more for the host's rows on the handoff path (`GpuModel::moe_handoff`).
    pub y_e: DevicePtr,
    /// The identity slot map `0..chunk * k` (device dispatch: slot s's output is row s of y_e).
    pub map_id: DevicePtr,
    /// A prompt chunk's slots ordered by expert (device dispatch of more than a window).
    pub order: super::linear::SlotOrder,
    /// f16 copy of one layer matrix (dequantize + GEMM prefill path; 0 when unused).
    pub wdq: DevicePtr,
    /// f16 activations for f16 GEMMs.
    pub xh: DevicePtr,
}

/// The per-layer handoff of `model` with an expert cache (None without one), its device
/// weights `w`; with `--pcie-frac` in fast mode, the experts in RAM mapped for the device.
pub(super) fn handoff_for(
    api: &dyn GpuApi,
    model: &Decoder,
    w: &DecoderWeights<DevMat, DevicePtr>,
    cache: Option<&ExpertCache>,
    opts: &GpuOptions,
) -> Result<Option<super::experts::handoff::ExpertHandoff>> {
    let (hp, host) = (&model.hp, &model.w);
    let (Some(m), Some(cache)) = (&hp.moe, cache) else { return Ok(None) };
    let moe_layers =
        w.layers.iter().enumerate().filter(|(_, l)| matches!(l.ffn.ffn, Ffn::Moe { .. })).map(|(i, _)| i).collect();
    let pcie = if cache.streams() && !opts.ordered {
        let stacks: Vec<_> = w
            .layers
            .iter()
            .zip(&host.layers)
            .map(|(d, h)| match (&d.ffn.ffn, &h.ffn.ffn) {
                (Ffn::Moe { gate, up, down, .. }, Ffn::Moe { gate: hg, up: hu, down: hd, .. })
                    if [gate, up, down].iter().all(|m| matches!(m.kind, MatKind::Q(_))) =>
                {
                    Some([(hg.data(), *gate), (hu.data(), *up), (hd.data(), *down)])
                }
                _ => None,
            })
            .collect();
        Some(super::experts::pcie::PcieExperts::register(api, &stacks).map_err(gpu_err("--pcie-frac"))?)
    } else {
        None
    };
    super::experts::handoff::ExpertHandoff::new(
        api,
        hp.n_layer,
        moe_layers,
        m.n_expert,
        m.n_expert_used,
        hp.n_embd,
        pcie,
    )
    .map(Some)
    .map_err(gpu_err("expert cache handoff buffers"))
}

impl GpuModel {
    /// Uploads `model` to the device behind `api`.
    pub fn new(model: Decoder, api: Arc<dyn GpuApi>, opts: GpuOptions) -> Result<GpuModel> {
        // The ordered mode's attention is the ordered kernel, whatever `attn` says.
        let opts = if opts.ordered { GpuOptions { attn: AttnMode::Ordered, ..opts } } else { opts };
        let ops = GpuOps::new(api.clone()).map_err(gpu_err("loading the gfx11 kernels"))?;
        let stream = api.stream_create().map_err(gpu_err("creating a stream"))?;
        if !(0.0..=1.0).contains(&opts.pcie_frac) {
            return Err(EngineError::Unsupported(format!(
                "--pcie-frac {}: not a share between 0 and 1",
                opts.pcie_frac
            )));
        }
        let up = Uploader::new(&*api, opts.ordered);
        let hp = &model.hp;
        for (what, n) in [("n_embd", hp.n_embd), ("n_head * head_dim", hp.n_head * hp.head_dim)] {
            if n % 32 != 0 {
                return Err(EngineError::Unsupported(format!(
                    "GPU backend: {what} = {n} is not a multiple of 32 (Q8_1 activation blocks)"
                )));
            }
        }
        // Every weight through one uploader, in `DecoderWeights`' order.
        let up = std::cell::RefCell::new(up);
        // A partial expert cache: expert stacks become `slots` empty slots, filled on use.
        // `auto` starts with empty slots: `fit_expert_cache` sizes them once a session's size is known.
        let cache_slots = match (&hp.moe, opts.expert_cache) {
            (Some(m), Some(ExpertCacheSize::Slots(n))) if (n as usize) < m.n_expert => Some(n as usize),
            (Some(_), Some(ExpertCacheSize::Auto)) => Some(0),
            _ => None,
        };
        let is_stack = |s: &str| matches!(s, "ffn_gate_exps.weight" | "ffn_up_exps.weight" | "ffn_down_exps.weight");
        let w = model
            .w
            .try_map(
                |m, name| match name {
                    WeightName::TokEmbd => up.borrow_mut().embedding(m),
                    WeightName::Layer(_, s) if is_stack(s) && cache_slots.is_some() => {
                        up.borrow_mut().slots(m, &name.to_string(), cache_slots.unwrap_or(0))
                    }
                    _ => up.borrow_mut().mat(m, &name.to_string()),
                },
                |v, _| up.borrow_mut().f32s(v),
            )
            .map_err(weights_do_not_fit)?;
        let mut up = up.into_inner();
        let mut rope_params: Vec<(f32, f32)> = Vec::new();
        for LayerKind::Attention(spec) in &hp.layers {
            if !rope_params.contains(&(spec.rope_base, spec.rope_scale)) {
                rope_params.push((spec.rope_base, spec.rope_scale));
            }
        }
        let (mut xo, mut gelu_table) = (0, 0);
        if opts.ordered {
            let ff = hp.moe.as_ref().map_or(hp.n_ff, |m| m.n_ff_exp.max(hp.n_ff));
            let widest = hp.n_embd.max(hp.n_head * hp.head_dim).max(ff);
            xo = up.zeroed(MAX_COLS * widest * 4)?;
            if hp.arch.ggml_exact() && hp.act == Act::GeluTanh {
                gelu_table = up.f32s(cpu_kernels::gelu_f16_table())?;
            }
        }
        // With an expert cache, the staging ring the misses computed on the device from a copy go
        // through (prompt chunks, `--pcie-frac` on the host path), slots as large as the largest
        // layer's expert.
        let staging = if cache_slots.is_some() {
            let widest = w
                .layers
                .iter()
                .filter_map(|l| match &l.ffn.ffn {
                    Ffn::Moe { gate, up, down, .. } => Some(gate.mat_bytes + up.mat_bytes + down.mat_bytes),
                    Ffn::Dense { .. } => None,
                })
                .max()
                .unwrap_or(0);
            Some(StagingRing::new(up.zeroed(StagingRing::bytes(widest))?, widest))
        } else {
            None
        };
        let (allocs, weight_bytes) = up.finish();
        let layer_mats = w.layers.iter().flat_map(|l| {
            let a = &l.attn;
            let mut v = vec![a.wq, a.wk, a.wv, a.wo];
            if let Ffn::Dense { gate, up, down } = &l.ffn.ffn {
                v.extend([*gate, *up, *down]);
            }
            v
        });
        let dequant_scratch_bytes =
            layer_mats.filter(|m| matches!(m.kind, MatKind::Q(_))).map(|m| m.rows * m.cols * 4).max().unwrap_or(0);
        let moe_quantized = w.layers.iter().all(|l| match &l.ffn.ffn {
            Ffn::Moe { gate, up, down, .. } => [gate, up, down].iter().all(|m| matches!(m.kind, MatKind::Q(_))),
            Ffn::Dense { .. } => true,
        });
        let expert_bytes = w.layers.iter().find_map(|l| match &l.ffn.ffn {
            Ffn::Moe { gate, up, down, .. } => Some(gate.mat_bytes + up.mat_bytes + down.mat_bytes),
            Ffn::Dense { .. } => None,
        });
        let expert_cache = cache_slots
            .zip(hp.moe.as_ref())
            .map(|(n, m)| ExpertCache::for_options(hp.n_layer, m.n_expert, n, &opts, expert_bytes.unwrap_or(0)))
            .transpose()?;
        let mut res = Resident::new(ops, opts, stream, allocs, weight_bytes);
        res.handoff = handoff_for(&*api, &model, &w, expert_cache.as_ref(), &opts)?;
        res.expert_cache = expert_cache;
        res.staging = staging;
        Ok(GpuModel { model, res, w, rope_params, dequant_scratch_bytes, lt: None, xo, gelu_table, moe_quantized })
    }

    /// Routes dense GEMMs whose shape has a row in `table` through hipBLASLt (calibrate.rs);
    /// the others stay on hipBLAS. `source` names the table in messages.
    pub fn set_calibration(
        &mut self,
        table: super::calibrate::CalibrationTable,
        source: std::path::PathBuf,
    ) -> Result<()> {
        let api = self.res.ops.api().clone();
        let ws = super::calibrate::LtDispatch::workspace_needed(&table);
        let p = if ws > 0 { api.malloc(ws).map_err(gpu_err("hipBLASLt workspace"))? } else { 0 };
        if p != 0 {
            self.res.allocs.push(p);
        }
        self.lt = Some(super::calibrate::LtDispatch::new(table, source, p, ws));
        Ok(())
    }

    /// The calibration table in use, if any.
    pub fn calibration(&self) -> Option<&super::calibrate::LtDispatch> {
        self.lt.as_ref()
    }

    /// The expert cache (`--expert-cache` with fewer slots than experts).
    pub fn expert_cache(&self) -> Option<&ExpertCache> {
        self.res.expert_cache.as_ref()
    }

    /// The expert cache's counters (`--expert-cache` with fewer slots than experts).
    pub fn expert_cache_stats(&self) -> Option<CacheStats> {
        self.res.expert_cache_stats()
    }

    pub fn api(&self) -> &Arc<dyn GpuApi> {
        self.res.ops.api()
    }

    /// The options the model runs with (the ordered mode's attention is `Ordered` whatever
    /// `--gpu-attn` said).
    pub fn opts(&self) -> &GpuOptions {
        &self.res.opts
    }

    pub fn n_vocab(&self) -> usize {
        self.model.n_vocab
    }

    /// Tokens per forward call for a `--prefill` chunk: longer than a window only when the
    /// dequantize + GEMM path may run (see [`PrefillPath`]).
    fn chunk_cols(&self, prefill_chunk: usize) -> usize {
        if self.res.opts.ordered {
            return MAX_COLS; // the ordered kernels gain nothing from longer chunks
        }
        match self.res.opts.prefill {
            PrefillPath::Mmvq => MAX_COLS,
            PrefillPath::Auto | PrefillPath::DequantGemm | PrefillPath::Mmq => prefill_chunk.max(MAX_COLS),
        }
    }

    /// A fresh sequence with room for `max_ctx` positions.
    /// `prefill_chunk`: tokens per prompt chunk (`--prefill`); scratch is sized for it.
    pub fn new_session(&self, kv: KvType, max_ctx: usize, prefill_chunk: usize) -> Result<GpuSession> {
        let api = self.res.ops.api().clone();
        let hp = &self.model.hp;
        if max_ctx > super::ops::ATTN_MAX_KV_LIMIT as usize {
            return Err(EngineError::Unsupported(format!(
                "GPU attention keeps at most {} cells per query in LDS: use --max-context {} or less",
                super::ops::ATTN_MAX_KV_LIMIT,
                super::ops::ATTN_MAX_KV_LIMIT
            )));
        }
        if max_ctx as u32 > self.res.ops.attn_max_kv() {
            self.res.ops.set_attn_max_kv(max_ctx as u32).map_err(gpu_err("attention window"))?;
        }
        let mut up = Uploader::new(&*api, self.res.opts.ordered);
        let fmt = match kv {
            KvType::F16 => KvFormat::F16,
            KvType::Int8 => KvFormat::Int8,
            KvType::F32 => {
                return Err(EngineError::Unsupported(
                    "--kv f32 runs on the CPU only (the gfx11 attention kernels read f16 or int8 caches)".into(),
                ));
            }
        };
        let row = hp.n_head_kv * hp.head_dim;
        let mut kvs = Vec::with_capacity(hp.n_layer);
        for _ in 0..hp.n_layer {
            let (data, scale) = match fmt {
                KvFormat::F16 => (max_ctx * row * 2, 0),
                KvFormat::Int8 => (max_ctx * row, max_ctx * hp.n_head_kv * 4),
            };
            let k = up.zeroed(data)?;
            let ks = if scale > 0 { up.zeroed(scale)? } else { 0 };
            let v = up.zeroed(data)?;
            let vs = if scale > 0 { up.zeroed(scale)? } else { 0 };
            kvs.push([k, ks, v, vs]);
        }
        let exact = hp.arch.ggml_exact();
        let mut rope_tables = Vec::new();
        for &(base, scale) in &self.rope_params {
            let t = if exact {
                GpuOps::rope_table_ggml(base, scale, hp.rope_dim.min(hp.head_dim), max_ctx)
            } else {
                GpuOps::rope_table(base, scale, hp.rope_dim.min(hp.head_dim), max_ctx)
            };
            rope_tables.push(up.f32s(&t)?);
        }
        let (d, nq, nk) = (hp.n_embd, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim);
        let (ff, k_used, n_exp) = match &hp.moe {
            Some(m) => (m.n_ff_exp, m.n_expert_used, m.n_expert),
            None => (hp.n_ff, 1, 1),
        };
        let c = self.chunk_cols(prefill_chunk.clamp(1, max_ctx.max(1)));
        let f = |n: usize| n * 4;
        let widest = d.max(nq).max(ff);
        let sc = Scratch {
            chunk: c,
            ids: up.zeroed(c * 4)?,
            pos: up.zeroed(c * 4)?,
            x: up.zeroed(f(c * d))?,
            xn: up.zeroed(f(c * d.max(nq)))?,
            q: up.zeroed(f(c * nq))?,
            k: up.zeroed(f(c * nk))?,
            v: up.zeroed(f(c * nk))?,
            att: up.zeroed(f(c * nq))?,
            o: up.zeroed(f(c * d))?,
            gate: up.zeroed(f(c * k_used * ff))?,
            up: up.zeroed(f(c * k_used * ff))?,
            act: up.zeroed(f(c * k_used * ff))?,
            xq: up.zeroed(q8_1_bytes(c * widest.next_multiple_of(32)))?,
            logits: up.zeroed(f(c * self.model.n_vocab))?,
            router: up.zeroed(f(c * n_exp))?,
            sel_ids: up.zeroed(c * k_used * 4)?,
            sel_w: up.zeroed(f(c * k_used))?,
            map: up.zeroed(c * k_used * 4)?,
            sel_slots: up.zeroed(c * k_used * 4)?,
            // Gathered expert inputs: Q8_1 columns, or f32 rows for dequantized experts.
            xq_e: up.zeroed(c * k_used * ff.max(d).next_multiple_of(32) * 4)?,
            y_e: up.zeroed(f((c + MAX_COLS) * k_used * d))?,
            map_id: up.bytes(u32_bytes(&(0..(c * k_used) as u32).collect::<Vec<u32>>()))?,
            order: super::linear::SlotOrder::alloc(&mut up, c * k_used)?,
            wdq: if c > MAX_COLS { up.zeroed(self.dequant_scratch_bytes)? } else { 0 },
            xh: up.zeroed(c * k_used.max(1) * widest.max(d).next_multiple_of(32) * 2)?,
        };
        Ok(GpuSession {
            n_past: 0,
            capacity: max_ctx,
            chunk: c,
            kv: kvs,
            fmt,
            rope_tables,
            sc,
            allocs: up.finish().0,
            api: api.clone(),
            trace: None,
            profile: None,
            graphs: Vec::new(),
            graph_replays: 0,
            eager_windows: 0,
        })
    }

    /// Appends `tokens` to the sequence and writes logits to `out`, like `Model::eval`.
    pub fn eval(&self, s: &mut GpuSession, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        let nv = self.model.n_vocab;
        if let Some(index) = tokens.iter().position(|&t| t as usize >= nv) {
            return Err(EngineError::BadTokenAt { token: tokens[index], index, n_vocab: nv });
        }
        let needed = s.n_past + tokens.len();
        if needed > s.capacity {
            return Err(EngineError::ContextFull { needed, capacity: s.capacity });
        }
        let rows = if want == Logits::All { tokens.len() } else { 1 };
        out.resize(rows * nv, 0.0);
        let c = s.chunk;
        let n_win = tokens.len().div_ceil(c);
        for (wi, win) in tokens.chunks(c).enumerate() {
            let last = wi + 1 == n_win;
            let first_row = match want {
                Logits::All => Some(0),
                Logits::Last if last => Some(win.len() - 1),
                Logits::Last => None,
            };
            let ran = self.window(s, win, first_row);
            // Admissions and swaps land even after a failed window: the slot table the next
            // window's device copy is made from must only name experts that are in their slots.
            self.res.adapt_expert_cache(win.len(), self)?;
            ran.map_err(gpu_err("GPU forward"))?;
            if let Some(first) = first_row {
                let m = win.len() - first;
                let dst = match want {
                    Logits::All => &mut out[wi * c * nv..(wi * c + m) * nv],
                    Logits::Last => &mut out[..],
                };
                let api = self.res.ops.api();
                api.stream_synchronize(&self.res.stream).map_err(gpu_err("GPU forward"))?;
                let mut bytes = vec![0u8; m * nv * 4];
                api.memcpy_dtoh(&mut bytes, s.sc.logits).map_err(gpu_err("reading logits"))?;
                for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                    *d = f32::from_le_bytes(b.try_into().expect("4 bytes"));
                }
            }
            s.n_past += win.len();
        }
        Ok(())
    }

    /// One window of up to MAX_COLS tokens at positions `s.n_past..`; logits of rows
    /// `first_row..` land in `s.sc.logits`. Token ids and positions go to device buffers
    /// first; the launches that follow read them there, so a decode window is captured once
    /// per shape and replayed ([`GpuOptions::graphs`]).
    fn window(
        &self,
        sess: &mut GpuSession,
        toks: &[u32],
        first_row: Option<usize>,
    ) -> std::result::Result<(), GpuError> {
        let api = self.res.ops.api();
        let st = &self.res.stream;
        let n = toks.len();
        let pos: Vec<u32> = (0..n).map(|i| (sess.n_past + i) as u32).collect();
        api.stream_synchronize(st)?;
        api.memcpy_htod(sess.sc.ids, u32_bytes(toks))?;
        api.memcpy_htod(sess.sc.pos, u32_bytes(&pos))?;
        // Routed experts on the host-readback path read the router's choice on the host,
        // tracing and profiling copy between parts: those windows run eagerly.
        let handoff = self.moe_by_handoff(n, sess.profile.is_some());
        if let (true, Some(h), Some(c)) = (handoff, &self.res.handoff, &self.res.expert_cache) {
            return h.run_window(
                &**api,
                st,
                c,
                n,
                || self.window_launches(sess, n, first_row, true),
                &|p| self.handoff_misses(p, n),
                |e| e,
            );
        }
        self.window_launches(sess, n, first_row, false)
    }

    /// The launches of a window as a graph (captured once per shape, then replayed) or eagerly.
    fn window_launches(
        &self,
        sess: &mut GpuSession,
        n: usize,
        first_row: Option<usize>,
        handoff: bool,
    ) -> std::result::Result<(), GpuError> {
        let (api, st) = (self.res.ops.api(), &self.res.stream);
        let capturable = self.res.opts.graphs
            && (self.model.hp.moe.is_none() || self.moe_on_device(n) || handoff)
            && sess.trace.is_none()
            && sess.profile.is_none();
        if !capturable {
            sess.eager_windows += 1;
            return self.launches(sess, n, first_row);
        }
        let key = (n, first_row.unwrap_or(usize::MAX));
        if let Some((_, g)) = sess.graphs.iter().find(|(k, _)| *k == key) {
            sess.graph_replays += 1;
            return api.launch_graph(g, st);
        }
        api.begin_capture(st)?;
        let recorded = self.launches(sess, n, first_row);
        let graph = api.end_capture(st);
        recorded?;
        let graph = graph?;
        api.launch_graph(&graph, st)?;
        sess.graphs.push((key, graph));
        sess.graph_replays += 1;
        Ok(())
    }
}
