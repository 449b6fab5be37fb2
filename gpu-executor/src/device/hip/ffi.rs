//! The hand-written table of HIP runtime and hipBLAS functions this crate calls, resolved at
//! run time from `libamdhip64.so` / `libhipblas.so` with `libloading`.
//!
//! Signatures follow the ROCm 6.x and 7.x headers (`hip_runtime_api.h`, `hipblas.h`): handles
//! (`hipStream_t`, `hipModule_t`, ...) are pointers, enums and `hipError_t` are C `int`-sized,
//! sizes are `size_t`. Only functions whose C signature is the same in 6.x and 7.x are listed;
//! the version-dependent ones are handled where they are used:
//! - device properties: `hipGetDevicePropertiesR0600` (the layout introduced in 6.0 and kept in
//!   7.x), read only for `gcnArchName` (see `hip/mod.rs`);
//! - pinned memory: `hipHostMalloc` (6.x, 7.x), else `hipExtHostAlloc`, else `hipHostAlloc`,
//!   all `(void**, size_t, unsigned flags)`;
//! - GEMM: hipBLAS 2.x exports the `hipDataType`/`hipblasComputeType_t` flavour as
//!   `hipblasGemmStridedBatchedEx_v2`; hipBLAS 3.x (ROCm 7) removed `hipblasDatatype_t`, and the
//!   un-suffixed name takes those types.
use super::super::error::{GpuError, Result};
use libloading::Library;
use std::ffi::{c_char, c_void};
use std::path::{Path, PathBuf};

pub type Ptr = *mut c_void;
pub type HipError = u32;

/// `hipMemcpyKind`.
pub const H2D: u32 = 1;
pub const D2H: u32 = 2;
pub const D2D: u32 = 3;
/// `hipErrorOutOfMemory` (hipMalloc past the free VRAM).
pub const HIP_ERROR_OUT_OF_MEMORY: HipError = 2;
/// `hipHostMallocMapped` / `hipHostMallocPortable` (same values for `hipHostAlloc*`).
pub const HOST_MALLOC_PORTABLE: u32 = 0x1;
pub const HOST_MALLOC_MAPPED: u32 = 0x2;
/// `hipHostRegisterMapped`.
pub const HOST_REGISTER_MAPPED: u32 = 0x2;
/// `hipStreamNonBlocking`.
pub const STREAM_NON_BLOCKING: u32 = 0x1;
/// `hipEventDisableTiming`.
pub const EVENT_DISABLE_TIMING: u32 = 0x2;
/// `hipStreamCaptureModeThreadLocal`: other threads may keep using the runtime while one
/// thread captures its own stream.
pub const CAPTURE_MODE_THREAD_LOCAL: u32 = 1;
/// `HIP_LAUNCH_PARAM_BUFFER_POINTER`, `_SIZE`, `_END` (the `extra` array of a module launch).
pub const LAUNCH_PARAM_BUFFER_POINTER: usize = 0x1;
pub const LAUNCH_PARAM_BUFFER_SIZE: usize = 0x2;
pub const LAUNCH_PARAM_END: usize = 0x3;
/// `hipDeviceAttribute_t` values (the CUDA-compatible block, unchanged since ROCm 5).
pub const ATTR_MULTIPROCESSOR_COUNT: u32 = 63;
pub const ATTR_WARP_SIZE: u32 = 87;
/// `hipErrorNoDevice`, `hipErrorInvalidDevice`, `hipErrorInsufficientDriver`.
pub const ERR_NO_DEVICE: u32 = 100;
pub const ERR_INVALID_DEVICE: u32 = 101;
pub const ERR_INSUFFICIENT_DRIVER: u32 = 35;

/// Opens the first of `names` found in `dirs` (in order), then, if `system`, by bare name
/// through the dynamic loader's search path (`LD_LIBRARY_PATH`, ld.so.cache).
pub fn open_library(lib: &'static str, names: &[&str], dirs: &[PathBuf], system: bool) -> Result<(Library, PathBuf)> {
    let mut searched = Vec::new();
    for dir in dirs {
        for name in names {
            let p = dir.join(name);
            if !p.exists() {
                continue;
            }
            // SAFETY: loading a shared library runs its initialisers; these are the HIP/ROCm
            // runtime libraries the user installed (or a test double), which is the contract
            // of using them at all.
            match unsafe { Library::new(&p) } {
                Ok(l) => return Ok((l, p)),
                Err(e) => searched.push(format!("{} ({e})", p.display())),
            }
        }
        searched.push(dir.display().to_string());
    }
    if system {
        for name in names {
            // SAFETY: as above, by bare name through the loader's search path.
            match unsafe { Library::new(name) } {
                Ok(l) => return Ok((l, loaded_path(name))),
                Err(e) => {
                    let msg = e.to_string();
                    // "cannot open shared object file" is the ordinary not-installed case.
                    if !msg.contains("No such file") && !msg.contains("cannot open shared object") {
                        searched.push(format!("{name} ({msg})"));
                    }
                }
            }
        }
        searched.push("the system library path".into());
    }
    Err(GpuError::LibraryNotFound { lib, searched: searched.join(", ") })
}

