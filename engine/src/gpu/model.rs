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
//! `model::attention::attend_ordered` (tests/gpu_model.rs checks layers and greedy tokens).
//! The ordered-numerics mode ([`GpuOptions::ordered`]) removes the other differences: with the
//! CPU's `Session::ordered`, every layer and the logits are bit-identical
//! (tests/gpu_model_ordered.rs).

use std::sync::Arc;

use super::abi::{MAX_COLS, WType};
use super::device::{DType, DevicePtr, Gemm, GpuApi, GpuError, Stream, Transpose};
use super::ops::{AttnMode, GluAct, GpuOps, KvFormat, RowType};
pub use crate::gpu_options::{GEMM_MIN_TOKENS, GpuOptions, MoePath, PrefillPath};
use crate::error::{EngineError, Result};
use crate::kv_cache::KvType;
use crate::model::forward::{Logits, ggml_exact};
use crate::model::{Act, Ffn, LayerKind, Model, RopeKind, W};
use quant::GgmlType;

fn gpu_err(what: &str) -> impl FnOnce(GpuError) -> EngineError + '_ {
    move |e| EngineError::Gpu(format!("{what}: {e}"))
}

/// How a weight matrix runs on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MatKind {
    /// Quantized blocks, MMVQ against Q8_1 activations.
    Q(WType),
    /// f32 rows (dequantized at upload when the file type has no MMVQ kernel), GEMM.
    F32,
    /// f16 rows as stored; activations are converted to f16 for the GEMM (as ggml does).
    F16,
    /// bf16 rows as stored; activations are converted to bf16 for the GEMM (as ggml does).
    BF16,
    /// Bytes as stored in the file, of type [`DevMat::ty`], for the ordered-numerics mode
    /// ([`GpuOptions::ordered`]): `quantize_ref` + `mmv_ordered`, whatever the type.
    Raw,
}

/// Per-session temporaries a projection may need.
#[derive(Clone, Copy)]
struct Tmp {
    /// f16 copy of one layer matrix (dequantize + GEMM prefill path; 0: not available).
    wdq: DevicePtr,
    /// f16 / bf16 copy of the activations (f16 and bf16 GEMMs).
    xh: DevicePtr,
}

/// A weight matrix (or expert stack) in device memory.
#[derive(Clone, Copy, Debug)]
struct DevMat {
    ptr: DevicePtr,
    kind: MatKind,
    rows: usize,
    cols: usize,
    /// Bytes of one matrix of a stack.
    mat_bytes: usize,
    /// Element type of the bytes at `ptr` (F32 for matrices widened at upload).
    ty: GgmlType,
}

impl DevMat {
    fn expert(&self, e: usize) -> DevicePtr {
        self.ptr + (e * self.mat_bytes) as u64
    }
}

struct DevAttn {
    norm: DevicePtr,
    wq: DevMat,
    wk: DevMat,
    wv: DevMat,
    wo: DevMat,
    bq: Option<DevicePtr>,
    bk: Option<DevicePtr>,
    bv: Option<DevicePtr>,
    q_norm: Option<DevicePtr>,
    k_norm: Option<DevicePtr>,
    post_norm: Option<DevicePtr>,
}

enum DevFfn {
    Dense { gate: DevMat, up: DevMat, down: DevMat },
    Moe { router: DevMat, gate: DevMat, up: DevMat, down: DevMat },
}

struct DevLayer {
    attn: DevAttn,
    norm: DevicePtr,
    ffn: DevFfn,
    post_norm: Option<DevicePtr>,
    /// Index into the session's rope tables.
    rope_table: usize,
    window: u32,
}

/// A model resident on a device.
pub struct GpuModel {
    pub model: Model,
    ops: GpuOps,
    opts: GpuOptions,
    stream: Stream,
    tok_embd: (DevicePtr, RowType),
    output: DevMat,
    output_norm: DevicePtr,
    layers: Vec<DevLayer>,
    /// Distinct (rope base, rope scale) pairs; sessions build one cos/sin table per entry.
    rope_params: Vec<(f32, f32)>,
    allocs: Vec<DevicePtr>,
    /// Bytes of weights uploaded.
    pub weight_bytes: usize,
    /// f32 bytes of the largest quantized layer matrix (the GEMM path's scratch).
    dequant_scratch_bytes: usize,
    /// hipBLASLt calibration table (`--calibration`), consulted by `gemm`; None: hipBLAS only.
    lt: Option<super::calibrate::LtDispatch>,
    /// Ordered mode: activations quantized for `mmv_ordered` (room for [`MAX_COLS`] columns
    /// of the widest input as f32; windows are at most that wide) and the f16 GELU table
    /// (Gemma); 0 otherwise.
    xo: DevicePtr,
    gelu_table: DevicePtr,
    /// Every MoE layer's expert gate/up/down matrices have an MMVQ type (device dispatch possible).
    moe_quantized: bool,
}

