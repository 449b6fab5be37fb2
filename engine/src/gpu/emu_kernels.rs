//! Launch wrappers for the gfx11 kernels on the software RDNA3 device (`emulator`).
//!
//! [`EmuKernels`] loads the embedded gfx1100 code object, validates every kernel of
//! `abi.rs` at load time (present, wave32, kernarg layout equal to the `#[repr(C)]` argument
//! struct, no scratch in the MMVQ/quantize kernels), and offers two levels:
//! - `launch_*` on device pointers: argument packing and grid math only (what a HIP backend
//!   does with `hipModuleLaunchKernel`);
//! - `quantize_q8_1`, `quantize_q8_k`, `dequant_f32/f16`, `mmvq` on host slices: allocate,
//!   copy, launch, copy back, free; they return the results and the launch's `LaunchStats`.
use super::abi::{self, DequantArgs, MmvqArgs, QuantizeArgs, WType};
use super::code_objects::code_object_for;
use emulator::{Device, DevicePtr, EmuError, Function, KernelInfo, LaunchStats};
use std::collections::HashMap;

/// Errors of the GPU kernel layer; each names the kernel and what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum GpuKernelError {
    #[error("no {0} code object in this build (set KERNEL_GFX when building with --features gpu)")]
    NoCodeObject(String),
    #[error("kernel {kernel}: {source}")]
    Emu {
        kernel: String,
        #[source]
        source: EmuError,
    },
    #[error("kernel {kernel}: code object does not match abi.rs: {what}")]
    Abi { kernel: String, what: String },
    #[error("kernel {kernel}: bad shape: {what}")]
    Shape { kernel: String, what: String },
}

type Result<T> = std::result::Result<T, GpuKernelError>;

fn emu(kernel: &str) -> impl FnOnce(EmuError) -> GpuKernelError + '_ {
    move |source| GpuKernelError::Emu { kernel: kernel.to_string(), source }
}
fn shape(kernel: &str, what: String) -> GpuKernelError {
    GpuKernelError::Shape { kernel: kernel.to_string(), what }
}

/// Which activation quantizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActQuant {
    Q8_1,
    Q8K,
}

/// The kernels of one code object, loaded on one software device.
pub struct EmuKernels {
    dev: Device,
    funcs: HashMap<&'static str, Function>,
}

/// A device allocation freed on drop (errors on free are ignored: the device outlives it).
struct DevBuf<'a> {
    dev: &'a Device,
    ptr: DevicePtr,
}
impl<'a> DevBuf<'a> {
    fn new(dev: &'a Device, bytes: usize, kernel: &str) -> Result<Self> {
        let ptr = dev.malloc(bytes.max(16)).map_err(emu(kernel))?;
        if ptr % 16 != 0 {
            return Err(shape(kernel, format!("device allocation {ptr:#x} is not 16-byte aligned")));
        }
        Ok(DevBuf { dev, ptr })
    }
    fn with(dev: &'a Device, bytes: &[u8], kernel: &str) -> Result<Self> {
        let b = Self::new(dev, bytes.len(), kernel)?;
        dev.memcpy_htod(b.ptr, bytes).map_err(emu(kernel))?;
        Ok(b)
    }
    fn read(&self, n: usize, kernel: &str) -> Result<Vec<u8>> {
        let mut v = vec![0u8; n];
        self.dev.memcpy_dtoh(&mut v, self.ptr).map_err(emu(kernel))?;
        Ok(v)
    }
}
impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        let _ = self.dev.free(self.ptr);
    }
}

/// `(offset, size)` of every field of the argument struct, in order.
fn expected_layout(name: &str) -> (usize, &'static [(u32, u32)]) {
    const MMVQ: &[(u32, u32)] = &[(0, 8), (8, 8), (16, 8), (24, 8), (32, 4), (36, 4), (40, 4), (44, 4)];
    const TWO_PTRS_TWO_U32: &[(u32, u32)] = &[(0, 8), (8, 8), (16, 4), (20, 4)];
    if name.starts_with("mmvq_") {
        (MmvqArgs::SIZE, MMVQ)
    } else if name.starts_with("dequant_") {
        (DequantArgs::SIZE, TWO_PTRS_TWO_U32)
    } else {
        (QuantizeArgs::SIZE, TWO_PTRS_TWO_U32)
    }
}