/// The file the dynamic loader mapped for a library opened by bare `name` (from
/// `/proc/self/maps`, so messages name the real file); `name` itself when it cannot be told.
fn loaded_path(name: &str) -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.starts_with('/') && Path::new(p).file_name().is_some_and(|f| f.to_string_lossy().starts_with(name)))
        .map_or_else(|| PathBuf::from(name), PathBuf::from)
}

/// Resolves one symbol to a function pointer of type `T`.
///
/// # Safety
/// `T` must be the exact C signature of `symbol` in the library.
pub unsafe fn sym<T: Copy>(lib: &Library, path: &Path, lib_name: &'static str, symbol: &'static str) -> Result<T> {
    let mut name = symbol.as_bytes().to_vec();
    name.push(0);
    // SAFETY: forwarded to the caller (signature correctness); the pointer is copied out and
    // stays valid while `lib` is loaded, which the owning table guarantees.
    match unsafe { lib.get::<T>(&name) } {
        Ok(s) => Ok(*s),
        Err(_) => Err(GpuError::MissingSymbol {
            lib: lib_name,
            path: path.display().to_string(),
            symbol,
            why: "not a ROCm 6.x/7.x HIP runtime",
        }),
    }
}

/// Like [`sym`] but `None` when absent.
///
/// # Safety
/// As [`sym`].
pub unsafe fn sym_opt<T: Copy>(lib: &Library, symbol: &str) -> Option<T> {
    let mut name = symbol.as_bytes().to_vec();
    name.push(0);
    // SAFETY: forwarded to the caller.
    unsafe { lib.get::<T>(&name) }.ok().map(|s| *s)
}