/// Per-sequence device state: KV cache, rope tables, scratch.
pub struct GpuSession {
    pub n_past: usize,
    pub capacity: usize,
    /// Most tokens one forward call takes (a window, or a prompt chunk on the GEMM path).
    pub chunk: usize,
    kv: Vec<[DevicePtr; 4]>,
    fmt: KvFormat,
    rope_tables: Vec<DevicePtr>,
    sc: Scratch,
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
    pub launches_instructions: u64,
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

impl Drop for GpuModel {
    fn drop(&mut self) {
        let api = self.ops.api().clone();
        for p in self.allocs.drain(..) {
            let _ = api.free(p);
        }
    }
}

/// Device scratch sized for one window of [`MAX_COLS`] tokens.
struct Scratch {
    ids: DevicePtr,
    pos: DevicePtr,
    x: DevicePtr,
    xn: DevicePtr,
    q: DevicePtr,
    k: DevicePtr,
    v: DevicePtr,
    att: DevicePtr,
    o: DevicePtr,
    gate: DevicePtr,
    up: DevicePtr,
    act: DevicePtr,
    /// Q8_1 activations of up to MAX_COLS columns of the widest input.
    xq: DevicePtr,
    logits: DevicePtr,
    // MoE
    router: DevicePtr,
    sel_ids: DevicePtr,
    sel_w: DevicePtr,
    map: DevicePtr,
    /// Q8_1 activations gathered per expert.
    xq_e: DevicePtr,
    /// Expert outputs, one row of n_embd per (token, slot).
    y_e: DevicePtr,
    /// The identity slot map `0..chunk * k` (device dispatch: slot s's output is row s of y_e).
    map_id: DevicePtr,
    /// f16 copy of one layer matrix (dequantize + GEMM prefill path; 0 when unused).
    wdq: DevicePtr,
    /// f16 activations for f16 GEMMs.
    xh: DevicePtr,
}

fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding or invalid bit patterns; the slice covers exactly its bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
fn u32_bytes(v: &[u32]) -> &[u8] {
    // SAFETY: as for f32.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn wtype(ty: GgmlType) -> Option<WType> {
    WType::from_ggml_id(ty as u32)
}

/// Bytes of Q8_1 activations for `n` values.
fn q8_1_bytes(n: usize) -> usize {
    n / 32 * 36
}

impl GpuModel {
    /// Uploads `model` to the device behind `api`.
    pub fn new(model: Model, api: Arc<dyn GpuApi>, opts: GpuOptions) -> Result<GpuModel> {
        // The ordered mode's attention is the ordered kernel, whatever `attn` says.
        let opts = if opts.ordered { GpuOptions { attn: AttnMode::Ordered, ..opts } } else { opts };
        let ops = GpuOps::new(api.clone()).map_err(gpu_err("loading the gfx11 kernels"))?;
        let stream = api.stream_create().map_err(gpu_err("creating a stream"))?;
        let mut up = Uploader { api: &*api, allocs: Vec::new(), bytes: 0, ordered: opts.ordered };
        let hp = &model.hp;
        for (what, n) in [("n_embd", hp.n_embd), ("n_head * head_dim", hp.n_head * hp.head_dim)] {
            if n % 32 != 0 {
                return Err(EngineError::Unsupported(format!(
                    "GPU backend: {what} = {n} is not a multiple of 32 (Q8_1 activation blocks)"
                )));
            }
        }
        let tok_embd = {
            let w = &model.tok_embd;
            let data = model.gguf.tensor_data(&model.gguf.tensors()[w.tensor]);
            let ty = match w.ty {
                GgmlType::F32 => RowType::F32,
                GgmlType::F16 => RowType::F16,
                t => match wtype(t) {
                    Some(wt) => RowType::W(wt),
                    None => RowType::F32,
                },
            };
            let ptr = if ty == RowType::F32 && w.ty != GgmlType::F32 {
                up.f32s(&dequant_all(&model, w, "token_embd.weight")?)?
            } else {
                up.bytes(data)?
            };
            (ptr, ty)
        };
        let output = up.mat(&model, &model.output, "output.weight")?;
        let output_norm = up.f32s(&model.output_norm)?;
        let mut rope_params: Vec<(f32, f32)> = Vec::new();
        let mut layers = Vec::with_capacity(model.layers.len());
        for (il, lw) in model.layers.iter().enumerate() {
            let LayerKind::Attention(spec) = &hp.layers[il];
            let key = (spec.rope_base, spec.rope_scale);
            let rope_table = match rope_params.iter().position(|&p| p == key) {
                Some(i) => i,
                None => {
                    rope_params.push(key);
                    rope_params.len() - 1
                }
            };
            let a = &lw.attn;
            let name = |s: &str| format!("blk.{il}.{s}");
            let attn = DevAttn {
                norm: up.f32s(&a.norm)?,
                wq: up.mat(&model, &a.wq, &name("attn_q.weight"))?,
                wk: up.mat(&model, &a.wk, &name("attn_k.weight"))?,
                wv: up.mat(&model, &a.wv, &name("attn_v.weight"))?,
                wo: up.mat(&model, &a.wo, &name("attn_output.weight"))?,
                bq: up.opt(&a.bq)?,
                bk: up.opt(&a.bk)?,
                bv: up.opt(&a.bv)?,
                q_norm: up.opt(&a.q_norm)?,
                k_norm: up.opt(&a.k_norm)?,
                post_norm: up.opt(&a.post_norm)?,
            };
            let f = &lw.ffn;
            let ffn = match &f.ffn {
                Ffn::Dense { gate, up: u, down } => DevFfn::Dense {
                    gate: up.mat(&model, gate, &name("ffn_gate.weight"))?,
                    up: up.mat(&model, u, &name("ffn_up.weight"))?,
                    down: up.mat(&model, down, &name("ffn_down.weight"))?,
                },
                Ffn::Moe { router, gate, up: u, down } => DevFfn::Moe {
                    router: up.mat(&model, router, &name("ffn_gate_inp.weight"))?,
                    gate: up.mat(&model, gate, &name("ffn_gate_exps.weight"))?,
                    up: up.mat(&model, u, &name("ffn_up_exps.weight"))?,
                    down: up.mat(&model, down, &name("ffn_down_exps.weight"))?,
                },
            };
            layers.push(DevLayer {
                attn,
                norm: up.f32s(&f.norm)?,
                ffn,
                post_norm: up.opt(&f.post_norm)?,
                rope_table,
                window: spec.window.map_or(0, |w| w as u32),
            });
        }
        let (mut xo, mut gelu_table) = (0, 0);
        if opts.ordered {
            let ff = hp.moe.as_ref().map_or(hp.n_ff, |m| m.n_ff_exp.max(hp.n_ff));
            let widest = hp.n_embd.max(hp.n_head * hp.head_dim).max(ff);
            xo = up.zeroed(MAX_COLS * widest * 4)?;
            if ggml_exact(hp) && hp.act == Act::GeluTanh {
                gelu_table = up.f32s(cpu_kernels::gelu_f16_table())?;
            }
        }
        let (allocs, weight_bytes) = (up.allocs, up.bytes);
        let layer_mats = layers.iter().flat_map(|l: &DevLayer| {
            let a = &l.attn;
            let mut v = vec![a.wq, a.wk, a.wv, a.wo];
            if let DevFfn::Dense { gate, up, down } = &l.ffn {
                v.extend([*gate, *up, *down]);
            }
            v
        });
        let dequant_scratch_bytes =
            layer_mats.filter(|m| matches!(m.kind, MatKind::Q(_))).map(|m| m.rows * m.cols * 4).max().unwrap_or(0);
        let moe_quantized = layers.iter().all(|l| match &l.ffn {
            DevFfn::Moe { gate, up, down, .. } => [gate, up, down].iter().all(|m| matches!(m.kind, MatKind::Q(_))),
            DevFfn::Dense { .. } => true,
        });
        Ok(GpuModel {
            model,
            ops,
            opts,
            stream,
            tok_embd,
            output,
            output_norm,
            layers,
            rope_params,
            allocs,
            weight_bytes,
            dequant_scratch_bytes,
            lt: None,
            xo,
            gelu_table,
            moe_quantized,
        })
    }