/// Checks one kernel's metadata against `abi.rs`.
fn validate(info: &KernelInfo) -> std::result::Result<(), String> {
    let (size, fields) = expected_layout(&info.name);
    let explicit: Vec<(u32, u32)> =
        info.args.iter().filter(|a| !a.value_kind.starts_with("hidden_")).map(|a| (a.offset, a.size)).collect();
    if explicit != fields {
        return Err(format!("kernel arguments {explicit:?}, abi.rs expects {fields:?}"));
    }
    if (info.kernarg_size as usize) < size {
        return Err(format!("kernarg segment {} bytes < {size}", info.kernarg_size));
    }
    if info.wavefront_size != 32 {
        return Err(format!("wavefront size {} (kernels assume wave32)", info.wavefront_size));
    }
    if info.max_flat_workgroup_size != 0 && info.max_flat_workgroup_size < abi::WG_SIZE {
        return Err(format!("max workgroup size {} < {}", info.max_flat_workgroup_size, abi::WG_SIZE));
    }
    if info.private_segment_size != 0 && !info.name.starts_with("dequant_") {
        return Err(format!("uses {} bytes of scratch per work-item (hot kernels must not)", info.private_segment_size));
    }
    Ok(())
}

impl EmuKernels {
    /// Loads the gfx1100 code object on a new software device.
    pub fn new() -> Result<Self> {
        Self::with_device(Device::new())
    }

    /// Loads the gfx1100 code object on `dev` and validates every kernel of `abi.rs`.
    pub fn with_device(dev: Device) -> Result<Self> {
        Self::for_arch(dev, "gfx1100")
    }

    /// Loads the code object of `arch` (e.g. `gfx1101`, whose kernels find the workgroup id in
    /// another SGPR) on `dev` and validates every kernel of `abi.rs`.
    pub fn for_arch(dev: Device, arch: &str) -> Result<Self> {
        let co = code_object_for(arch).ok_or_else(|| GpuKernelError::NoCodeObject(arch.into()))?;
        let module = dev.load_module(co).map_err(emu("<module>"))?;
        let mut funcs = HashMap::new();
        for name in abi::all_kernels() {
            let f = module.function(name).map_err(emu(name))?;
            validate(f.info()).map_err(|what| GpuKernelError::Abi { kernel: name.to_string(), what })?;
            funcs.insert(name, f);
        }
        Ok(EmuKernels { dev, funcs })
    }

    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Metadata of a kernel (registers, LDS, scratch) by symbol.
    pub fn kernel_info(&self, name: &str) -> Option<&KernelInfo> {
        self.funcs.get(name).map(|f| f.info())
    }

    fn func(&self, name: &str) -> Result<&Function> {
        self.funcs.get(name).ok_or_else(|| GpuKernelError::Abi { kernel: name.into(), what: "not loaded".into() })
    }

    /// f32 → Q8_1 / Q8_K of `n` values at `x` into `y` (n a multiple of 32 / 256).
    pub fn launch_quantize(&self, kind: ActQuant, x: DevicePtr, y: DevicePtr, n: u32) -> Result<LaunchStats> {
        let (name, qk, per_wg) = match kind {
            ActQuant::Q8_1 => (abi::QUANTIZE_Q8_1, abi::QK8_1, abi::WG_SIZE),
            ActQuant::Q8K => (abi::QUANTIZE_Q8_K, abi::QK_K, abi::WAVES_PER_WG),
        };
        if n == 0 || !n.is_multiple_of(qk) {
            return Err(shape(name, format!("n = {n} is not a positive multiple of {qk}")));
        }
        let groups = (n / qk).div_ceil(per_wg);
        let args = QuantizeArgs { x, y, n, _pad: 0 };
        self.dev.launch(self.func(name)?, [groups, 1, 1], [abi::WG_SIZE, 1, 1], 0, &args.to_bytes()).map_err(emu(name))
    }

    /// Dequantizes `nblocks` blocks of `ty` at `w` to f32 or f16 at `y`.
    pub fn launch_dequant(&self, ty: WType, f16: bool, w: DevicePtr, y: DevicePtr, nblocks: u32) -> Result<LaunchStats> {
        let name = abi::dequant_kernel(ty, f16).ok_or_else(|| shape("dequant", format!("no kernel for {ty:?}")))?;
        if nblocks == 0 {
            return Err(shape(name, "no blocks".into()));
        }
        let args = DequantArgs { w, y, nblocks, _pad: 0 };
        let groups = nblocks.div_ceil(abi::WG_SIZE);
        let lds = abi::dequant_lds_bytes(ty);
        self.dev.launch(self.func(name)?, [groups, 1, 1], [abi::WG_SIZE, 1, 1], lds, &args.to_bytes()).map_err(emu(name))
    }