macro_rules! fn_table {
    ($(#[$m:meta])* $table:ident, $lib:literal { $($field:ident : fn($($arg:ty),*) -> $ret:ty;)* }) => {
        $(#[$m])*
        #[allow(non_snake_case)]
        pub struct $table {
            $(pub $field: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }
        impl $table {
            /// The symbol names of the table, in order.
            pub const SYMBOLS: &'static [&'static str] = &[$(stringify!($field)),*];
            /// Resolves every function; the first missing one is a named error.
            pub fn load(lib: &Library, path: &Path) -> Result<Self> {
                Ok($table {
                    // SAFETY: each type is the C signature of the symbol of the same name in
                    // ROCm 6.x/7.x (see the module docs).
                    $($field: unsafe { sym(lib, path, $lib, stringify!($field))? },)*
                })
            }
        }
    };
}

fn_table!(
    /// `libamdhip64` functions with the same signature in ROCm 6.x and 7.x.
    HipFns, "libamdhip64" {
    hipInit: fn(u32) -> HipError;
    hipRuntimeGetVersion: fn(*mut i32) -> HipError;
    hipGetErrorString: fn(HipError) -> *const c_char;
    hipGetDeviceCount: fn(*mut i32) -> HipError;
    hipSetDevice: fn(i32) -> HipError;
    hipDeviceGetAttribute: fn(*mut i32, u32, i32) -> HipError;
    hipDeviceGetName: fn(*mut c_char, i32, i32) -> HipError;
    hipGetDevicePropertiesR0600: fn(*mut c_void, i32) -> HipError;
    hipDeviceTotalMem: fn(*mut usize, i32) -> HipError;
    hipDeviceSynchronize: fn() -> HipError;
    hipModuleLoadData: fn(*mut Ptr, *const c_void) -> HipError;
    hipModuleUnload: fn(Ptr) -> HipError;
    hipModuleGetFunction: fn(*mut Ptr, Ptr, *const c_char) -> HipError;
    hipModuleLaunchKernel: fn(Ptr, u32, u32, u32, u32, u32, u32, u32, Ptr, *mut Ptr, *mut Ptr) -> HipError;
    hipMalloc: fn(*mut Ptr, usize) -> HipError;
    hipMemGetInfo: fn(*mut usize, *mut usize) -> HipError;
    hipFree: fn(Ptr) -> HipError;
    hipHostFree: fn(Ptr) -> HipError;
    hipHostGetDevicePointer: fn(*mut Ptr, Ptr, u32) -> HipError;
    hipHostRegister: fn(Ptr, usize, u32) -> HipError;
    hipHostUnregister: fn(Ptr) -> HipError;
    hipMemcpy: fn(Ptr, *const c_void, usize, u32) -> HipError;
    hipMemcpyAsync: fn(Ptr, *const c_void, usize, u32, Ptr) -> HipError;
    hipMemset: fn(Ptr, i32, usize) -> HipError;
    hipMemsetAsync: fn(Ptr, i32, usize, Ptr) -> HipError;
    hipStreamCreateWithFlags: fn(*mut Ptr, u32) -> HipError;
    hipStreamDestroy: fn(Ptr) -> HipError;
    hipStreamSynchronize: fn(Ptr) -> HipError;
    hipStreamWaitEvent: fn(Ptr, Ptr, u32) -> HipError;
    hipEventCreateWithFlags: fn(*mut Ptr, u32) -> HipError;
    hipEventDestroy: fn(Ptr) -> HipError;
    hipEventRecord: fn(Ptr, Ptr) -> HipError;
    hipEventSynchronize: fn(Ptr) -> HipError;
    hipStreamBeginCapture: fn(Ptr, u32) -> HipError;
    hipStreamEndCapture: fn(Ptr, *mut Ptr) -> HipError;
    hipGraphInstantiate: fn(*mut Ptr, Ptr, *mut Ptr, *mut c_char, usize) -> HipError;
    hipGraphLaunch: fn(Ptr, Ptr) -> HipError;
    hipGraphExecDestroy: fn(Ptr) -> HipError;
    hipGraphDestroy: fn(Ptr) -> HipError;
});

/// `hipStreamWaitValue64(stream, ptr, value, flags, mask)` and
/// `hipStreamWriteValue64(stream, ptr, value, flags)`; resolved optionally.
pub type WaitValue64Fn = unsafe extern "C" fn(Ptr, Ptr, u64, u32, u64) -> HipError;
pub type WriteValue64Fn = unsafe extern "C" fn(Ptr, Ptr, u64, u32) -> HipError;
/// `hipStreamWaitValueGte`, `hipStreamWaitValueEq`.
pub const WAIT_VALUE_GTE: u32 = 0x0;
pub const WAIT_VALUE_EQ: u32 = 0x1;

/// `(void** ptr, size_t bytes, unsigned flags)`: `hipHostMalloc` and its successors.
pub type HostAllocFn = unsafe extern "C" fn(*mut Ptr, usize, u32) -> HipError;

fn_table!(
    /// `libhipblas` handle functions (same in hipBLAS 2.x and 3.x).
    BlasFns, "libhipblas" {
    hipblasCreate: fn(*mut Ptr) -> i32;
    hipblasDestroy: fn(Ptr) -> i32;
    hipblasSetStream: fn(Ptr, Ptr) -> i32;
});

/// `hipblasGemmStridedBatchedEx` with `hipDataType` operands and `hipblasComputeType_t`:
/// handle, transA, transB, m, n, k, alpha, A, aType, lda, strideA, B, bType, ldb, strideB,
/// beta, C, cType, ldc, strideC, batchCount, computeType, algo.
pub type GemmExFn = unsafe extern "C" fn(
    Ptr,
    u32,
    u32,
    i32,
    i32,
    i32,
    *const c_void,
    *const c_void,
    u32,
    i32,
    i64,
    *const c_void,
    u32,
    i32,
    i64,
    *const c_void,
    Ptr,
    u32,
    i32,
    i64,
    i32,
    u32,
    u32,
) -> i32;

/// `hipblasOperation_t`.
pub const HIPBLAS_OP_N: u32 = 111;
pub const HIPBLAS_OP_T: u32 = 112;
/// `hipDataType` (hip/library_types.h).
pub const HIP_R_32F: u32 = 0;
pub const HIP_R_16F: u32 = 2;
pub const HIP_R_16BF: u32 = 14;
/// `hipblasComputeType_t`.
pub const HIPBLAS_COMPUTE_16F: u32 = 0;
pub const HIPBLAS_COMPUTE_32F: u32 = 2;
/// `HIPBLAS_GEMM_DEFAULT`.
pub const HIPBLAS_GEMM_DEFAULT: u32 = 160;

/// Name of a `hipblasStatus_t`.
pub fn blas_status_name(s: i32) -> &'static str {
    match s {
        0 => "HIPBLAS_STATUS_SUCCESS",
        1 => "HIPBLAS_STATUS_NOT_INITIALIZED",
        2 => "HIPBLAS_STATUS_ALLOC_FAILED",
        3 => "HIPBLAS_STATUS_INVALID_VALUE",
        4 => "HIPBLAS_STATUS_MAPPING_ERROR",
        5 => "HIPBLAS_STATUS_EXECUTION_FAILED",
        6 => "HIPBLAS_STATUS_INTERNAL_ERROR",
        7 => "HIPBLAS_STATUS_NOT_SUPPORTED",
        8 => "HIPBLAS_STATUS_ARCH_MISMATCH",
        9 => "HIPBLAS_STATUS_HANDLE_IS_NULLPTR",
        10 => "HIPBLAS_STATUS_INVALID_ENUM",
        _ => "unknown hipblasStatus_t",
    }
}

fn_table!(
    /// `libhipblaslt` functions (hipblaslt.h of ROCm 6.x and 7.x; all return `hipblasStatus_t`).
    /// Descriptors are pointers; `hipDataType`, `hipblasComputeType_t` and the attribute enums
    /// are C ints; rows/cols are `uint64_t`, leading dimensions `int64_t`.
    LtFns, "libhipblaslt" {
    hipblasLtCreate: fn(*mut Ptr) -> i32;
    hipblasLtDestroy: fn(Ptr) -> i32;
    hipblasLtGetVersion: fn(Ptr, *mut i32) -> i32;
    hipblasLtMatmulDescCreate: fn(*mut Ptr, u32, u32) -> i32;
    hipblasLtMatmulDescSetAttribute: fn(Ptr, u32, *const c_void, usize) -> i32;
    hipblasLtMatmulDescDestroy: fn(Ptr) -> i32;
    hipblasLtMatrixLayoutCreate: fn(*mut Ptr, u32, u64, u64, i64) -> i32;
    hipblasLtMatrixLayoutSetAttribute: fn(Ptr, u32, *const c_void, usize) -> i32;
    hipblasLtMatrixLayoutDestroy: fn(Ptr) -> i32;
    hipblasLtMatmulPreferenceCreate: fn(*mut Ptr) -> i32;
    hipblasLtMatmulPreferenceSetAttribute: fn(Ptr, u32, *const c_void, usize) -> i32;
    hipblasLtMatmulPreferenceDestroy: fn(Ptr) -> i32;
    hipblasLtMatmulAlgoGetHeuristic: fn(Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, i32, *mut c_void, *mut i32) -> i32;
    hipblasLtMatmul: fn(Ptr, Ptr, *const c_void, *const c_void, Ptr, *const c_void, Ptr, *const c_void, *const c_void, Ptr, Ptr, Ptr, *const c_void, Ptr, usize, Ptr) -> i32;
});

/// `hipblasLtMatmulAlgo_t`: `uint8_t data[16]; size_t max_workspace_bytes;` (24 bytes).
pub const LT_ALGO_BYTES: usize = 24;
/// `hipblasLtMatmulHeuristicResult_t`: algo (24), `size_t workspaceSize` (at 24),
/// `hipblasStatus_t state` (at 32), `float wavesCount`, `int reserved[4]`: 56 bytes.
pub const LT_HEURISTIC_BYTES: usize = 56;
pub const LT_HEURISTIC_WORKSPACE_OFFSET: usize = 24;
pub const LT_HEURISTIC_STATE_OFFSET: usize = 32;
/// `hipblasLtMatmulDescAttributes_t`: `HIPBLASLT_MATMUL_DESC_TRANSA`, `_TRANSB` (int32 hipblasOperation_t).
pub const LT_DESC_TRANSA: u32 = 0;
pub const LT_DESC_TRANSB: u32 = 1;
/// `hipblasLtMatrixLayoutAttribute_t`: batch count (int32), strided batch offset (int64), as
/// in the ROCm 6.x/7.x header; only set for batch > 1, which the engine never sends here.
pub const LT_LAYOUT_BATCH_COUNT: u32 = 0;
pub const LT_LAYOUT_STRIDED_BATCH_OFFSET: u32 = 1;
/// `hipblasLtMatmulPreferenceAttributes_t`: `HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES` (uint64).
pub const LT_PREF_MAX_WORKSPACE_BYTES: u32 = 1;

/// `hipError_t hipEventElapsedTime(float* ms, hipEvent_t start, hipEvent_t stop)` (optional).
pub type EventElapsedFn = unsafe extern "C" fn(*mut f32, Ptr, Ptr) -> HipError;
/// `hipEventDefault` (timing enabled).
pub const EVENT_DEFAULT: u32 = 0x0;

/// hipBLASLt 0.6.0 (ROCm 6.0) replaced `hipblasLtDatatype_t`/`hipblasLtComputeType_t` by
/// `hipDataType`/`hipblasComputeType_t`, the values this table passes; older ones are refused.
pub const LT_MIN_VERSION: i32 = 600;

/// hipBLASLt's `hipblasLtGetVersion` encoding: major * 100000 + minor * 100 + patch.
pub fn lt_version_string(v: i32) -> String {
    format!("{}.{}.{}", v / 100_000, (v / 100) % 1000, v % 100)
}