    /// Routes dense GEMMs whose shape has a row in `table` through hipBLASLt (calibrate.rs);
    /// the others stay on hipBLAS. `source` names the table in messages.
    pub fn set_calibration(&mut self, table: super::calibrate::CalibrationTable, source: std::path::PathBuf) -> Result<()> {
        let api = self.ops.api().clone();
        let ws = super::calibrate::LtDispatch::workspace_needed(&table);
        let p = if ws > 0 { api.malloc(ws).map_err(gpu_err("hipBLASLt workspace"))? } else { 0 };
        if p != 0 {
            self.allocs.push(p);
        }
        self.lt = Some(super::calibrate::LtDispatch::new(table, source, p, ws));
        Ok(())
    }

    /// The calibration table in use, if any.
    pub fn calibration(&self) -> Option<&super::calibrate::LtDispatch> {
        self.lt.as_ref()
    }

    pub fn api(&self) -> &Arc<dyn GpuApi> {
        self.ops.api()
    }

    pub fn n_vocab(&self) -> usize {
        self.model.n_vocab
    }

    /// Tokens per forward call for a `--prefill` chunk: longer than a window only when the
    /// dequantize + GEMM path may run (see [`PrefillPath`]).
    fn chunk_cols(&self, prefill_chunk: usize) -> usize {
        if self.opts.ordered {
            return MAX_COLS; // the ordered kernels gain nothing from longer chunks
        }
        match self.opts.prefill {
            PrefillPath::Mmvq => MAX_COLS,
            PrefillPath::Auto | PrefillPath::DequantGemm | PrefillPath::Mmq => prefill_chunk.max(MAX_COLS),
        }
    }