    /// MMVQ launch on device buffers (see `abi::MmvqArgs` for the contract).
    pub fn launch_mmvq(&self, ty: WType, ncols: u32, args: &MmvqArgs) -> Result<LaunchStats> {
        let name = abi::mmvq_kernel(ty, ncols)
            .ok_or_else(|| shape("mmvq", format!("{ncols} columns (1..={})", abi::MAX_COLS)))?;
        let bk = ty.block_k();
        if args.k == 0 || !args.k.is_multiple_of(bk) {
            return Err(shape(name, format!("k = {} is not a positive multiple of {bk}", args.k)));
        }
        if args.nrows == 0 || args.rows_per_wg == 0 || args.y_stride < args.nrows {
            return Err(shape(name, format!("nrows {} rows_per_wg {} y_stride {}", args.nrows, args.rows_per_wg, args.y_stride)));
        }
        let lds = abi::mmvq_lds_bytes(ty, args.k, ncols);
        if lds + ty.table_lds_bytes() > abi::MAX_LDS_BYTES {
            return Err(shape(name, format!("k = {} x {ncols} columns needs {lds} bytes of LDS (> 64 KiB): split the columns", args.k)));
        }
        let groups = args.nrows.div_ceil(args.rows_per_wg);
        self.dev.launch(self.func(name)?, [groups, 1, 1], [abi::WG_SIZE, 1, 1], lds, &args.to_bytes()).map_err(emu(name))
    }

    /// Quantizes `x` (several columns back to back are fine) and returns the blocks.
    pub fn quantize(&self, kind: ActQuant, x: &[f32]) -> Result<(Vec<u8>, LaunchStats)> {
        let (name, qk, bytes) = match kind {
            ActQuant::Q8_1 => (abi::QUANTIZE_Q8_1, abi::QK8_1 as usize, abi::Q8_1_BYTES as usize),
            ActQuant::Q8K => (abi::QUANTIZE_Q8_K, abi::QK_K as usize, abi::Q8_K_BYTES as usize),
        };
        if x.is_empty() || !x.len().is_multiple_of(qk) || x.len() > u32::MAX as usize {
            return Err(shape(name, format!("{} values is not a positive multiple of {qk}", x.len())));
        }
        let out = x.len() / qk * bytes;
        let xb = DevBuf::with(&self.dev, bytemuck_f32(x), name)?;
        let yb = DevBuf::new(&self.dev, out, name)?;
        let st = self.launch_quantize(kind, xb.ptr, yb.ptr, x.len() as u32)?;
        Ok((yb.read(out, name)?, st))
    }

    /// Dequantizes whole blocks of `ty` to f32.
    pub fn dequant_f32(&self, ty: WType, w: &[u8]) -> Result<(Vec<f32>, LaunchStats)> {
        let (bytes, st) = self.dequant(ty, w, false)?;
        Ok((bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(), st))
    }
    /// Dequantizes whole blocks of `ty` to f16 bits.
    pub fn dequant_f16(&self, ty: WType, w: &[u8]) -> Result<(Vec<u16>, LaunchStats)> {
        let (bytes, st) = self.dequant(ty, w, true)?;
        Ok((bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect(), st))
    }
    fn dequant(&self, ty: WType, w: &[u8], f16: bool) -> Result<(Vec<u8>, LaunchStats)> {
        let name = abi::dequant_kernel(ty, f16).unwrap_or("dequant");
        let bb = ty.block_bytes() as usize;
        if w.is_empty() || !w.len().is_multiple_of(bb) {
            return Err(shape(name, format!("{} bytes is not a positive multiple of the {bb}-byte block", w.len())));
        }
        let nblocks = w.len() / bb;
        let out = nblocks * ty.block_k() as usize * if f16 { 2 } else { 4 };
        let wb = DevBuf::with(&self.dev, w, name)?;
        let yb = DevBuf::new(&self.dev, out, name)?;
        let st = self.launch_dequant(ty, f16, wb.ptr, yb.ptr, nblocks as u32)?;
        Ok((yb.read(out, name)?, st))
    }

