//! [`GpuOps`]: the host launch layer of every gfx11 kernel over `Arc<dyn GpuApi>`, so the same
//! code drives the software device and HIP. Each method checks its shape, packs the kernel's
//! `#[repr(C)]` argument struct from `gpu-abi` and launches asynchronously on a stream; all
//! pointers are device addresses ([`DevicePtr`]), buffers f32 row-major unless stated.
//!
//! Numerics (what each op equals on the CPU; tests/gpu/gpu_ops.rs checks every line):
//! - bit-identical: quantize (quant's reference), dequant / get_rows (quant's dequantizers,
//!   times `scale`), rms_norm (`cpu_kernels::rms_norm`; [`GpuOps::rms_norm_ggml`]:
//!   `rms_norm_ggml`), rope (`rope_neox` / `rope_norm` with [`GpuOps::rope_table`];
//!   `rope_neox_ggml` with `fma` and [`GpuOps::rope_table_ggml`]), add_rows, scale, kv_store
//!   (cpu-executor/src/kv_cache.rs), attention in [`AttnMode::Ordered`]
//!   (`cpu::attention::attend_ordered`), moe_combine (adds in order j = 0..k);
//! - bit-identical by construction (ordered-numerics mode, the `quant` crate's scalar code per
//!   work-item): quantize_ref (`quant::quantize_row`), mmv_ordered
//!   (`cpu::matmul_ordered`), geglu_table (`cpu_kernels::geglu_ggml`);
//! - within named tolerances (`quant::fmath::expf` instead of libm): glu, softmax, moe_router
//!   weights (its expert ids are exact); mmvq (int8 dot products, see tests/gpu/gpu_kernels.rs).
mod gdn;
mod gr;
mod moe;
mod ple;
mod qsa;
pub use gdn::{GdnBuffers, GdnDeviceState, GdnShape};
pub use gr::GrShape;
pub use moe::SlotCols;
pub use ple::{PleBuffers, PleShape};
pub use qsa::{QsaBuffers, QsaIndexerShape, QsaShape};

use super::abi::{self, WType};
use super::device::{
    DevicePtr, GpuApi, GpuError, Kernel, KernelInfo, KernelSpec, LaunchConfig, Module, Result, Stream, arch_base,
};
use super::registry::{self, Family, KernelEntry, Scratch};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// Gated activation of [`GpuOps::glu`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GluAct {
    Silu,
    GeluTanh,
}

pub use crate::options::{AttnMode, MmqVariant};

/// KV cache format; layouts equal to cpu-executor/src/kv_cache.rs: rows `[cell][n_head_kv][head_dim]`
/// of f16, or of i8 with f32 scales `[cell][n_head_kv]` in a separate buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvFormat {
    F16,
    Int8,
}

/// Element type of a [`GpuOps::get_rows`] table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowType {
    W(WType),
    F32,
    F16,
}

/// Default largest attention window (cells) a launch supports: its scores live in LDS.
pub const DEFAULT_ATTN_MAX_KV: u32 = 8192;
/// Hard limit: `attn_lds_bytes(256, n)` must fit 64 KiB (the registry sizes the attention
/// kernels' LDS with it).
pub use super::registry::ATTN_MAX_KV_LIMIT;

/// What [`GpuApi::function`] checks a registry entry against.
pub fn kernel_spec(entry: &KernelEntry) -> KernelSpec<'static> {
    KernelSpec {
        name: entry.name,
        kernarg_bytes: entry.args.bytes,
        max_block: [entry.block, 1, 1],
        max_dynamic_lds: entry.max_dynamic_lds,
        allow_scratch: entry.scratch == Scratch::Allowed,
    }
}

/// The code object's explicit kernel arguments must be the entry's struct field by field (a
/// reordered or resized parameter with the same total size would otherwise pass).
pub fn check_arg_layout(entry: &KernelEntry, info: &KernelInfo) -> Result<()> {
    let declared: Vec<(u32, u32)> =
        info.args.iter().filter(|a| !a.value_kind.starts_with("hidden_")).map(|a| (a.offset, a.size)).collect();
    let expected: Vec<(u32, u32)> = entry.args.fields().collect();
    if declared != expected {
        return Err(GpuError::KernelCheck {
            kernel: entry.name.to_string(),
            what: format!("arguments (offset, size) {declared:?}, but abi::{} packs {expected:?}", entry.args.name),
        });
    }
    Ok(())
}

