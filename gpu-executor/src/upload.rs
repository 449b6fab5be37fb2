//! Weights in device memory ([`DevMat`], how each runs: [`MatKind`]) and the [`Uploader`]
//! that puts them there, shared by the decoders' and Flash-Next's executors; below both, so
//! the executors, their products (`linear`) and their models import it and not each other.

use model::Mat;
use model::error::{EngineError, Result};
use quant::GgmlType;

use super::abi::WType;
use super::device::{DevicePtr, GpuApi, GpuError};

/// How a matrix (or a stack of `n_mat`) of type `ty` lives on the device: its bytes and its
/// [`DevMat`] (with `ptr` 0). MMVQ types as stored, f16/bf16 as stored, every other type
/// widened to f32 (the GEMM path); in the ordered mode (`ordered`) every type as stored.
/// The weight types the CPU runs and the device has no kernel for yet (issue 36): refused on
/// the device rather than widened to f32, which at their 1.5-3.5 bits a weight would be a
/// 9-20x larger upload and not what the user chose.
const NO_DEVICE_KERNEL: [GgmlType; 9] = [
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::IQ4XS,
    GgmlType::IQ3S,
    GgmlType::IQ2XXS,
    GgmlType::IQ2XS,
    GgmlType::IQ2S,
    GgmlType::IQ1S,
    GgmlType::IQ1M,
];

/// The error for a tensor of a type in [`NO_DEVICE_KERNEL`].
fn no_device_kernel(ty: GgmlType, name: &str) -> Option<EngineError> {
    NO_DEVICE_KERNEL.contains(&ty).then(|| EngineError::TensorType {
        name: name.to_string(),
        ty: ty.name(),
        why: "no gfx1100 kernel yet; the CPU runs it: --device cpu",
    })
}

pub(super) fn device_layout<'x>(
    ordered: bool,
    all: &'x [u8],
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n_mat: usize,
    name: &str,
) -> Result<(std::borrow::Cow<'x, [u8]>, DevMat)> {
    use std::borrow::Cow;
    let dm = |kind, mat_bytes, ty| DevMat { ptr: 0, kind, rows, cols, mat_bytes, ty };
    if let Some(e) = no_device_kernel(ty, name) {
        return Err(e);
    }
    if ordered {
        if !ty.has_reference() || ty.row_bytes(cols).is_none() {
            return Err(EngineError::TensorType {
                name: name.to_string(),
                ty: ty.name(),
                why: "has no reference dot product for the ordered GPU mode",
            });
        }
        return Ok((Cow::Borrowed(all), dm(MatKind::Raw, all.len() / n_mat, ty)));
    }
    Ok(match wtype(ty) {
        Some(wt) if cols.is_multiple_of(wt.block_k() as usize) => {
            (Cow::Borrowed(all), dm(MatKind::Q(wt), all.len() / n_mat, ty))
        }
        _ if matches!(ty, GgmlType::F16 | GgmlType::BF16) => {
            let kind = if ty == GgmlType::F16 { MatKind::F16 } else { MatKind::BF16 };
            (Cow::Borrowed(all), dm(kind, rows * cols * 2, ty))
        }
        _ => {
            let f = dequant_bytes(all, ty, rows * cols * n_mat, name)?;
            (Cow::Owned(f32_bytes(&f).to_vec()), dm(MatKind::F32, rows * cols * 4, GgmlType::F32))
        }
    })
}

/// Says what to do when a model's weights do not fit the device (`e` from their upload).
pub(super) fn weights_do_not_fit(e: EngineError) -> EngineError {
    match e {
        EngineError::Gpu(m) if m.contains("out of device memory") => EngineError::Gpu(format!(
            "the weights do not fit: {m}; --device cpu runs the model on the CPU, and a MoE model keeps fewer experts in VRAM with --expert-cache N|auto"
        )),
        e => e,
    }
}

pub(super) fn gpu_err(what: &str) -> impl FnOnce(GpuError) -> EngineError + '_ {
    move |e| EngineError::Gpu(format!("{what}: {e}"))
}

