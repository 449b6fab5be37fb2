//! hipBLASLt behind the HIP device: opening the library and reading its version, and the
//! descriptors of one GEMM problem (matmul descriptor, layouts, preference), destroyed on drop.

use super::super::error::{GpuError, Result};
use super::super::{ComputeType, DType, Gemm, Transpose};
use super::ffi::*;
use super::{HipConfig, open_library};
use libloading::Library;

/// hipBLASLt: function table, one handle (created at open to read the version).
pub(super) struct Lt {
    pub fns: LtFns,
    pub handle: usize,
    pub version: String,
    _lib: Library,
}

/// Opens hipBLASLt, creates a handle and reads its version; Err = why it is off.
pub(super) fn open_lt(cfg: &HipConfig) -> std::result::Result<(Lt, String), String> {
    let names = ["libhipblaslt.so", "libhipblaslt.so.1", "libhipblaslt.so.0"];
    let (lib, path) =
        open_library("libhipblaslt", &names, &cfg.lib_dirs, cfg.system_search).map_err(|e| e.to_string())?;
    let fns = LtFns::load(&lib, &path).map_err(|e| e.to_string())?;
    let real = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
    let mut h: Ptr = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let s = unsafe { (fns.hipblasLtCreate)(&mut h) };
    if s != 0 || h.is_null() {
        return Err(format!("hipblasLtCreate failed with status {s} ({}) at {}", blas_status_name(s), real.display()));
    }
    let mut v = 0i32;
    // SAFETY: handle from hipblasLtCreate, valid out-pointer.
    let s = unsafe { (fns.hipblasLtGetVersion)(h, &mut v) };
    if s != 0 {
        // SAFETY: created above, destroyed once.
        unsafe { (fns.hipblasLtDestroy)(h) };
        return Err(format!("hipblasLtGetVersion failed with status {s} ({})", blas_status_name(s)));
    }
    let version = lt_version_string(v);
    if v < LT_MIN_VERSION {
        // SAFETY: created above, destroyed once.
        unsafe { (fns.hipblasLtDestroy)(h) };
        return Err(format!(
            "{} is hipBLASLt {version}; 0.6.0 (ROCm 6.0) or newer is needed (hipDataType / hipblasComputeType_t API)",
            real.display()
        ));
    }
    let desc = real.display().to_string();
    Ok((Lt { fns, handle: h as usize, version, _lib: lib }, desc))
}

/// Descriptors of one hipBLASLt problem, destroyed on drop.
pub(super) struct LtProblem<'a> {
    fns: &'a LtFns,
    pub desc: Ptr,
    pub layouts: [Ptr; 3],
}

impl Drop for LtProblem<'_> {
    fn drop(&mut self) {
        // SAFETY: each non-null descriptor was created by this table and is destroyed once.
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    (self.fns.hipblasLtMatrixLayoutDestroy)(l);
                }
            }
            if !self.desc.is_null() {
                (self.fns.hipblasLtMatmulDescDestroy)(self.desc);
            }
        }
    }
}

pub(super) fn lt_check(call: &'static str, s: i32, g: &Gemm) -> Result<()> {
    if s == 0 {
        Ok(())
    } else {
        Err(GpuError::Blas {
            call,
            status: s,
            name: blas_status_name(s),
            context: format!(" (hipBLASLt, m={} n={} k={} batch={})", g.m, g.n, g.k, g.batch),
        })
    }
}

pub(super) fn hip_dtype(t: DType) -> u32 {
    match t {
        DType::F32 => HIP_R_32F,
        DType::F16 => HIP_R_16F,
        DType::BF16 => HIP_R_16BF,
    }
}

pub(super) fn hip_op(t: Transpose) -> u32 {
    if t == Transpose::N { HIPBLAS_OP_N } else { HIPBLAS_OP_T }
}

impl Lt {
    /// Matmul descriptor (compute type, scale type, transposes) and the A, B, C(=D) layouts.
    pub(super) fn problem(&self, g: &Gemm) -> Result<LtProblem<'_>> {
        let mut p = LtProblem { fns: &self.fns, desc: std::ptr::null_mut(), layouts: [std::ptr::null_mut(); 3] };
        let (compute, scale) = match g.compute {
            ComputeType::F32 => (HIPBLAS_COMPUTE_32F, HIP_R_32F),
            ComputeType::F16 => (HIPBLAS_COMPUTE_16F, HIP_R_16F),
        };
        // SAFETY (block): out-pointers are valid; attribute buffers are the documented types
        // (int32 hipblasOperation_t, int32 batch count, int64 stride) and outlive the calls.
        unsafe {
            lt_check(
                "hipblasLtMatmulDescCreate",
                (self.fns.hipblasLtMatmulDescCreate)(&mut p.desc, compute, scale),
                g,
            )?;
            let (ta, tb) = (hip_op(g.trans_a) as i32, hip_op(g.trans_b) as i32);
            let set = self.fns.hipblasLtMatmulDescSetAttribute;
            lt_check("hipblasLtMatmulDescSetAttribute", set(p.desc, LT_DESC_TRANSA, &ta as *const i32 as _, 4), g)?;
            lt_check("hipblasLtMatmulDescSetAttribute", set(p.desc, LT_DESC_TRANSB, &tb as *const i32 as _, 4), g)?;
            let dims = [
                (g.a_type, if g.trans_a == Transpose::N { (g.m, g.k) } else { (g.k, g.m) }, g.lda, g.stride_a),
                (g.b_type, if g.trans_b == Transpose::N { (g.k, g.n) } else { (g.n, g.k) }, g.ldb, g.stride_b),
                (g.c_type, (g.m, g.n), g.ldc, g.stride_c),
            ];
            for (i, (ty, (rows, cols), ld, stride)) in dims.into_iter().enumerate() {
                let rc = (self.fns.hipblasLtMatrixLayoutCreate)(
                    &mut p.layouts[i],
                    hip_dtype(ty),
                    rows as u64,
                    cols as u64,
                    ld as i64,
                );
                lt_check("hipblasLtMatrixLayoutCreate", rc, g)?;
                if g.batch > 1 {
                    let (b, st) = (g.batch as i32, stride as i64);
                    let setl = self.fns.hipblasLtMatrixLayoutSetAttribute;
                    lt_check(
                        "hipblasLtMatrixLayoutSetAttribute",
                        setl(p.layouts[i], LT_LAYOUT_BATCH_COUNT, &b as *const i32 as _, 4),
                        g,
                    )?;
                    lt_check(
                        "hipblasLtMatrixLayoutSetAttribute",
                        setl(p.layouts[i], LT_LAYOUT_STRIDED_BATCH_OFFSET, &st as *const i64 as _, 8),
                        g,
                    )?;
                }
            }
        }
        Ok(p)
    }
}