/// Every kernel of the registry for the device's arch, looked up and checked once, with their
/// launchers.
pub struct GpuOps {
    api: Arc<dyn GpuApi>,
    #[allow(dead_code)]
    module: Module,
    kernels: HashMap<&'static str, Loaded>,
    attn_max_kv: AtomicU32,
}

/// A checked kernel and the registry entry every launch of it follows (block, LDS bound).
struct Loaded {
    kernel: Kernel,
    entry: &'static KernelEntry,
}

fn bad(kernel: &str, what: impl Into<String>) -> GpuError {
    GpuError::Launch { kernel: kernel.to_string(), what: what.into() }
}

fn groups(items: u64, per: u32, kernel: &str) -> Result<u32> {
    let g = items.div_ceil(per as u64);
    if g == 0 || g > u32::MAX as u64 {
        return Err(bad(kernel, format!("{items} work items: empty or too many")));
    }
    Ok(g as u32)
}

impl GpuOps {
    /// Loads the code object for the device's arch and looks up every kernel of the registry
    /// for that arch, checking its metadata against the entry (`check_spec`: kernarg size,
    /// wave32, workgroup size, LDS, scratch; here: every explicit argument's offset and size
    /// equal to the entry's `#[repr(C)]` struct), so a mismatch is an error before any launch.
    pub fn new(api: Arc<dyn GpuApi>) -> Result<GpuOps> {
        let module = api.load_module()?;
        let arch = arch_base(&api.info().arch).to_string();
        let mut kernels = HashMap::new();
        for entry in registry::for_arch(&arch) {
            let kernel = api.function(&module, &kernel_spec(entry))?;
            check_arg_layout(entry, &kernel.info)?;
            kernels.insert(entry.name, Loaded { kernel, entry });
        }
        if kernels.is_empty() {
            return Err(GpuError::KernelCheck {
                kernel: "<registry>".into(),
                what: format!("no kernel of the registry is built for {arch}"),
            });
        }
        Ok(GpuOps { api, module, kernels, attn_max_kv: AtomicU32::new(DEFAULT_ATTN_MAX_KV) })
    }

    pub fn api(&self) -> &Arc<dyn GpuApi> {
        &self.api
    }

    /// The checked kernel `name` (metadata: registers, LDS, scratch).
    pub fn kernel(&self, name: &str) -> Option<&Kernel> {
        self.kernels.get(name).map(|l| &l.kernel)
    }

    /// Largest attention window (cells attended by one query) later launches support; it sizes
    /// their LDS (`4 * (head_dim + n)` bytes). At most [`ATTN_MAX_KV_LIMIT`]. A launch whose
    /// window is larger traps on the device (a kernel error), it never reads past its LDS.
    pub fn set_attn_max_kv(&self, n: u32) -> Result<()> {
        if n == 0 || n > ATTN_MAX_KV_LIMIT {
            return Err(bad("attention", format!("max_kv {n} outside 1..={ATTN_MAX_KV_LIMIT}")));
        }
        self.attn_max_kv.store(n, Ordering::Relaxed);
        Ok(())
    }
    pub fn attn_max_kv(&self) -> u32 {
        self.attn_max_kv.load(Ordering::Relaxed)
    }

    /// Launches `name` on a 1-D grid of `grid` workgroups with its registry entry's block.
    fn launch(&self, s: &Stream, name: &str, grid: u32, lds: u32, args: &[u8]) -> Result<()> {
        self.launch_grid(s, name, [grid, 1, 1], lds, args)
    }
    fn launch_grid(&self, s: &Stream, name: &str, grid: [u32; 3], lds: u32, args: &[u8]) -> Result<()> {
        let l = self.kernels.get(name).ok_or_else(|| GpuError::NoSuchKernel { kernel: name.to_string() })?;
        if lds > l.entry.max_dynamic_lds {
            return Err(bad(
                name,
                format!("{lds} bytes of dynamic LDS, the registry allows {}", l.entry.max_dynamic_lds),
            ));
        }
        let cfg = LaunchConfig { grid, block: [l.entry.block, 1, 1], dynamic_lds: lds };
        self.api.launch(s, &l.kernel, &cfg, args)
    }

    // ------------------------------------------------------------------ existing kernels

    /// f32 → Q8_1 (36-byte blocks of 32), byte-exact with quant; `n % 32 == 0` (columns back to back).
    pub fn quantize_q8_1(&self, s: &Stream, x: DevicePtr, y: DevicePtr, n: u32) -> Result<()> {
        let name = abi::QUANTIZE_Q8_1;
        if n == 0 || !n.is_multiple_of(abi::QK8_1) {
            return Err(bad(name, format!("n = {n} is not a positive multiple of 32")));
        }
        let g = groups((n / abi::QK8_1) as u64, abi::WG_SIZE, name)?;
        self.launch(s, name, g, 0, &abi::QuantizeArgs { x, y, n, _pad: 0 }.to_bytes())
    }

