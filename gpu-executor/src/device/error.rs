//! The one error type of the device layer. Every variant names what failed: the library and
//! its path, the HIP call and its error string, the kernel, the architecture.
use emulator::EmuError;

/// Errors of [`super::GpuApi`] and [`super::open_device`].
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// A runtime library could not be opened from any search location.
    #[error("{lib} not found (searched: {searched}); install ROCm 6.x or 7.x or set ROCM_PATH")]
    LibraryNotFound { lib: &'static str, searched: String },
    /// The library opened but lacks a function this build uses (too old or not a HIP runtime).
    #[error("{lib} at {path}: missing symbol {symbol} ({why})")]
    MissingSymbol { lib: &'static str, path: String, symbol: &'static str, why: &'static str },
    /// The runtime is older than the ABI this build speaks (hipDeviceProp_tR0600, hipDataType GEMM).
    #[error("{lib} at {path} is HIP {version}; ROCm 6.0 or newer is needed")]
    RuntimeTooOld { lib: &'static str, path: String, version: String },
    /// A HIP runtime call returned an error.
    #[error("{call} failed: hipError {code} ({message}){context}")]
    Hip { call: &'static str, code: u32, message: String, context: String },
    /// A hipBLAS call returned an error status.
    #[error("hipBLAS {call} failed with status {status} ({name}){context}")]
    Blas { call: &'static str, status: i32, name: &'static str, context: String },
    /// The runtime works but reports no device (or the selected index does not exist).
    #[error("no AMD GPU visible to {lib} {version} ({why}); HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES select devices")]
    NoDevice { lib: &'static str, version: String, why: String },
    /// A device exists but this build cannot use it.
    #[error("GPU {index} \"{name}\" ({arch}) via {lib} {version} is not supported: {why}")]
    UnsupportedDevice { index: u32, name: String, arch: String, lib: &'static str, version: String, why: String },
    /// `open_device` was asked for the CPU, which is not a GPU device.
    #[error("--device cpu is not a GPU device (use auto, hip or emu)")]
    NotAGpu,
    /// `auto` found no usable GPU; the caller runs on the CPU.
    #[error("no usable AMD GPU, using the CPU: {0}")]
    NoUsableGpu(Box<GpuError>),
    /// The build embeds no code object for the device's architecture.
    #[error("no code object for {arch} in this build (embedded: {available}); rebuild with KERNEL_GFX={arch}")]
    NoCodeObject { arch: String, available: String },
    /// A kernel's metadata does not match what the host will launch.
    #[error("kernel {kernel}: {what}")]
    KernelCheck { kernel: String, what: String },
    #[error("kernel {kernel:?} is not in the loaded code object")]
    NoSuchKernel { kernel: String },
    /// A launch was refused before reaching the device.
    #[error("launch of {kernel}: {what}")]
    Launch { kernel: String, what: String },
    /// The software device reported an error.
    #[error("software device: {context}: {source}")]
    Emu {
        context: String,
        #[source]
        source: EmuError,
    },
    /// A device allocation larger than the free memory (`hipErrorOutOfMemory` on a card; the
    /// software device's VRAM size, `--emu-vram-mib`).
    #[error("out of device memory: {bytes} bytes asked, {free} of {total} bytes free")]
    OutOfMemory { bytes: usize, free: u64, total: u64 },
    /// A pinned host allocation failed and the caller did not allow the pageable fallback.
    #[error("pinned host allocation of {bytes} bytes failed: {reason}")]
    PinnedAlloc { bytes: usize, reason: String },
    /// A handle, size or pointer is invalid for the call.
    #[error("{call}: {why}")]
    InvalidArgument { call: &'static str, why: String },
    /// Graph capture misuse (not capturing, already capturing, unknown graph).
    #[error("graph capture: {0}")]
    Capture(String),
    /// A GEMM request the backend cannot run (shape, types, library missing).
    #[error("GEMM: {0}")]
    Gemm(String),
}

pub type Result<T> = std::result::Result<T, GpuError>;

/// `map_err` helper for emulator calls: `dev.malloc(n).map_err(emu("malloc"))`.
pub(crate) fn emu(context: impl Into<String>) -> impl FnOnce(EmuError) -> GpuError {
    let context = context.into();
    move |source| GpuError::Emu { context, source }
}

pub(crate) fn invalid(call: &'static str, why: impl Into<String>) -> GpuError {
    GpuError::InvalidArgument { call, why: why.into() }
}
