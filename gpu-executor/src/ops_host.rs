//! Host-slice wrappers over [`GpuOps`] for the kernel benchmark and the kernel tests: upload the
//! inputs, launch through the launchers the engine uses (the same shape checks, argument
//! packing and grid math on every device), read the result back, free. Each also returns the
//! device's counters of its launches ([`GpuApi::take_stats`]: the software device's
//! instructions and global bytes; `None` on a card). The counters are the device's since the
//! last `take_stats`, so they are per call when one thread at a time uses the device.
use super::abi::{self, WType};
use super::device::{DevicePtr, GpuApi, GpuError, LaunchStats, Result, Stream};
use super::ops::GpuOps;

/// Which activation quantizer [`GpuOps::host_quantize`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActQuant {
    Q8_1,
    Q8K,
}

fn bad(kernel: &str, what: impl Into<String>) -> GpuError {
    GpuError::Launch { kernel: kernel.to_string(), what: what.into() }
}

/// A device allocation freed on drop (a failed free is ignored: the device outlives it).
struct DevBuf<'a> {
    api: &'a dyn GpuApi,
    ptr: DevicePtr,
    bytes: usize,
}
impl<'a> DevBuf<'a> {
    fn zeroed(api: &'a dyn GpuApi, bytes: usize, kernel: &str) -> Result<Self> {
        let ptr = api.malloc(bytes.max(16))?;
        let b = DevBuf { api, ptr, bytes };
        if ptr % 16 != 0 {
            return Err(bad(
                kernel,
                format!("device allocation {ptr:#x} is not 16-byte aligned (ABI rule 4, docs/kernels.md)"),
            ));
        }
        api.memset(ptr, 0, bytes.max(16))?;
        Ok(b)
    }
    fn with(api: &'a dyn GpuApi, bytes: &[u8], kernel: &str) -> Result<Self> {
        let b = Self::zeroed(api, bytes.len(), kernel)?;
        api.memcpy_htod(b.ptr, bytes)?;
        Ok(b)
    }
    /// The buffer's bytes once the device has finished its work.
    fn read(&self) -> Result<Vec<u8>> {
        self.api.synchronize()?;
        let mut v = vec![0u8; self.bytes];
        self.api.memcpy_dtoh(&mut v, self.ptr)?;
        Ok(v)
    }
}
impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        let _ = self.api.free(self.ptr);
    }
}

fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl GpuOps {
    /// Runs `launch` after discarding older counters; returns the counters of what it launched.
    fn counted(&self, launch: impl FnOnce() -> Result<()>) -> Result<Option<LaunchStats>> {
        let _ = self.api().take_stats();
        launch()?;
        self.api().synchronize()?;
        Ok(self.api().take_stats())
    }

    /// Quantizes `x` (several columns back to back are fine) to Q8_1 / Q8_K blocks.
    pub fn host_quantize(&self, kind: ActQuant, x: &[f32]) -> Result<(Vec<u8>, Option<LaunchStats>)> {
        let (name, qk, block_bytes) = match kind {
            ActQuant::Q8_1 => (abi::QUANTIZE_Q8_1, abi::QK8_1 as usize, abi::Q8_1_BYTES as usize),
            ActQuant::Q8K => (abi::QUANTIZE_Q8_K, abi::QK_K as usize, abi::Q8_K_BYTES as usize),
        };
        if x.is_empty() || !x.len().is_multiple_of(qk) || x.len() > u32::MAX as usize {
            return Err(bad(name, format!("{} values is not a positive multiple of {qk}", x.len())));
        }
        let api = &**self.api();
        let xb = DevBuf::with(api, &f32_bytes(x), name)?;
        let yb = DevBuf::zeroed(api, x.len() / qk * block_bytes, name)?;
        let n = x.len() as u32;
        let s = Stream::DEFAULT;
        let stats = self.counted(|| match kind {
            ActQuant::Q8_1 => self.quantize_q8_1(&s, xb.ptr, yb.ptr, n),
            ActQuant::Q8K => self.quantize_q8_k(&s, xb.ptr, yb.ptr, n),
        })?;
        Ok((yb.read()?, stats))
    }

    /// Dequantizes whole blocks of `ty` to f32.
    pub fn host_dequant_f32(&self, ty: WType, w: &[u8]) -> Result<(Vec<f32>, Option<LaunchStats>)> {
        let (bytes, stats) = self.host_dequant(ty, w, false)?;
        Ok((bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(), stats))
    }
    /// Dequantizes whole blocks of `ty` to f16 bits.
    pub fn host_dequant_f16(&self, ty: WType, w: &[u8]) -> Result<(Vec<u16>, Option<LaunchStats>)> {
        let (bytes, stats) = self.host_dequant(ty, w, true)?;
        Ok((bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect(), stats))
    }
    fn host_dequant(&self, ty: WType, w: &[u8], f16: bool) -> Result<(Vec<u8>, Option<LaunchStats>)> {
        let name = abi::dequant_kernel(ty, f16).unwrap_or("dequant");
        let bb = ty.block_bytes() as usize;
        if w.is_empty() || !w.len().is_multiple_of(bb) || w.len() / bb > u32::MAX as usize {
            return Err(bad(name, format!("{} bytes is not a positive multiple of the {bb}-byte block", w.len())));
        }
        let nblocks = w.len() / bb;
        let api = &**self.api();
        let wb = DevBuf::with(api, w, name)?;
        let yb = DevBuf::zeroed(api, nblocks * ty.block_k() as usize * if f16 { 2 } else { 4 }, name)?;
        let stats = self.counted(|| self.dequant(&Stream::DEFAULT, ty, f16, wb.ptr, yb.ptr, nblocks as u32))?;
        Ok((yb.read()?, stats))
    }

    /// `y[c][i] = W[row(i)] · x[c]` for `ncols` Q8_1 columns `x_q8_1` (each `k / 32` blocks), `W`
    /// = `w` (row-major, `k` weights per row); `rows` selects rows of `W` (None: all). Returns
    /// `ncols * nrows` values, column-major (`y[c * nrows + i]`). Any number of columns: each
    /// launch takes as many as fit the LDS together, at most `MAX_COLS` (counters summed).
    pub fn host_mmvq(
        &self,
        ty: WType,
        w: &[u8],
        k: usize,
        x_q8_1: &[u8],
        ncols: usize,
        rows: Option<&[u32]>,
    ) -> Result<(Vec<f32>, Option<LaunchStats>)> {
        let name = abi::mmvq_kernel(ty, ncols.clamp(1, abi::MAX_COLS) as u32).unwrap_or("mmvq");
        if ncols == 0 {
            return Err(bad(name, "no columns"));
        }
        let bk = ty.block_k() as usize;
        if k == 0 || !k.is_multiple_of(bk) || k > u32::MAX as usize {
            return Err(bad(name, format!("k = {k} is not a positive multiple of {bk}")));
        }
        let row_bytes = k / bk * ty.block_bytes() as usize;
        if !w.len().is_multiple_of(row_bytes) {
            return Err(bad(name, format!("{} weight bytes is not a whole number of {row_bytes}-byte rows", w.len())));
        }
        let wrows = w.len() / row_bytes;
        let col_bytes = k / 32 * abi::Q8_1_BYTES as usize;
        if x_q8_1.len() != ncols * col_bytes {
            return Err(bad(
                name,
                format!(
                    "activations are {} bytes, {ncols} columns of k = {k} need {}",
                    x_q8_1.len(),
                    ncols * col_bytes
                ),
            ));
        }
        if let Some(bad_row) = rows.and_then(|r| r.iter().find(|&&r| r as usize >= wrows)) {
            return Err(bad(name, format!("row index {bad_row} >= {wrows} rows")));
        }
        let nrows = rows.map_or(wrows, |r| r.len());
        if nrows == 0 || nrows > u32::MAX as usize {
            return Err(bad(name, "no rows"));
        }
        let fit = (abi::MAX_LDS_BYTES.saturating_sub(ty.table_lds_bytes()) / abi::act_col_bytes(k as u32)) as usize;
        if fit == 0 {
            return Err(bad(name, format!("k = {k}: one staged column does not fit in 64 KiB of LDS")));
        }
        let api = &**self.api();
        let wb = DevBuf::with(api, w, name)?;
        let xb = DevBuf::with(api, x_q8_1, name)?;
        let yb = DevBuf::zeroed(api, ncols * nrows * 4, name)?;
        let row_list: Vec<u8> = rows.unwrap_or(&[]).iter().flat_map(|v| v.to_le_bytes()).collect();
        let rb = match rows {
            Some(_) => Some(DevBuf::with(api, &row_list, name)?),
            None => None,
        };
        let s = Stream::DEFAULT;
        let stats = self.counted(|| {
            let mut c0 = 0;
            while c0 < ncols {
                let nc = (ncols - c0).min(fit).min(abi::MAX_COLS);
                let (x, y) = (xb.ptr + (c0 * col_bytes) as u64, yb.ptr + (c0 * nrows * 4) as u64);
                self.mmvq(
                    &s,
                    ty,
                    nc as u32,
                    wb.ptr,
                    x,
                    y,
                    rb.as_ref().map(|b| b.ptr),
                    nrows as u32,
                    k as u32,
                    nrows as u32,
                )?;
                c0 += nc;
            }
            Ok(())
        })?;
        let bytes = yb.read()?;
        Ok((bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(), stats))
    }
}