    /// f32 → Q8_K (292-byte blocks of 256), byte-exact; `n % 256 == 0`.
    pub fn quantize_q8_k(&self, s: &Stream, x: DevicePtr, y: DevicePtr, n: u32) -> Result<()> {
        let name = abi::QUANTIZE_Q8_K;
        if n == 0 || !n.is_multiple_of(abi::QK_K) {
            return Err(bad(name, format!("n = {n} is not a positive multiple of 256")));
        }
        let g = groups((n / abi::QK_K) as u64, abi::WAVES_PER_WG, name)?;
        self.launch(s, name, g, 0, &abi::QuantizeArgs { x, y, n, _pad: 0 }.to_bytes())
    }

    /// `nblocks` blocks of `ty` to f32 (or f16 when `f16`), bit-exact with quant.
    pub fn dequant(&self, s: &Stream, ty: WType, f16: bool, w: DevicePtr, y: DevicePtr, nblocks: u32) -> Result<()> {
        let name = abi::dequant_kernel(ty, f16).ok_or_else(|| bad("dequant", format!("no kernel for {ty:?}")))?;
        let g = groups(nblocks as u64, abi::WG_SIZE, name)?;
        self.launch(s, name, g, abi::dequant_lds_bytes(ty), &abi::DequantArgs { w, y, nblocks, _pad: 0 }.to_bytes())
    }

    /// `y[c * y_stride + i] = W[row(i)] · x[c]` for `ncols` (1..=8) Q8_1 columns (semantics of
    /// `abi::MmvqArgs`; `rows` = optional device list of `nrows` weight-row indices). Columns
    /// that do not fit the 64 KiB LDS together are split over launches.
    #[allow(clippy::too_many_arguments)]
    pub fn mmvq(
        &self,
        s: &Stream,
        ty: WType,
        ncols: u32,
        w: DevicePtr,
        x_q8_1: DevicePtr,
        y: DevicePtr,
        rows: Option<DevicePtr>,
        nrows: u32,
        k: u32,
        y_stride: u32,
    ) -> Result<()> {
        let name = abi::mmvq_kernel(ty, ncols.clamp(1, abi::MAX_COLS as u32)).unwrap_or("mmvq");
        if ncols == 0 || ncols as usize > abi::MAX_COLS {
            return Err(bad(name, format!("{ncols} columns (1..={})", abi::MAX_COLS)));
        }
        let bk = ty.block_k();
        if k == 0 || !k.is_multiple_of(bk) {
            return Err(bad(name, format!("k = {k} is not a positive multiple of {bk}")));
        }
        if nrows == 0 || y_stride < nrows {
            return Err(bad(name, format!("nrows {nrows}, y_stride {y_stride} (needs >= nrows)")));
        }
        let fit = (abi::MAX_LDS_BYTES - ty.table_lds_bytes()) / abi::act_col_bytes(k);
        if fit == 0 {
            return Err(bad(name, format!("k = {k}: one staged column does not fit in 64 KiB of LDS")));
        }
        let mut c0 = 0;
        while c0 < ncols {
            let nc = (ncols - c0).min(fit);
            let kname = abi::mmvq_kernel(ty, nc).unwrap_or(name);
            let rows_per_wg = abi::mmvq_rows_per_wg(ty, k, nrows, nc);
            let args = abi::MmvqArgs {
                w,
                x: x_q8_1 + (c0 as u64) * (k / 32 * abi::Q8_1_BYTES) as u64,
                y: y + (c0 as u64) * y_stride as u64 * 4,
                rows: rows.unwrap_or(0),
                nrows,
                k,
                y_stride,
                rows_per_wg,
            };
            let g = groups(nrows as u64, rows_per_wg, kname)?;
            self.launch(s, kname, g, abi::mmvq_lds_bytes(ty, k, nc), &args.to_bytes())?;
            c0 += nc;
        }
        Ok(())
    }