    /// `y[c][i] = W[row(i)] · x[c]` for `ncols` Q8_1 columns `x_q8_1` (each `k / 32` blocks),
    /// `W` = `w` (row-major, `k` weights per row); `rows` selects rows of `W` (None: all).
    /// Returns `ncols * nrows` values, column-major (`y[c * nrows + i]`). Columns that do not fit
    /// the LDS together (k x ncols too large) are split over several launches (stats summed).
    #[allow(clippy::too_many_arguments)]
    pub fn mmvq(
        &self,
        ty: WType,
        w: &[u8],
        k: usize,
        x_q8_1: &[u8],
        ncols: usize,
        rows: Option<&[u32]>,
        rows_per_wg: Option<u32>,
    ) -> Result<(Vec<f32>, LaunchStats)> {
        let name = abi::mmvq_kernel(ty, ncols.min(abi::MAX_COLS) as u32).unwrap_or("mmvq");
        if ncols == 0 {
            return Err(shape(name, "no columns".into()));
        }
        let bk = ty.block_k() as usize;
        if k == 0 || !k.is_multiple_of(bk) || k > u32::MAX as usize {
            return Err(shape(name, format!("k = {k} is not a positive multiple of {bk}")));
        }
        let row_bytes = k / bk * ty.block_bytes() as usize;
        if !w.len().is_multiple_of(row_bytes) {
            return Err(shape(name, format!("{} weight bytes is not a whole number of {row_bytes}-byte rows", w.len())));
        }
        let wrows = w.len() / row_bytes;
        let xneed = ncols * k / 32 * abi::Q8_1_BYTES as usize;
        if x_q8_1.len() != xneed {
            return Err(shape(name, format!("activations are {} bytes, {ncols} columns of k = {k} need {xneed}", x_q8_1.len())));
        }
        let nrows = rows.map_or(wrows, |r| r.len());
        if let Some(bad) = rows.and_then(|r| r.iter().find(|&&r| r as usize >= wrows)) {
            return Err(shape(name, format!("row index {bad} >= {wrows} rows")));
        }
        if nrows == 0 || nrows > u32::MAX as usize {
            return Err(shape(name, "no rows".into()));
        }
        let wb = DevBuf::with(&self.dev, w, name)?;
        let xb = DevBuf::with(&self.dev, x_q8_1, name)?;
        let yb = DevBuf::new(&self.dev, ncols * nrows * 4, name)?;
        let rb = match rows {
            Some(r) => Some(DevBuf::with(&self.dev, &r.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(), name)?),
            None => None,
        };
        // Columns per launch: as many as fit in LDS (64 KiB), at most MAX_COLS; more are split
        // over launches.
        let fit = (abi::MAX_LDS_BYTES.saturating_sub(ty.table_lds_bytes()) / abi::act_col_bytes(k as u32)) as usize;
        if fit == 0 {
            return Err(shape(name, format!("k = {k}: one staged column does not fit in 64 KiB of LDS")));
        }
        let mut st = LaunchStats::default();
        let mut c0 = 0;
        while c0 < ncols {
            let nc = (ncols - c0).min(fit).min(abi::MAX_COLS);
            let args = MmvqArgs {
                w: wb.ptr,
                x: xb.ptr + (c0 * k / 32 * abi::Q8_1_BYTES as usize) as u64,
                y: yb.ptr + (c0 * nrows * 4) as u64,
                rows: rb.as_ref().map_or(0, |b| b.ptr),
                nrows: nrows as u32,
                k: k as u32,
                y_stride: nrows as u32,
                rows_per_wg: rows_per_wg.unwrap_or_else(|| abi::mmvq_rows_per_wg(ty, k as u32, nrows as u32, nc as u32)),
            };
            add_stats(&mut st, &self.launch_mmvq(ty, nc as u32, &args)?);
            c0 += nc;
        }
        let bytes = yb.read(ncols * nrows * 4, name)?;
        Ok((bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(), st))
    }
}

/// Accumulates the counters of one launch into `acc`.
fn add_stats(acc: &mut LaunchStats, s: &LaunchStats) {
    acc.instructions += s.instructions;
    acc.lane_ops += s.lane_ops;
    acc.global_bytes_read += s.global_bytes_read;
    acc.global_bytes_written += s.global_bytes_written;
    acc.lds_bytes += s.lds_bytes;
    acc.waves += s.waves;
    for (k, v) in &s.by_family {
        *acc.by_family.entry(k.clone()).or_default() += v;
    }
}

/// f32 slice as little-endian bytes (the host is little-endian, like the device).
fn bytemuck_f32(x: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding or invalid bit patterns as bytes; the length is exact and the
    // lifetime is tied to `x`.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, std::mem::size_of_val(x)) }
}