/// How a weight matrix runs on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MatKind {
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
pub(super) struct Tmp {
    /// f16 copy of one layer matrix (dequantize + GEMM prefill path; 0: not available).
    pub wdq: DevicePtr,
    /// f16 / bf16 copy of the activations (f16 and bf16 GEMMs).
    pub xh: DevicePtr,
}

/// A weight matrix (or expert stack) in device memory.
#[derive(Clone, Copy, Debug)]
pub(super) struct DevMat {
    pub ptr: DevicePtr,
    pub kind: MatKind,
    pub rows: usize,
    pub cols: usize,
    /// Bytes of one matrix of a stack.
    pub mat_bytes: usize,
    /// Element type of the bytes at `ptr` (F32 for matrices widened at upload).
    pub ty: GgmlType,
}

impl DevMat {
    pub fn expert(&self, e: usize) -> DevicePtr {
        self.ptr + (e * self.mat_bytes) as u64
    }
}

pub(super) fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding or invalid bit patterns; the slice covers exactly its bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
pub(super) fn u32_bytes(v: &[u32]) -> &[u8] {
    // SAFETY: as for f32.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn wtype(ty: GgmlType) -> Option<WType> {
    WType::from_ggml_id(ty as u32)
}

/// Bytes of Q8_1 activations for `n` values.
pub(super) fn q8_1_bytes(n: usize) -> usize {
    n / 32 * 36
}

/// `n` values of type `ty` stored in `all` as f32 (a stack's matrices are contiguous, so the
/// whole tensor dequantizes as one row).
fn dequant_bytes(all: &[u8], ty: GgmlType, n: usize, name: &str) -> Result<Vec<f32>> {
    let mut out = vec![0f32; n];
    quant::dequantize_row(ty, all, &mut out).map_err(|e| EngineError::TensorType {
        name: format!("{name} ({e:?})"),
        ty: ty.name(),
        why: "cannot dequantize for the GPU",
    })?;
    Ok(out)
}

/// Allocates and fills device buffers, remembering them until their owner takes them with
/// [`Uploader::finish`]; dropped before that (an upload that failed half-way, a `?` on the way
/// out), it frees them, so a failed load or session leaves the device as it found it.
pub(super) struct Uploader<'a> {
    api: &'a dyn GpuApi,
    allocs: Vec<DevicePtr>,
    bytes: usize,
    /// Ordered mode: matrices stay as stored ([`MatKind::Raw`]).
    ordered: bool,
}