    /// Fused gate/up projection and GLU in one launch: `y[c * y_stride + i] =
    /// act(Wg[row(i)] · x[c]) * (Wu[row(i)] · x[c])`, `wg`/`wu` of the same shape and type, other
    /// arguments as [`GpuOps::mmvq`] (1..=8 columns, launched in groups of at most
    /// `abi::MAX_GLU_COLS`). Bit-identical to `mmvq(wg)`, `mmvq(wu)` then [`GpuOps::glu`].
    #[allow(clippy::too_many_arguments)]
    pub fn mmvq_glu(
        &self,
        s: &Stream,
        ty: WType,
        ncols: u32,
        wg: DevicePtr,
        wu: DevicePtr,
        x_q8_1: DevicePtr,
        y: DevicePtr,
        rows: Option<DevicePtr>,
        nrows: u32,
        k: u32,
        y_stride: u32,
        act: GluAct,
    ) -> Result<()> {
        let name = abi::mmvq_glu_kernel(ty, ncols.clamp(1, abi::MAX_GLU_COLS)).unwrap_or("mmvq_glu");
        if ncols == 0 || ncols as usize > abi::MAX_COLS {
            return Err(bad(name, format!("{ncols} columns (1..={})", abi::MAX_COLS)));
        }
        let bk = ty.block_k();
        if k == 0 || !k.is_multiple_of(bk) {
            return Err(bad(name, format!("k = {k} is not a positive multiple of {bk}")));
        }
        if nrows == 0 || y_stride < nrows {
            return Err(bad(name, format!("nrows {nrows}, y_stride {y_stride} (needs >= nrows)")));
        }
        let fit = (abi::MAX_LDS_BYTES - ty.table_lds_bytes()) / abi::act_col_bytes(k);
        if fit == 0 {
            return Err(bad(name, format!("k = {k}: one staged column does not fit in 64 KiB of LDS")));
        }
        // The single-column geometry (the fused kernel was tuned and tested with it).
        let rows_per_wg = abi::mmvq_rows_per_wg(ty, k, nrows, 1);
        let mut c0 = 0;
        while c0 < ncols {
            let nc = (ncols - c0).min(fit).min(abi::MAX_GLU_COLS);
            let kname = abi::mmvq_glu_kernel(ty, nc).unwrap_or(name);
            let args = abi::MmvqGluArgs {
                wg,
                wu,
                x: x_q8_1 + (c0 as u64) * (k / 32 * abi::Q8_1_BYTES) as u64,
                y: y + (c0 as u64) * y_stride as u64 * 4,
                rows: rows.unwrap_or(0),
                nrows,
                k,
                y_stride,
                rows_per_wg,
                act: (act == GluAct::GeluTanh) as u32,
                _pad: 0,
            };
            let g = groups(nrows as u64, rows_per_wg, kname)?;
            self.launch(s, kname, g, abi::mmvq_lds_bytes(ty, k, nc), &args.to_bytes())?;
            c0 += nc;
        }
        Ok(())
    }

    /// Prefill matmul: `y[c * y_stride + i] = W[i] · x[c]` for `ncols` Q8_1 activation columns
    /// (e.g. from [`GpuOps::quantize_q8_1`]) and `nrows` weight rows of `k` (a multiple of the
    /// type's block size), for Q8_0, Q4_K, Q6_K and IQ3_XXS weights. Tiles of 256 rows x 64
    /// columns staged in LDS; `variant` picks int8 WMMA or `v_dot4_i32_iu8`, which give
    /// bit-identical results (semantics and accumulation order: `abi::MmqArgs`).
    #[allow(clippy::too_many_arguments)]
    pub fn mmq(
        &self,
        s: &Stream,
        ty: WType,
        variant: MmqVariant,
        w: DevicePtr,
        x_q8_1: DevicePtr,
        y: DevicePtr,
        nrows: u32,
        ncols: u32,
        k: u32,
        y_stride: u32,
    ) -> Result<()> {
        let name = abi::mmq_kernel(ty, variant == MmqVariant::Dot4)
            .ok_or_else(|| bad("mmq", format!("no MMQ kernel for {ty:?}")))?;
        let bk = ty.block_k();
        if k == 0 || !k.is_multiple_of(bk) || nrows == 0 || ncols == 0 || y_stride < nrows {
            return Err(bad(
                name,
                format!(
                    "k {k} (positive multiple of {bk}), nrows {nrows}, ncols {ncols} (both > 0), y_stride {y_stride} (>= nrows)"
                ),
            ));
        }
        let tiles = nrows.div_ceil(abi::MMQ_ROWS) as u64 * ncols.div_ceil(abi::MMQ_COLS) as u64;
        let g = groups(tiles, 1, name)?;
        let args = abi::MmqArgs { w, x: x_q8_1, y, nrows, ncols, k, y_stride };
        self.launch(s, name, g, abi::mmq_lds_bytes(ty), &args.to_bytes())
    }