    /// A fresh sequence with room for `max_ctx` positions.
    /// `prefill_chunk`: tokens per prompt chunk (`--prefill`); scratch is sized for it.
    pub fn new_session(&self, kv: KvType, max_ctx: usize, prefill_chunk: usize) -> Result<GpuSession> {
        let api = self.ops.api().clone();
        let hp = &self.model.hp;
        if max_ctx > super::ops::ATTN_MAX_KV_LIMIT as usize {
            return Err(EngineError::Unsupported(format!(
                "GPU attention keeps at most {} cells per query in LDS: use --max-context {} or less",
                super::ops::ATTN_MAX_KV_LIMIT,
                super::ops::ATTN_MAX_KV_LIMIT
            )));
        }
        if max_ctx as u32 > self.ops.attn_max_kv() {
            self.ops.set_attn_max_kv(max_ctx as u32).map_err(gpu_err("attention window"))?;
        }
        let mut up = Uploader { api: &*api, allocs: Vec::new(), bytes: 0, ordered: self.opts.ordered };
        let fmt = match kv {
            KvType::F16 => KvFormat::F16,
            KvType::Int8 => KvFormat::Int8,
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
        let exact = ggml_exact(hp);
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
            // Gathered expert inputs: Q8_1 columns, or f32 rows for dequantized experts.
            xq_e: up.zeroed(c * k_used * ff.max(d).next_multiple_of(32) * 4)?,
            y_e: up.zeroed(f(c * k_used * d))?,
            map_id: up.bytes(u32_bytes(&(0..(c * k_used) as u32).collect::<Vec<u32>>()))?,
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
            allocs: up.allocs,
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
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= nv) {
            return Err(EngineError::BadToken { id, vocab: nv });
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
            self.window(s, win, first_row).map_err(gpu_err("GPU forward"))?;
            if let Some(first) = first_row {
                let m = win.len() - first;
                let dst = match want {
                    Logits::All => &mut out[wi * c * nv..(wi * c + m) * nv],
                    Logits::Last => &mut out[..],
                };
                let api = self.ops.api();
                api.stream_synchronize(&self.stream).map_err(gpu_err("GPU forward"))?;
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

    /// `y[n][rows] = x[n][cols] · Wᵀ` for expert `e`; `xq` must hold `x`'s Q8_1 quantization
    /// when `w` is quantized (the caller quantizes once per input).
    #[allow(clippy::too_many_arguments)]
    fn matmul(&self, w: &DevMat, e: usize, x: DevicePtr, xq: DevicePtr, n: usize, y: DevicePtr, tmp: Tmp) -> std::result::Result<(), GpuError> {
        let s = &self.stream;
        if self.opts.ordered {
            return self.matmul_ordered(w, e, x, n, y);
        }
        let ty = match w.kind {
            MatKind::Raw => {
                return Err(GpuError::Launch { kernel: "matmul".into(), what: "raw weights outside the ordered mode".into() });
            }
            MatKind::F32 => return self.gemm(w.expert(e), DType::F32, w, x, n, y),
            MatKind::F16 => {
                self.ops.convert_f32_f16(s, x, tmp.xh, (n * w.cols) as u32)?;
                return self.gemm(w.expert(e), DType::F16, w, tmp.xh, n, y);
            }
            MatKind::BF16 => {
                self.ops.convert_f32_bf16(s, x, tmp.xh, (n * w.cols) as u32)?;
                return self.gemm(w.expert(e), DType::BF16, w, tmp.xh, n, y);
            }
            MatKind::Q(ty) => ty,
        };
        let gemm = match self.opts.prefill {
            PrefillPath::Mmvq => false,
            PrefillPath::Auto => n >= GEMM_MIN_TOKENS,
            PrefillPath::DequantGemm => n > 1,
            PrefillPath::Mmq if n >= GEMM_MIN_TOKENS && super::abi::mmq_kernel(ty, false).is_some() => {
                let (rows, cols) = (w.rows as u32, w.cols as u32);
                return self.ops.mmq(s, ty, self.opts.mmq, w.expert(e), xq, y, rows, n as u32, cols, rows);
            }
            PrefillPath::Mmq => n >= GEMM_MIN_TOKENS,
        };
        if gemm && tmp.wdq != 0 && w.rows * w.cols * 4 <= self.dequant_scratch_bytes {
            // Dequantize to f16, activations to f16, one GEMM with f32 accumulation.
            let nblocks = (w.rows * w.cols / ty.block_k() as usize) as u32;
            self.ops.dequant(s, ty, true, w.expert(e), tmp.wdq, nblocks)?;
            self.ops.convert_f32_f16(s, x, tmp.xh, (n * w.cols) as u32)?;
            return self.gemm(tmp.wdq, DType::F16, w, tmp.xh, n, y);
        }
        // MMVQ, 8 columns per launch.
        let xb = q8_1_bytes(w.cols) as u64;
        for c0 in (0..n).step_by(MAX_COLS) {
            let nc = (n - c0).min(MAX_COLS);
            let (xc, yc) = (xq + c0 as u64 * xb, y + (c0 * w.rows * 4) as u64);
            self.ops.mmvq(s, ty, nc as u32, w.expert(e), xc, yc, None, w.rows as u32, w.cols as u32, w.rows as u32)?;
        }
        Ok(())
    }

    /// Ordered mode: `x` (f32, `n <= MAX_COLS` columns) quantized to the weight type's
    /// `vec_dot_type` by `quantize_ref`, then `mmv_ordered`: the CPU's ordered matmul bit for bit.
    fn matmul_ordered(&self, w: &DevMat, e: usize, x: DevicePtr, n: usize, y: DevicePtr) -> std::result::Result<(), GpuError> {
        let s = &self.stream;
        if n > MAX_COLS || self.xo == 0 {
            return Err(GpuError::Launch { kernel: "mmv_ordered".into(), what: format!("{n} columns (at most {MAX_COLS} in ordered mode)") });
        }
        let at = w.ty.vec_dot_type();
        let a = if at == GgmlType::F32 {
            x
        } else {
            self.ops.quantize_ref(s, at, x, self.xo, (n * w.cols) as u32)?;
            self.xo
        };
        self.ops.mmv_ordered(s, w.ty, w.expert(e), a, y, w.rows as u32, n as u32, w.cols as u32)
    }

    /// `y[n][rows] = x[n][cols] · Aᵀ` with `a` and `x` of type `t` shaped like `w`, f32 output
    /// and accumulation (hipBLASLt by the calibration table, else hipBLAS / the host GEMM).
    fn gemm(&self, a: DevicePtr, t: DType, w: &DevMat, x: DevicePtr, n: usize, y: DevicePtr) -> std::result::Result<(), GpuError> {
        self.gemm_dispatch(
            &self.stream,
            &Gemm {
                trans_a: Transpose::T,
                trans_b: Transpose::N,
                m: w.rows,
                n,
                k: w.cols,
                alpha: 1.0,
                a,
                a_type: t,
                lda: w.cols,
                stride_a: 0,
                b: x,
                b_type: t,
                ldb: w.cols,
                stride_b: 0,
                beta: 0.0,
                c: y,
                c_type: DType::F32,
                ldc: w.rows,
                stride_c: 0,
                batch: 1,
                compute: super::device::ComputeType::F32,
            },
        )
    }

    /// hipBLASLt when the calibration table has a row for this shape (calibrate.rs), else
    /// hipBLAS (`GpuApi::gemm`).
    fn gemm_dispatch(&self, stream: &Stream, g: &Gemm) -> std::result::Result<(), GpuError> {
        if let Some(lt) = &self.lt
            && lt.try_gemm(&**self.ops.api(), stream, g)
        {
            return Ok(());
        }
        self.ops.api().gemm(stream, g)
    }

    /// Quantizes `n` rows of `k` f32 values at `x` to Q8_1 at `xq` when `k` allows it.
    /// Nothing in ordered mode (each matmul quantizes for its weight type).
    fn quantize(&self, x: DevicePtr, xq: DevicePtr, n: usize, k: usize) -> std::result::Result<(), GpuError> {
        if self.opts.ordered {
            return Ok(());
        }
        if k % 32 == 0 { self.ops.quantize_q8_1(&self.stream, x, xq, (n * k) as u32) } else { Ok(()) }
    }

    /// One window of up to MAX_COLS tokens at positions `s.n_past..`; logits of rows
    /// `first_row..` land in `s.sc.logits`. Token ids and positions go to device buffers
    /// first; the launches that follow read them there, so a decode window is captured once
    /// per shape and replayed ([`GpuOptions::graphs`]).
    fn window(&self, sess: &mut GpuSession, toks: &[u32], first_row: Option<usize>) -> std::result::Result<(), GpuError> {
        let api = self.ops.api();
        let st = &self.stream;
        let n = toks.len();
        let pos: Vec<u32> = (0..n).map(|i| (sess.n_past + i) as u32).collect();
        api.stream_synchronize(st)?;
        api.memcpy_htod(sess.sc.ids, u32_bytes(toks))?;
        api.memcpy_htod(sess.sc.pos, u32_bytes(&pos))?;
        // Routed experts on the host-readback path read the router's choice on the host,
        // tracing and profiling copy between parts: those windows run eagerly.
        let capturable = self.opts.graphs
            && (self.model.hp.moe.is_none() || self.moe_on_device(n))
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

    /// Adds the device counters since the last call to `part` (profiling only).
    fn count(&self, sess: &mut GpuSession, part: &'static str, ideal: u64) {
        if let Some(p) = sess.profile.as_mut() {
            let s = self.ops.api().take_stats().unwrap_or_default();
            let e = p.parts.entry(part).or_default();
            e.launches_instructions += s.instructions;
            e.global_bytes += s.global_bytes_read + s.global_bytes_written;
            e.ideal_bytes += ideal;
        }
    }

    /// Every launch of one window (inputs already in `ids`/`pos`).
    fn launches(&self, sess: &mut GpuSession, n: usize, first_row: Option<usize>) -> std::result::Result<(), GpuError> {
        let hp = &self.model.hp;
        let api = self.ops.api();
        let st = &self.stream;
        let ops = &self.ops;
        let (d, hd, nh, nkv) = (hp.n_embd, hp.head_dim, hp.n_head, hp.n_head_kv);
        let (nq, nk) = (nh * hd, nkv * hd);
        let eps = hp.rms_eps;
        let exact = ggml_exact(hp);
        // The exact (llama.cpp-order) norm where the CPU backend uses it.
        let rms_norm = |x, w, y, n: usize, rows: usize| {
            if exact { ops.rms_norm_ggml(st, x, w, y, n as u32, rows as u32, eps) } else { ops.rms_norm(st, x, w, y, n as u32, rows as u32, eps) }
        };
        let sc = &sess.sc;
        let (ids, posb) = (sc.ids, sc.pos);
        let [x, xn, q, k, v, att, o, gate, up, act, xq, logits] =
            [sc.x, sc.xn, sc.q, sc.k, sc.v, sc.att, sc.o, sc.gate, sc.up, sc.act, sc.xq, sc.logits];
        let tmp = Tmp { wdq: sc.wdq, xh: sc.xh };
        let act_bytes = (n * d * 4) as u64;
        if sess.profile.is_some() {
            let _ = api.take_stats();
            sess.profile.as_mut().expect("checked").tokens += n as u64;
        }

        let (emb, ety) = self.tok_embd;
        ops.get_rows(st, ety, emb, ids, n as u32, d as u32, x, hp.embd_scale.unwrap_or(1.0))?;
        let row_bytes = match ety {
            RowType::W(t) => d / t.block_k() as usize * t.block_bytes() as usize,
            RowType::F16 => d * 2,
            RowType::F32 => d * 4,
        };
        self.count(sess, "embed", (n * row_bytes) as u64 + act_bytes);
        let mut trace = sess.trace.take();
        if let Some(t) = trace.as_mut() {
            t.clear();
        }
        let kv_elem = match sess.fmt {
            KvFormat::F16 => 2.0,
            KvFormat::Int8 => 1.0 + 4.0 / hd as f64,
        };
        for (il, l) in self.layers.iter().enumerate() {
            let a = &l.attn;
            rms_norm(x, a.norm, xn, d, n)?;
            self.quantize(xn, xq, n, d)?;
            self.matmul(&a.wq, 0, xn, xq, n, q, tmp)?;
            self.matmul(&a.wk, 0, xn, xq, n, k, tmp)?;
            self.matmul(&a.wv, 0, xn, xq, n, v, tmp)?;
            for (buf, b, w) in [(q, a.bq, nq), (k, a.bk, nk), (v, a.bv, nk)] {
                if let Some(b) = b {
                    ops.add_rows(st, buf, b, w as u32, n as u32, 0)?;
                }
            }
            for (buf, norm, heads) in [(q, a.q_norm, nh), (k, a.k_norm, nkv)] {
                if let Some(norm) = norm {
                    rms_norm(buf, norm, buf, hd, n * heads)?;
                }
            }
            let table = sess.rope_tables[l.rope_table];
            let neox = hp.rope == RopeKind::Neox;
            let rd = hp.rope_dim.min(hd) as u32;
            ops.rope(st, q, posb, table, n as u32, nh as u32, hd as u32, rd, neox, exact && neox)?;
            ops.rope(st, k, posb, table, n as u32, nkv as u32, hd as u32, rd, neox, exact && neox)?;
            if hp.q_scale != 1.0 {
                ops.scale(st, q, (n * nq) as u32, hp.q_scale)?;
            }
            let [kc, ks, vc, vs] = sess.kv[il];
            ops.kv_store(st, sess.fmt, k, kc, ks, posb, n as u32, nkv as u32, hd as u32)?;
            ops.kv_store(st, sess.fmt, v, vc, vs, posb, n as u32, nkv as u32, hd as u32)?;
            ops.attention(
                st, self.opts.attn, sess.fmt, q, kc, ks, vc, vs, att, posb, n as u32, nh as u32, nkv as u32, hd as u32,
                l.window, hp.kq_scale,
            )?;
            self.quantize(att, xq, n, nq)?;
            self.matmul(&a.wo, 0, att, xq, n, o, tmp)?;
            if let Some(p) = a.post_norm {
                rms_norm(o, p, o, d, n)?;
            }
            ops.add_rows(st, x, o, d as u32, n as u32, d as u32)?;
            if sess.profile.is_some() {
                // Cells read: each token attends to its window (the cache holds n_past + n).
                let cells: usize = (0..n)
                    .map(|i| {
                        let p = sess.n_past + i + 1;
                        if l.window > 0 { p.min(l.window as usize) } else { p }
                    })
                    .sum();
                let kv = (cells as f64 * 2.0 * nk as f64 * kv_elem) as u64 + (n as f64 * 2.0 * nk as f64 * kv_elem) as u64;
                let w = [&a.wq, &a.wk, &a.wv, &a.wo].iter().map(|m| m.mat_bytes as u64).sum::<u64>();
                self.count(sess, "attention", w + kv + 2 * act_bytes);
            }

            rms_norm(x, l.norm, xn, d, n)?;
            self.quantize(xn, xq, n, d)?;
            let (part, w_bytes) = match &l.ffn {
                DevFfn::Dense { gate: wg, up: wu, down: wd } => {
                    let ff = wg.rows;
                    let g = match hp.act {
                        Act::Silu => GluAct::Silu,
                        Act::GeluTanh => GluAct::GeluTanh,
                    };
                    match (wg.kind, wu.kind) {
                        // Decode / verify windows: gate, up and the activation in one launch.
                        (MatKind::Q(tg), MatKind::Q(tu)) if tg == tu && self.opts.fused_glu && n <= MAX_COLS => {
                            ops.mmvq_glu(st, tg, n as u32, wg.ptr, wu.ptr, xq, act, None, ff as u32, d as u32, ff as u32, g)?;
                        }
                        // Ordered mode, Gemma: the CPU's f16 GELU table.
                        _ if self.gelu_table != 0 && g == GluAct::GeluTanh => {
                            self.matmul(wg, 0, xn, xq, n, gate, tmp)?;
                            self.matmul(wu, 0, xn, xq, n, up, tmp)?;
                            ops.geglu_table(st, gate, up, act, self.gelu_table, (n * ff) as u32)?;
                        }
                        _ => {
                            self.matmul(wg, 0, xn, xq, n, gate, tmp)?;
                            self.matmul(wu, 0, xn, xq, n, up, tmp)?;
                            ops.glu(st, gate, up, act, (n * ff) as u32, g)?;
                        }
                    }
                    self.quantize(act, xq, n, ff)?;
                    self.matmul(wd, 0, act, xq, n, o, tmp)?;
                    ("ffn", (wg.mat_bytes + wu.mat_bytes + wd.mat_bytes) as u64)
                }
                DevFfn::Moe { router, gate: wg, up: wu, down: wd } => {
                    let experts = if self.moe_on_device(n) {
                        self.moe_device(&sess.sc, n, [router, wg, wu, wd], sess.profile.is_some())?
                    } else {
                        self.moe(&sess.sc, n, [router, wg, wu, wd])?
                    };
                    ("moe", (router.mat_bytes + experts * (wg.mat_bytes + wu.mat_bytes + wd.mat_bytes)) as u64)
                }
            };
            if let Some(p) = l.post_norm {
                rms_norm(o, p, o, d, n)?;
            }
            ops.add_rows(st, x, o, d as u32, n as u32, d as u32)?;
            self.count(sess, part, w_bytes + 2 * act_bytes);
            if let Some(t) = trace.as_mut() {
                api.stream_synchronize(st)?;
                let mut b = vec![0u8; n * d * 4];
                api.memcpy_dtoh(&mut b, x)?;
                t.push(b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4"))).collect());
            }
        }
        sess.trace = trace;

        if let Some(first) = first_row {
            let m = n - first;
            let xf = x + (first * d * 4) as u64;
            rms_norm(xf, self.output_norm, xn, d, m)?;
            self.quantize(xn, xq, m, d)?;
            self.matmul(&self.output, 0, xn, xq, m, logits, Tmp { wdq: 0, ..tmp })?;
            self.count(sess, "head", (self.output.mat_bytes + m * d * 4 + m * self.model.n_vocab * 4) as u64);
        }
        Ok(())
    }

    /// Whether a window of `n` tokens runs its routed experts by device dispatch
    /// ([`MoePath`]'s rule). The single switch between the two paths: a mode that needs the
    /// host-readback path (e.g. ordered numerics) makes this false.
    fn moe_on_device(&self, n: usize) -> bool {
        // Ordered mode keeps the host path: it runs every expert through `matmul` (ordered).
        !self.opts.ordered
            && self.moe_quantized
            && match self.opts.moe {
                MoePath::Host => false,
                MoePath::Device => true,
                MoePath::Auto => n <= MAX_COLS,
            }
    }

    /// Routed experts by device dispatch for `n` tokens whose normed input is in `sc.xn` /
    /// `sc.xq`; output in `sc.o`. The router's choice stays on the device: `mmvq_moe_*` reads
    /// it (fused gate/up + SiLU when both have one type, then down), `moe_combine` adds the
    /// slots through the identity map in rank order, exactly as [`GpuModel::moe`] does. With
    /// `count` (profiling) the choice is read back afterwards to count the distinct experts
    /// (the return value); otherwise 0.
    fn moe_device(&self, sc: &Scratch, n: usize, [router, gate, up, down]: [&DevMat; 4], count: bool) -> std::result::Result<usize, GpuError> {
        let hp = &self.model.hp;
        let spec = hp.moe.as_ref().expect("moe layer without moe hparams");
        let (api, ops, st) = (self.ops.api(), &self.ops, &self.stream);
        let (d, ne, k, ff) = (hp.n_embd, spec.n_expert, spec.n_expert_used, spec.n_ff_exp);
        let (MatKind::Q(tg), MatKind::Q(tu), MatKind::Q(td)) = (gate.kind, up.kind, down.kind) else {
            return Err(GpuError::Launch { kernel: "moe".into(), what: "device dispatch needs quantized experts".into() });
        };
        self.matmul(router, 0, sc.xn, sc.xq, n, sc.router, Tmp { wdq: 0, xh: sc.xh })?;
        ops.moe_router(st, sc.router, sc.sel_ids, sc.sel_w, n as u32, ne as u32, k as u32, spec.norm_weights)?;
        let (xb, ab) = (q8_1_bytes(d) as u64, q8_1_bytes(ff) as u64);
        // Groups of up to MAX_COLS tokens: at most 64 slots per launch.
        for t0 in (0..n).step_by(MAX_COLS) {
            let nt = (n - t0).min(MAX_COLS);
            let (s0, ns) = (t0 * k, (nt * k) as u32);
            let ids = sc.sel_ids + (s0 * 4) as u64;
            let xq = sc.xq + t0 as u64 * xb;
            let act = sc.act + (s0 * ff * 4) as u64;
            let g = nt as u32; // slots of one expert: at most one per token
            if tg == tu && self.opts.fused_glu {
                let glu = Some((up.ptr, GluAct::Silu));
                ops.mmvq_moe(st, tg, glu, gate.ptr, gate.mat_bytes as u64, ne as u32, xq, k as u32, ids, ns, act, ff as u32, d as u32, g)?;
            } else {
                let (yg, yu) = (sc.gate + (s0 * ff * 4) as u64, sc.up + (s0 * ff * 4) as u64);
                ops.mmvq_moe(st, tg, None, gate.ptr, gate.mat_bytes as u64, ne as u32, xq, k as u32, ids, ns, yg, ff as u32, d as u32, g)?;
                ops.mmvq_moe(st, tu, None, up.ptr, up.mat_bytes as u64, ne as u32, xq, k as u32, ids, ns, yu, ff as u32, d as u32, g)?;
                ops.glu(st, yg, yu, act, ns * ff as u32, GluAct::Silu)?;
            }
            let aq = sc.xq_e + s0 as u64 * ab;
            self.quantize(act, aq, nt * k, ff)?;
            let y = sc.y_e + (s0 * d * 4) as u64;
            ops.mmvq_moe(st, td, None, down.ptr, down.mat_bytes as u64, ne as u32, aq, 1, ids, ns, y, d as u32, ff as u32, g)?;
        }
        ops.moe_combine(st, sc.y_e, sc.map_id, sc.sel_w, sc.o, d as u32, n as u32, k as u32)?;
        if !count {
            return Ok(0);
        }
        api.stream_synchronize(st)?;
        let mut b = vec![0u8; n * k * 4];
        api.memcpy_dtoh(&mut b, sc.sel_ids)?;
        let mut sel: Vec<u32> = b.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).collect();
        sel.sort_unstable();
        sel.dedup();
        Ok(sel.len())
    }

    /// Routed experts for `n` tokens whose normed input is in `sc.xn` (and `sc.xq`); output
    /// in `sc.o`. Returns how many distinct experts ran. Host readback path ([`MoePath`]).
    fn moe(&self, sc: &Scratch, n: usize, [router, gate, up, down]: [&DevMat; 4]) -> std::result::Result<usize, GpuError> {
        let hp = &self.model.hp;
        let spec = hp.moe.as_ref().expect("moe layer without moe hparams");
        let (api, ops, st) = (self.ops.api(), &self.ops, &self.stream);
        let (d, ne, k, ff) = (hp.n_embd, spec.n_expert, spec.n_expert_used, spec.n_ff_exp);
        self.matmul(router, 0, sc.xn, sc.xq, n, sc.router, Tmp { wdq: 0, xh: sc.xh })?;
        ops.moe_router(st, sc.router, sc.sel_ids, sc.sel_w, n as u32, ne as u32, k as u32, spec.norm_weights)?;
        // The choice comes back to the host: which experts run, on which tokens.
        api.stream_synchronize(st)?;
        let mut b = vec![0u8; n * k * 4];
        api.memcpy_dtoh(&mut b, sc.sel_ids)?;
        let sel: Vec<u32> = b.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).collect();
        if let Some(&bad) = sel.iter().find(|&&e| e as usize >= ne) {
            return Err(GpuError::Launch { kernel: "moe_router".into(), what: format!("selected expert {bad} of {ne}") });
        }
        let quantized = matches!(gate.kind, MatKind::Q(_)); // false in ordered mode (Raw)
        if gate.kind != up.kind {
            return Err(GpuError::Launch { kernel: "moe".into(), what: "expert gate and up weights of different kinds".into() });
        }
        let (xcol, xbytes) = if quantized { (sc.xq, q8_1_bytes(d)) } else { (sc.xn, d * 4) };
        let mut map = vec![0u32; n * k];
        let mut row = 0usize; // next free row of y_e
        let mut ran = 0;
        for e in 0..ne {
            let slots: Vec<usize> = (0..n * k).filter(|&j| sel[j] as usize == e).collect();
            if slots.is_empty() {
                continue;
            }
            ran += 1;
            // Gather the inputs of the tokens that chose `e`, then run in windows of MAX_COLS.
            for group in slots.chunks(MAX_COLS) {
                let r = group.len();
                for (c, &j) in group.iter().enumerate() {
                    let t = j / k;
                    api.memcpy_dtod_async(st, sc.xq_e + (c * xbytes) as u64, xcol + (t * xbytes) as u64, xbytes)?;
                }
                let (xin, xinq) = if quantized { (0, sc.xq_e) } else { (sc.xq_e, 0) };
                self.matmul(gate, e, xin, xinq, r, sc.gate, Tmp { wdq: 0, xh: sc.xh })?;
                self.matmul(up, e, xin, xinq, r, sc.up, Tmp { wdq: 0, xh: sc.xh })?;
                ops.glu(st, sc.gate, sc.up, sc.act, (r * ff) as u32, GluAct::Silu)?;
                let dq = sc.xq_e; // reuse: the gathered inputs are consumed
                let quant_down = matches!(down.kind, MatKind::Q(_));
                if quant_down {
                    self.quantize(sc.act, dq, r, ff)?;
                }
                let yrow = sc.y_e + (row * d * 4) as u64;
                self.matmul(down, e, sc.act, dq, r, yrow, Tmp { wdq: 0, xh: sc.xh })?;
                for (c, &j) in group.iter().enumerate() {
                    map[j] = (row + c) as u32;
                }
                row += r;
            }
        }
        api.memcpy_htod(sc.map, u32_bytes(&map))?;
        ops.moe_combine(st, sc.y_e, sc.map, sc.sel_w, sc.o, d as u32, n as u32, k as u32)?;
        Ok(ran)
    }
}

fn dequant_all(model: &Model, w: &W, name: &str) -> Result<Vec<f32>> {
    let mut out = vec![0f32; w.rows * w.cols * w.n_mat];
    // A stack's matrices are contiguous, so the whole tensor dequantizes as one row.
    let all = model.gguf.tensor_data(&model.gguf.tensors()[w.tensor]);
    quant::dequantize_row(w.ty, all, &mut out).map_err(|e| EngineError::TensorType {
        name: format!("{name} ({e:?})"),
        ty: w.ty.name(),
        why: "cannot dequantize for the GPU",
    })?;
    Ok(out)
}

/// Allocates and fills device buffers, remembering them for release.
struct Uploader<'a> {
    api: &'a dyn GpuApi,
    allocs: Vec<DevicePtr>,
    bytes: usize,
    /// Ordered mode: matrices stay as stored ([`MatKind::Raw`]).
    ordered: bool,
}

impl Uploader<'_> {
    fn bytes(&mut self, data: &[u8]) -> Result<DevicePtr> {
        let p = self.zeroed(data.len())?;
        self.api.memcpy_htod(p, data).map_err(gpu_err("uploading weights"))?;
        Ok(p)
    }
    fn zeroed(&mut self, n: usize) -> Result<DevicePtr> {
        let p = self.api.malloc(n.max(16)).map_err(gpu_err("device allocation"))?;
        self.allocs.push(p);
        self.bytes += n;
        self.api.memset(p, 0, n.max(16)).map_err(gpu_err("device memset"))?;
        Ok(p)
    }
    fn f32s(&mut self, v: &[f32]) -> Result<DevicePtr> {
        self.bytes(f32_bytes(v))
    }
    fn opt(&mut self, v: &Option<Vec<f32>>) -> Result<Option<DevicePtr>> {
        v.as_ref().map(|v| self.f32s(v)).transpose()
    }
    fn mat(&mut self, model: &Model, w: &W, name: &str) -> Result<DevMat> {
        let all = model.gguf.tensor_data(&model.gguf.tensors()[w.tensor]);
        if self.ordered {
            if !w.ty.has_reference() || w.ty.row_bytes(w.cols).is_none() {
                return Err(EngineError::TensorType { name: name.to_string(), ty: w.ty.name(), why: "has no reference dot product for the ordered GPU mode" });
            }
            let ptr = self.bytes(all)?;
            return Ok(DevMat { ptr, kind: MatKind::Raw, rows: w.rows, cols: w.cols, mat_bytes: all.len() / w.n_mat, ty: w.ty });
        }
        match wtype(w.ty) {
            Some(ty) if w.cols % ty.block_k() as usize == 0 => {
                let ptr = self.bytes(all)?;
                Ok(DevMat { ptr, kind: MatKind::Q(ty), rows: w.rows, cols: w.cols, mat_bytes: all.len() / w.n_mat, ty: w.ty })
            }
            _ if matches!(w.ty, GgmlType::F16 | GgmlType::BF16) => {
                let ptr = self.bytes(all)?;
                let kind = if w.ty == GgmlType::F16 { MatKind::F16 } else { MatKind::BF16 };
                Ok(DevMat { ptr, kind, rows: w.rows, cols: w.cols, mat_bytes: w.rows * w.cols * 2, ty: w.ty })
            }
            _ => {
                let f = dequant_all(model, w, name)?;
                let ptr = self.f32s(&f)?;
                Ok(DevMat { ptr, kind: MatKind::F32, rows: w.rows, cols: w.cols, mat_bytes: w.rows * w.cols * 4, ty: GgmlType::F32 })
            }
        }
    }
}