impl<'a> Uploader<'a> {
    pub(super) fn new(api: &'a dyn GpuApi, ordered: bool) -> Uploader<'a> {
        Uploader { api, allocs: Vec::new(), bytes: 0, ordered }
    }
    /// Whether matrices stay as stored for the ordered mode ([`MatKind::Raw`]).
    pub(super) fn ordered(&self) -> bool {
        self.ordered
    }
    /// The buffers allocated so far and their bytes, for their owner to free.
    pub(super) fn finish(mut self) -> (Vec<DevicePtr>, usize) {
        (std::mem::take(&mut self.allocs), self.bytes)
    }
    pub(super) fn bytes(&mut self, data: &[u8]) -> Result<DevicePtr> {
        let p = self.zeroed(data.len())?;
        self.api.memcpy_htod(p, data).map_err(gpu_err("uploading weights"))?;
        Ok(p)
    }
    pub(super) fn zeroed(&mut self, n: usize) -> Result<DevicePtr> {
        let uploaded = self.bytes;
        let p = self.api.malloc(n.max(16)).map_err(|e| match e {
            GpuError::OutOfMemory { .. } => EngineError::Gpu(format!(
                "{e} ({} of this upload already there)",
                indicatif::HumanBytes(uploaded as u64)
            )),
            e => gpu_err("device allocation")(e),
        })?;
        self.allocs.push(p);
        self.bytes += n;
        self.api.memset(p, 0, n.max(16)).map_err(gpu_err("device memset"))?;
        Ok(p)
    }
    pub(super) fn f32s(&mut self, v: &[f32]) -> Result<DevicePtr> {
        self.bytes(f32_bytes(v))
    }
    /// Empty device room for `n` experts of the stack `w` (laid out as `mat` would upload it:
    /// as stored, for MMVQ or the ordered mode's `mmv_ordered`), filled by the expert cache.
    pub(super) fn slots(&mut self, w: &Mat, name: &str, n: usize) -> Result<DevMat> {
        let all = w.data();
        let mat_bytes = all.len() / w.n_mat;
        let kind = if self.ordered && w.ty.has_reference() && w.ty.row_bytes(w.cols).is_some() {
            MatKind::Raw
        } else {
            match wtype(w.ty) {
                Some(ty) if !self.ordered && w.cols.is_multiple_of(ty.block_k() as usize) => MatKind::Q(ty),
                _ => {
                    return Err(EngineError::TensorType {
                        name: name.to_string(),
                        ty: w.ty.name(),
                        why: "--expert-cache needs experts of a type the device runs as stored (Q8_0, Q4_K, Q6_K, IQ3_XXS; any reference type with --ordered)",
                    });
                }
            }
        };
        let ptr = self.zeroed(n * mat_bytes)?;
        Ok(DevMat { ptr, kind, rows: w.rows, cols: w.cols, mat_bytes, ty: w.ty })
    }

    /// The token embedding table, rows as stored when the row-gather kernel reads the type,
    /// else widened to f32 (never [`MatKind::Raw`]: gathering rows needs no dot product).
    pub(super) fn embedding(&mut self, w: &Mat) -> Result<DevMat> {
        let data = w.data();
        self.embedding_table(data, w.ty, w.rows, w.cols)
    }

    /// [`Uploader::embedding`] from the table's bytes as stored.
    pub(super) fn embedding_table(
        &mut self,
        data: &[u8],
        stored: GgmlType,
        rows: usize,
        cols: usize,
    ) -> Result<DevMat> {
        if let Some(e) = no_device_kernel(stored, "token_embd.weight") {
            return Err(e);
        }
        let (kind, ty) = match stored {
            GgmlType::F32 => (MatKind::F32, stored),
            GgmlType::F16 => (MatKind::F16, stored),
            t => match wtype(t) {
                Some(wt) => (MatKind::Q(wt), stored),
                None => (MatKind::F32, GgmlType::F32),
            },
        };
        let ptr = if ty != stored {
            self.f32s(&dequant_bytes(data, stored, rows * cols, "token_embd.weight")?)?
        } else {
            self.bytes(data)?
        };
        let mat_bytes = if ty != stored { rows * cols * 4 } else { data.len() };
        Ok(DevMat { ptr, kind, rows, cols, mat_bytes, ty })
    }
    pub(super) fn mat(&mut self, w: &Mat, name: &str) -> Result<DevMat> {
        let all = w.data();
        self.matrix(all, w.ty, w.rows, w.cols, w.n_mat, name)
    }

    /// A matrix `[rows][cols]` (or a stack of `n_mat`) of type `ty` from its bytes as stored,
    /// laid out by [`device_layout`].
    pub(super) fn matrix(
        &mut self,
        all: &[u8],
        ty: GgmlType,
        rows: usize,
        cols: usize,
        n_mat: usize,
        name: &str,
    ) -> Result<DevMat> {
        let (bytes, mut m) = device_layout(self.ordered, all, ty, rows, cols, n_mat, name)?;
        m.ptr = self.bytes(&bytes)?;
        Ok(m)
    }

    /// Empty device room for `n` matrices laid out like `sample` (one matrix's bytes as
    /// stored): an expert cache's slots, filled later with [`device_layout`]'s bytes.
    pub(super) fn matrix_room(
        &mut self,
        sample: &[u8],
        ty: GgmlType,
        rows: usize,
        cols: usize,
        n: usize,
        name: &str,
    ) -> Result<DevMat> {
        let (_, mut m) = device_layout(self.ordered, sample, ty, rows, cols, 1, name)?;
        m.ptr = self.zeroed(n * m.mat_bytes)?;
        Ok(m)
    }
}

impl Drop for Uploader<'_> {
    fn drop(&mut self) {
        for p in self.allocs.drain(..) {
            let _ = self.api.free(p);
        }
    }
}