    // ------------------------------------------------------------------ forward-pass ops

    /// Per row of `n`: `y = x / sqrt(mean(x²) + eps) * w`, bit-identical to
    /// `cpu_kernels::rms_norm`. `y` may equal `x`.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        s: &Stream,
        x: DevicePtr,
        w: DevicePtr,
        y: DevicePtr,
        n: u32,
        n_rows: u32,
        eps: f32,
    ) -> Result<()> {
        self.rms_norm_impl(s, x, w, y, n, n_rows, eps, false)
    }
    /// As [`GpuOps::rms_norm`], bit-identical to `cpu_kernels::rms_norm_ggml` (llama.cpp's order:
    /// one sequential chain per row, slower).
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_ggml(
        &self,
        s: &Stream,
        x: DevicePtr,
        w: DevicePtr,
        y: DevicePtr,
        n: u32,
        n_rows: u32,
        eps: f32,
    ) -> Result<()> {
        self.rms_norm_impl(s, x, w, y, n, n_rows, eps, true)
    }
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_impl(
        &self,
        s: &Stream,
        x: DevicePtr,
        w: DevicePtr,
        y: DevicePtr,
        n: u32,
        n_rows: u32,
        eps: f32,
        ggml: bool,
    ) -> Result<()> {
        let name = abi::RMS_NORM;
        if n == 0 {
            return Err(bad(name, "n = 0"));
        }
        let g = groups(n_rows as u64, abi::WAVES_PER_WG, name)?;
        let a = abi::RmsNormArgs { x, w, y, n, n_rows, eps_bits: eps.to_bits(), ggml: ggml as u32 };
        self.launch(s, name, g, 0, &a.to_bytes())
    }

    /// RoPE in place on `x = [n_tokens][n_heads][head_dim]`, token `t` at position `pos[t]`
    /// (device u32), angles from `table` ([`GpuOps::rope_table`] / [`GpuOps::rope_table_ggml`]
    /// with the same `rope_dim`, uploaded, covering every position). `rope_dim` is even and
    /// <= head_dim. `fma == true` rotates as `rope_neox_ggml`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        s: &Stream,
        x: DevicePtr,
        pos: DevicePtr,
        table: DevicePtr,
        n_tokens: u32,
        n_heads: u32,
        head_dim: u32,
        rope_dim: u32,
        neox: bool,
        fma: bool,
    ) -> Result<()> {
        let name = abi::ROPE;
        if rope_dim == 0 || !rope_dim.is_multiple_of(2) || rope_dim > head_dim {
            return Err(bad(name, format!("rope_dim {rope_dim} must be even and in 2..=head_dim ({head_dim})")));
        }
        let g = groups(
            n_tokens as u64 * n_heads.div_ceil(abi::ROPE_HEADS) as u64 * (rope_dim / 2) as u64,
            abi::WG_SIZE,
            name,
        )?;
        let a =
            abi::RopeArgs { x, pos, table, n_tokens, n_heads, head_dim, rope_dim, neox: neox as u32, fma: fma as u32 };
        self.launch(s, name, g, 0, &a.to_bytes())
    }

    /// `[pos][rope_dim/2]` (cos, sin) pairs exactly as `cpu_kernels::rope_neox` / `rope_norm`
    /// compute them: `theta = pos * freq_scale * freq_base^(-2i/rope_dim)` in f64, rounded.
    pub fn rope_table(freq_base: f32, freq_scale: f32, rope_dim: usize, n_pos: usize) -> Vec<f32> {
        let half = rope_dim / 2;
        let mut t = Vec::with_capacity(n_pos * half * 2);
        for pos in 0..n_pos {
            for i in 0..half {
                let inv = (freq_base as f64).powf(-2.0 * i as f64 / rope_dim as f64);
                let theta = pos as f64 * freq_scale as f64 * inv;
                t.push(theta.cos() as f32);
                t.push(theta.sin() as f32);
            }
        }
        t
    }

    /// The table of `cpu_kernels::rope_neox_ggml`: f32 recurrence `theta *= base^(-2/rope_dim)`,
    /// `cosf`/`sinf` of `freq_scale * theta`.
    pub fn rope_table_ggml(freq_base: f32, freq_scale: f32, rope_dim: usize, n_pos: usize) -> Vec<f32> {
        let half = rope_dim / 2;
        let theta_scale = freq_base.powf(-2.0 / rope_dim as f32);
        let mut t = Vec::with_capacity(n_pos * half * 2);
        for pos in 0..n_pos {
            let mut theta = pos as f32;
            for _ in 0..half {
                let a = freq_scale * theta;
                t.push(a.cos());
                t.push(a.sin());
                theta *= theta_scale;
            }
        }
        t
    }

    /// `out[i] = act(gate[i]) * up[i]` (`quant::fmath` SiLU / GELU-tanh).
    pub fn glu(&self, s: &Stream, gate: DevicePtr, up: DevicePtr, out: DevicePtr, n: u32, act: GluAct) -> Result<()> {
        let name = abi::GLU;
        let g = groups(n as u64, abi::WG_SIZE, name)?;
        let a = abi::GluArgs { gate, up, out, n, act: (act == GluAct::GeluTanh) as u32 };
        self.launch(s, name, g, 0, &a.to_bytes())
    }

    // ------------------------------------------------------------------ ordered-numerics mode

    /// `n` f32 (columns back to back) to the activation type `ty` (Q8_0, Q8_1, Q8_K, F16,
    /// BF16 or F32) with `quant`'s reference quantizer: byte-identical to `quant::quantize_row`.
    pub fn quantize_ref(&self, s: &Stream, ty: quant::GgmlType, x: DevicePtr, y: DevicePtr, n: u32) -> Result<()> {
        use quant::GgmlType as G;
        let name = abi::QUANTIZE_REF;
        if !matches!(ty, G::Q8_0 | G::Q8_1 | G::Q8K | G::F16 | G::BF16 | G::F32) {
            return Err(bad(name, format!("{} is not an activation type", ty.name())));
        }
        let qk = ty.block_size() as u32;
        if n == 0 || !n.is_multiple_of(qk) {
            return Err(bad(name, format!("n = {n} is not a positive multiple of {qk} ({})", ty.name())));
        }
        let g = groups((n / qk) as u64, abi::WG_SIZE, name)?;
        self.launch(s, name, g, 0, &abi::QuantizeRefArgs { x, y, n, ty: ty as u32 }.to_bytes())
    }

    /// `y[c * nrows + r] = quant::vec_dot(ty, k, W[r], a[c])` for `ncols` activation columns
    /// `a` of `ty.vec_dot_type()` (from [`GpuOps::quantize_ref`]): bit-identical to the CPU's
    /// ordered matmul (one work-item per output, the scalar reference dot).
    #[allow(clippy::too_many_arguments)]
    pub fn mmv_ordered(
        &self,
        s: &Stream,
        ty: quant::GgmlType,
        w: DevicePtr,
        a: DevicePtr,
        y: DevicePtr,
        nrows: u32,
        ncols: u32,
        k: u32,
    ) -> Result<()> {
        let name = abi::MMV_ORDERED;
        if !ty.has_reference()
            || ty.row_bytes(k as usize).is_none()
            || ty.vec_dot_type().row_bytes(k as usize).is_none()
        {
            return Err(bad(name, format!("no reference dot for {} rows of {k}", ty.name())));
        }
        let g = groups(nrows as u64 * ncols as u64, abi::WG_SIZE, name)?;
        self.launch(s, name, g, 0, &abi::MmvOrderedArgs { w, a, y, nrows, ncols, k, ty: ty as u32 }.to_bytes())
    }

    /// `out = geglu_ggml(gate, up)` with the f16 GELU table (`cpu_kernels::gelu_f16_table`,
    /// 65536 f32) at `table`: bit-identical to `cpu_kernels::geglu_ggml`.
    pub fn geglu_table(
        &self,
        s: &Stream,
        gate: DevicePtr,
        up: DevicePtr,
        out: DevicePtr,
        table: DevicePtr,
        n: u32,
    ) -> Result<()> {
        let name = abi::GEGLU_TABLE;
        let g = groups(n as u64, abi::WG_SIZE, name)?;
        self.launch(s, name, g, 0, &abi::GegluTableArgs { gate, up, out, table, n, _pad: 0 }.to_bytes())
    }

    /// `x[r*n+i] += b[r*b_stride+i]` (residual add; `b_stride = 0` broadcasts one row).
    pub fn add_rows(&self, s: &Stream, x: DevicePtr, b: DevicePtr, n: u32, n_rows: u32, b_stride: u32) -> Result<()> {
        let name = abi::ADD_ROWS;
        let g = groups(n as u64 * n_rows as u64, abi::WG_SIZE, name)?;
        self.launch(s, name, g, 0, &abi::AddRowsArgs { x, b, n, n_rows, b_stride, _pad: 0 }.to_bytes())
    }

    /// `x[i] *= factor`.
    pub fn scale(&self, s: &Stream, x: DevicePtr, n: u32, factor: f32) -> Result<()> {
        let name = abi::SCALE;
        let g = groups(n as u64, abi::WG_SIZE, name)?;
        self.launch(s, name, g, 0, &abi::ScaleArgs { x, n, factor_bits: factor.to_bits() }.to_bytes())
    }

    /// `y[i] = f16(x[i])` for `n` values (round to nearest even, as `quant::f32_to_f16`).
    pub fn convert_f32_f16(&self, s: &Stream, x: DevicePtr, y: DevicePtr, n: u32) -> Result<()> {
        let name = abi::CONVERT_F32_F16;
        let g = groups(n as u64, abi::WG_SIZE, name)?;
        self.launch(s, name, g, 0, &abi::ConvertArgs { x, y, n, _pad: 0 }.to_bytes())
    }

    /// `y[i] = bf16(x[i])` for `n` values (round to nearest even, as `quant::f32_to_bf16`).
    pub fn convert_f32_bf16(&self, s: &Stream, x: DevicePtr, y: DevicePtr, n: u32) -> Result<()> {
        let name = abi::CONVERT_F32_BF16;
        let g = groups(n as u64, abi::WG_SIZE, name)?;
        self.launch(s, name, g, 0, &abi::ConvertArgs { x, y, n, _pad: 0 }.to_bytes())
    }

    /// Softmax of each of `n_rows` rows of `n`, in place.
    pub fn softmax(&self, s: &Stream, x: DevicePtr, n: u32, n_rows: u32) -> Result<()> {
        let name = abi::SOFTMAX;
        if n == 0 {
            return Err(bad(name, "n = 0"));
        }
        let g = groups(n_rows as u64, abi::WAVES_PER_WG, name)?;
        self.launch(s, name, g, 0, &abi::SoftmaxArgs { x, n, n_rows }.to_bytes())
    }

    /// Each of `n_rows` rows of `logits` (`n_vocab` f32): its greedy token and softmax
    /// probability into `out` (2 u32 a row: the token, p's bits).
    pub fn logits_top(&self, s: &Stream, logits: DevicePtr, out: DevicePtr, n_vocab: u32, n_rows: u32) -> Result<()> {
        let name = abi::LOGITS_TOP;
        if n_vocab == 0 {
            return Err(bad(name, "n_vocab = 0"));
        }
        let g = groups(n_rows as u64, abi::WAVES_PER_WG, name)?;
        self.launch(s, name, g, 0, &abi::LogitsTopArgs { logits, out, n_vocab, n_rows }.to_bytes())
    }

    /// `out[i][..k] = dequant(table row ids[i]) * scale` (no multiply when scale == 1.0);
    /// `ids` = `n_ids` device u32. Quantized rows: `k % block_k == 0`.
    #[allow(clippy::too_many_arguments)]
    pub fn get_rows(
        &self,
        s: &Stream,
        ty: RowType,
        table: DevicePtr,
        ids: DevicePtr,
        n_ids: u32,
        k: u32,
        out: DevicePtr,
        scale: f32,
    ) -> Result<()> {
        let a = abi::GetRowsArgs { table, ids, out, n_ids, k, scale_bits: scale.to_bits(), _pad: 0 };
        match ty {
            RowType::W(wt) => {
                let name = abi::get_rows_kernel(wt).ok_or_else(|| bad("get_rows", format!("no kernel for {wt:?}")))?;
                if k == 0 || !k.is_multiple_of(wt.block_k()) {
                    return Err(bad(name, format!("k = {k} is not a positive multiple of {}", wt.block_k())));
                }
                let g = groups(n_ids as u64 * (k / wt.block_k()) as u64, abi::WG_SIZE, name)?;
                self.launch(s, name, g, 0, &a.to_bytes())
            }
            RowType::F32 | RowType::F16 => {
                let name = if ty == RowType::F32 { abi::GET_ROWS_F32 } else { abi::GET_ROWS_F16 };
                let g = groups(n_ids as u64 * k as u64, abi::WG_SIZE, name)?;
                self.launch(s, name, g, 0, &a.to_bytes())
            }
        }
    }

    /// Stores `src = [n_tokens][n_head_kv * head_dim]` f32 into row `pos[t]` of one cache
    /// tensor (K or V) in cpu-executor/src/kv_cache.rs's layout and rounding (bitwise equal);
    /// `cache_scale` = the int8 scales `[cell][n_head_kv]` (0 for f16). head_dim <= 256.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_store(
        &self,
        s: &Stream,
        fmt: KvFormat,
        src: DevicePtr,
        cache: DevicePtr,
        cache_scale: DevicePtr,
        pos: DevicePtr,
        n_tokens: u32,
        n_head_kv: u32,
        head_dim: u32,
    ) -> Result<()> {
        let name = if fmt == KvFormat::F16 { abi::KV_STORE_F16 } else { abi::KV_STORE_I8 };
        if head_dim == 0 || head_dim > 256 {
            return Err(bad(name, format!("head_dim {head_dim} (1..=256)")));
        }
        if fmt == KvFormat::Int8 && cache_scale == 0 {
            return Err(bad(name, "int8 cache without a scale buffer"));
        }
        let g = groups(n_tokens as u64 * n_head_kv as u64, abi::WAVES_PER_WG, name)?;
        let a = abi::KvStoreArgs { src, cache, scale: cache_scale, pos, n_tokens, n_head_kv, head_dim, _pad: 0 };
        self.launch(s, name, g, 0, &a.to_bytes())
    }

    /// Causal attention: token `t` (query row `q[t]`, position `pos[t]`) attends to cells
    /// `lo..=pos[t]`, `lo = pos + 1 - window` when `window > 0` and that is positive, else 0;
    /// `out[t][h] = softmax(kq_scale * q·K) · V` per head, GQA (`n_head % n_head_kv == 0`).
    /// head_dim ∈ {16, 32, 64, 128, 256}; Ordered: windows up to [`GpuOps::attn_max_kv`] cells
    /// (Fast: any length).
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        s: &Stream,
        mode: AttnMode,
        fmt: KvFormat,
        q: DevicePtr,
        k_cache: DevicePtr,
        k_scale: DevicePtr,
        v_cache: DevicePtr,
        v_scale: DevicePtr,
        out: DevicePtr,
        pos: DevicePtr,
        n_tokens: u32,
        n_head: u32,
        n_head_kv: u32,
        head_dim: u32,
        window: u32,
        kq_scale: f32,
    ) -> Result<()> {
        let int8 = fmt == KvFormat::Int8;
        let name = abi::attn_kernel(int8, head_dim)
            .ok_or_else(|| bad("attention", format!("head_dim {head_dim} (supported: {:?})", abi::ATTN_HEAD_DIMS)))?;
        if n_head == 0 || n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) {
            return Err(bad(name, format!("n_head {n_head} is not a multiple of n_head_kv {n_head_kv}")));
        }
        if int8 && (k_scale == 0 || v_scale == 0) {
            return Err(bad(name, "int8 cache without scale buffers"));
        }
        let max_kv = self.attn_max_kv();
        let fast = abi::attn_fast_kernel(int8, head_dim).unwrap_or(name);
        let g = if mode == AttnMode::Fast {
            let rows = n_tokens as u64 * (n_head / n_head_kv) as u64;
            groups(rows.div_ceil(16) * n_head_kv as u64, 1, fast)?
        } else {
            groups(n_tokens as u64 * n_head as u64, 1, name)?
        };
        let a = abi::AttnArgs {
            q,
            k: k_cache,
            k_scale,
            v: v_cache,
            v_scale,
            out,
            pos,
            n_tokens,
            n_head,
            n_head_kv,
            window,
            kq_scale_bits: kq_scale.to_bits(),
            max_kv,
        };
        if mode == AttnMode::Fast {
            return self.launch(s, fast, g, abi::attn_fast_lds_bytes(head_dim), &a.to_bytes());
        }
        self.launch(s, name, g, abi::attn_lds_bytes(head_dim, max_kv), &a.to_bytes())
    }

    // ------------------------------------------------------------------ micro-benchmarks

    /// Cross-lane reduction benchmark `name` (an `abi::REDUCE_KERNELS` symbol, semantics of
    /// `abi::ReduceArgs`): `n_waves` waves, `reps` sums per value.
    pub fn reduce_bench(
        &self,
        s: &Stream,
        name: &str,
        x: DevicePtr,
        y: DevicePtr,
        n_waves: u32,
        reps: u32,
    ) -> Result<()> {
        if registry::find(name).map(|e| e.family) != Some(Family::Reduce) {
            return Err(bad(name, "not a reduction benchmark kernel"));
        }
        let g = groups(n_waves as u64, abi::WAVES_PER_WG, name)?;
        self.launch(s, name, g, 0, &abi::ReduceArgs { x, y, n_waves, reps }.to_bytes())
    }
}
