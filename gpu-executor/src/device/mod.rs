//! The device boundary of the GPU backend: [`GpuApi`], one object-safe trait with two
//! implementations behind `Box<dyn GpuApi>`:
//!
//! - [`hip::HipApi`]: `libamdhip64.so` (+ `libhipblas.so`, `libhipblaslt.so`) opened at run
//!   time with `libloading` through a small hand-written table of the functions used, so one
//!   binary serves CPU-only and AMD machines and no ROCm is needed to build;
//! - [`emu::EmuApi`]: the software RDNA3 device (`emulator::Device`), which executes the same
//!   embedded code objects; its GEMM is a host implementation ([`gemm_ref`]).
//!
//! The engine above this trait is the same for both, so kernel choice, argument packing, grid
//! math, stream order and graph replay are exercised in CI without an AMD GPU.
//!
//! Kernel metadata (kernarg extent, static LDS, scratch, wave size, max workgroup size) is read
//! from the code object itself (the emulator's ELF/msgpack reader, used as a parser on both
//! backends) and checked twice: at [`GpuApi::function`] against the caller's [`KernelSpec`],
//! and at every [`GpuApi::launch`] against the actual geometry, with named errors, before any
//! runtime call. See docs/amd-hip.md.
//!
//! Handles ([`Module`], [`Kernel`], [`Stream`], [`Event`], [`Graph`], [`HostBuf`]) are plain
//! values owned by the caller and released through the API (`*_destroy`, `free`), like HIP's.
pub mod emu;
pub mod error;
pub mod gemm_ref;
pub mod handoff;
pub mod hip;
mod kernel_check;

pub use emu::EmuApi;
pub use error::{GpuError, Result};
pub use handoff::Mailbox;
pub use hip::{HipApi, HipConfig};
pub use kernel_check::{check_launch, check_spec, kernarg_extent};

pub use emulator::{DevicePtr, KernelInfo, LaunchStats};
use std::sync::Arc;
use std::sync::Mutex;

/// The one device enum of the engine (`--device`): [`open_device`] takes its GPU values and
/// [`DeviceInfo::backend`] says which of `Hip` / `Emu` a [`GpuApi`] is.
pub use crate::options::Device;

/// Opens a device. `Hip` and `Auto` use [`HipConfig::from_env`] (`ROCM_PATH`, `/opt/rocm`,
/// the system library path). Never panics: a missing runtime, no device or an unsupported
/// architecture is an error that names the library, version and architecture.
pub fn open_device(kind: Device) -> Result<Box<dyn GpuApi>> {
    open_device_with(kind, &crate::options::GpuOptions::default())
}

/// [`open_device`] with the engine's GPU settings (the software device's VRAM size,
/// `--emu-vram-mib`).
pub fn open_device_with(kind: Device, opts: &crate::options::GpuOptions) -> Result<Box<dyn GpuApi>> {
    match kind {
        Device::Cpu => Err(GpuError::NotAGpu),
        Device::Emu => Ok(Box::new(EmuApi::new()?.with_vram(opts.emu_vram_mib << 20))),
        Device::Hip => Ok(Box::new(HipApi::open(&HipConfig::from_env())?)),
        Device::Auto => match HipApi::open(&HipConfig::from_env()) {
            Ok(h) => Ok(Box::new(h)),
            Err(e) => Err(GpuError::NoUsableGpu(Box::new(e))),
        },
    }
}

/// The embedded code object for a device arch (`gcnArchName`, features stripped), with a
/// named error listing what this build has.
pub fn code_object_for_arch(arch: &str) -> Result<&'static [u8]> {
    crate::code_objects::code_object_for(arch).ok_or_else(|| GpuError::NoCodeObject {
        arch: arch_base(arch).to_string(),
        available: embedded_archs().join(", "),
    })
}

/// Architectures this build embeds code objects for.
pub fn embedded_archs() -> Vec<&'static str> {
    crate::code_objects::code_objects().iter().map(|(a, _)| *a).collect()
}

/// `gfx1100:sramecc-:xnack-` → `gfx1100`.
pub fn arch_base(arch: &str) -> &str {
    arch.split(':').next().unwrap_or(arch).trim()
}

/// Device memory in bytes ([`GpuApi::mem_info`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    pub free: u64,
    pub total: u64,
}

/// What was found at open.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// `Device::Hip` or `Device::Emu`: which implementation this is.
    pub backend: Device,
    /// Index among the devices the runtime sees (after `HIP_VISIBLE_DEVICES`).
    pub index: u32,
    pub name: String,
    /// `gcnArchName` as reported, e.g. `gfx1100` or `gfx1100:sramecc-:xnack-`.
    pub arch: String,
    pub wave_size: u32,
    pub vram_bytes: u64,
    pub compute_units: u32,
    /// e.g. "HIP runtime 6.4.43483 at /opt/rocm/lib/libamdhip64.so" or "software RDNA3 device".
    pub runtime: String,
    /// hipBLAS library and API flavour, or the host GEMM; None when GEMM is unavailable.
    pub blas: Option<String>,
    /// hipBLASLt library path when present (the emulator: its host GEMM blockings).
    pub blas_lt: Option<String>,
    /// hipBLASLt version (`hipblasLtGetVersion`, e.g. "0.12.1"), or the software device's
    /// `emu-<strata version>`; None when hipBLASLt is unusable. Calibration tables are tied to it.
    pub blas_lt_version: Option<String>,
}

/// One candidate algorithm for a [`Gemm`] through [`GpuApi::gemm_lt`]: on HIP the opaque
/// `hipblasLtMatmulAlgo_t` bytes returned by `hipblasLtMatmulAlgoGetHeuristic` (serializable
/// and valid for the same hipBLASLt version, per its header), on the software device a host
/// GEMM blocking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LtAlgo {
    /// Position in the candidate list it came from.
    pub index: u32,
    /// Opaque algorithm bytes (24 on HIP: `uint8_t data[16]; size_t max_workspace_bytes`).
    pub bytes: Vec<u8>,
    /// Workspace the algorithm needs (bytes); pass at least this much to [`GpuApi::gemm_lt`].
    pub workspace: usize,
}

/// A loaded code object.
#[derive(Debug)]
pub struct Module {
    pub(crate) id: u64,
    /// Every kernel of the code object, from its metadata.
    pub kernels: Vec<KernelInfo>,
}

/// A kernel whose metadata passed [`check_spec`]; launch it with [`GpuApi::launch`].
#[derive(Clone, Debug)]
pub struct Kernel {
    pub(crate) id: u64,
    pub info: KernelInfo,
    /// Bytes of explicit kernel arguments (what the host packs).
    pub kernarg_bytes: u32,
}

/// What the host will launch a kernel with; [`GpuApi::function`] checks it against the code
/// object's metadata.
#[derive(Clone, Copy, Debug)]
pub struct KernelSpec<'a> {
    pub name: &'a str,
    /// Bytes of the `#[repr(C)]` argument struct the host packs; must equal the extent of the
    /// kernel's explicit arguments.
    pub kernarg_bytes: u32,
    /// The largest workgroup the host will launch (work-items = product).
    pub max_block: [u32; 3],
    /// The most dynamic LDS bytes the host will request.
    pub max_dynamic_lds: u32,
    /// Whether the kernel may use scratch (private segment); hot kernels must not.
    pub allow_scratch: bool,
}

/// Launch geometry: `grid` = workgroups per dimension (like `hipModuleLaunchKernel`), `block` =
/// work-items per workgroup, `dynamic_lds` = bytes of LDS beyond the kernel's static size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_lds: u32,
}

/// An ordered queue of device work. [`Stream::DEFAULT`] is HIP's null stream (cannot be captured).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Stream(pub(crate) u64);
impl Stream {
    pub const DEFAULT: Stream = Stream(0);
}

/// A marker recorded on a stream.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Event(pub(crate) u64);

/// An instantiated, replayable graph of captured work.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Graph(pub(crate) u64);

/// Condition of [`GpuApi::stream_wait_value64`] (`hipStreamWaitValueGte` / `Eq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitCond {
    Ge,
    Eq,
}
impl WaitCond {
    pub fn holds(self, word: u64, value: u64) -> bool {
        match self {
            WaitCond::Ge => word >= value,
            WaitCond::Eq => word == value,
        }
    }
}

/// Options of [`GpuApi::host_alloc`].
#[derive(Clone, Copy, Debug, Default)]
pub struct HostAllocOptions {
    /// Map the pinned buffer into the device address space ([`HostBuf::device_ptr`]).
    pub mapped: bool,
    /// When pinning fails (common on ROCm for large sizes even with free RAM), return pageable
    /// memory instead of an error; [`HostBuf::fallback`] says why.
    pub allow_pageable_fallback: bool,
}

/// Where a [`HostBuf`]'s bytes live (private: only backends build these).
#[derive(Debug)]
pub(crate) enum HostStorage {
    /// HIP: pinned (`hipHostMalloc`) or pageable (`std::alloc`) host memory.
    Raw { ptr: *mut u8, pinned: bool },
    /// Emulator: the device-visible stand-in for pinned memory.
    Emu { ptr: DevicePtr },
    /// Pageable host memory of the emulator backend (shared with captured graphs).
    Heap(Arc<Mutex<Vec<u8>>>),
}

/// Host memory for transfers: pinned (and possibly device-mapped) or the pageable fallback.
/// Read and write it through [`GpuApi::host_write`]/[`GpuApi::host_read`]; free it with
/// [`GpuApi::host_free`] (which waits for the device first, like `hipHostFree`).
#[derive(Debug)]
pub struct HostBuf {
    pub(crate) storage: HostStorage,
    pub(crate) bytes: usize,
    pub(crate) device_ptr: Option<DevicePtr>,
    pub(crate) fallback: Option<String>,
}

// SAFETY: the raw pointer of `HostStorage::Raw` is owned by this buffer and only accessed by
// whole-range copies through the API (`host_read`/`host_write`, async copies); synchronising
// those with device work is the caller's contract, exactly as with HIP pinned memory.
unsafe impl Send for HostBuf {}
// SAFETY: see `Send`; `&HostBuf` gives no unsynchronised interior access beyond those copies.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    pub fn len(&self) -> usize {
        self.bytes
    }
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    /// True when the memory is pinned (page-locked or the emulator's device-visible stand-in).
    pub fn is_pinned(&self) -> bool {
        matches!(self.storage, HostStorage::Raw { pinned: true, .. } | HostStorage::Emu { .. })
    }
    /// Device address of a mapped pinned buffer (kernels may read/write it directly).
    pub fn device_ptr(&self) -> Option<DevicePtr> {
        self.device_ptr
    }
    /// Why pinning failed, when this is the pageable fallback.
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }
    pub(crate) fn check_range(&self, call: &'static str, offset: usize, bytes: usize) -> Result<()> {
        match offset.checked_add(bytes) {
            Some(end) if end <= self.bytes => Ok(()),
            _ => {
                Err(error::invalid(call, format!("range {offset}+{bytes} outside the {}-byte host buffer", self.bytes)))
            }
        }
    }
}

/// Host memory the caller owns, pinned and mapped for the device ([`GpuApi::host_register`]).
#[derive(Debug)]
pub struct HostRegion {
    /// Where kernels read the first registered byte.
    pub device_ptr: DevicePtr,
    pub bytes: usize,
    /// The registered host address (HIP) or the software device's copy (emu).
    pub(crate) handle: u64,
}

/// Element types of the GEMM entry point (`hipDataType` values on HIP).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
}
impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }
}

/// Accumulation type (`hipblasComputeType_t`). `alpha`/`beta` are passed as f32 for `F32` and
/// converted to f16 for `F16`, as hipBLAS expects scalars of the compute type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComputeType {
    F32,
    F16,
}

/// `op(X)` of BLAS: `N` (as stored) or `T` (transposed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transpose {
    N,
    T,
}

/// Strided-batched GEMM, column-major like BLAS (`hipblasGemmStridedBatchedEx`):
/// `C_i = alpha * op(A_i) * op(B_i) + beta * C_i` for `i < batch`, `op(A)` m×k, `op(B)` k×n,
/// `C` m×n; `X_i` starts `i * stride_x` elements after `x`. A row-major `Y[n][m] = X[n][k] ·
/// W[m][k]ᵀ` (the usual dense layer) is `trans_a = T, a = W, lda = k, trans_b = N, b = X, ldb = k,
/// c = Y, ldc = m`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemm {
    pub trans_a: Transpose,
    pub trans_b: Transpose,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    pub a: DevicePtr,
    pub a_type: DType,
    pub lda: usize,
    pub stride_a: usize,
    pub b: DevicePtr,
    pub b_type: DType,
    pub ldb: usize,
    pub stride_b: usize,
    pub beta: f32,
    pub c: DevicePtr,
    pub c_type: DType,
    pub ldc: usize,
    pub stride_c: usize,
    pub batch: usize,
    pub compute: ComputeType,
}

impl Gemm {
    /// Checks shapes and leading dimensions (both backends call this first).
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(GpuError::Gemm(why));
        if self.m == 0 || self.n == 0 || self.k == 0 || self.batch == 0 {
            return bad(format!("empty GEMM m={} n={} k={} batch={}", self.m, self.n, self.k, self.batch));
        }
        let lim = i32::MAX as usize;
        for (what, v) in [
            ("m", self.m),
            ("n", self.n),
            ("k", self.k),
            ("lda", self.lda),
            ("ldb", self.ldb),
            ("ldc", self.ldc),
            ("batch", self.batch),
        ] {
            if v > lim {
                return bad(format!("{what} = {v} exceeds i32"));
            }
        }
        let rows_a = if self.trans_a == Transpose::N { self.m } else { self.k };
        let rows_b = if self.trans_b == Transpose::N { self.k } else { self.n };
        if self.lda < rows_a || self.ldb < rows_b || self.ldc < self.m {
            return bad(format!(
                "leading dimensions lda={} (needs >= {rows_a}), ldb={} (needs >= {rows_b}), ldc={} (needs >= {})",
                self.lda, self.ldb, self.ldc, self.m
            ));
        }
        if self.a_type != self.b_type {
            return bad(format!("A is {:?} but B is {:?}", self.a_type, self.b_type));
        }
        if self.compute == ComputeType::F16 && (self.a_type != DType::F16 || self.c_type != DType::F16) {
            return bad("f16 compute needs f16 A, B and C".into());
        }
        Ok(())
    }
    /// Elements each operand spans (for bounds checks): `(a, b, c)`.
    pub fn extents(&self) -> (usize, usize, usize) {
        let cols_a = if self.trans_a == Transpose::N { self.k } else { self.m };
        let cols_b = if self.trans_b == Transpose::N { self.n } else { self.k };
        let last = self.batch - 1;
        (
            last * self.stride_a + self.lda * (cols_a - 1) + if self.trans_a == Transpose::N { self.m } else { self.k },
            last * self.stride_b + self.ldb * (cols_b - 1) + if self.trans_b == Transpose::N { self.k } else { self.n },
            last * self.stride_c + self.ldc * (self.n - 1) + self.m,
        )
    }
}

/// The boundary between the engine and a device. Object safe; `Send + Sync`.
///
/// Asynchronous calls take a [`Stream`]; on the emulator they run immediately in call order,
/// on HIP they are queued. Between [`GpuApi::begin_capture`] and [`GpuApi::end_capture`] work
/// issued on the capturing stream is recorded, not run; [`GpuApi::launch_graph`] replays it,
/// reading device buffers (and host buffers) at replay time and kernel arguments as captured.
pub trait GpuApi: Send + Sync {
    fn info(&self) -> &DeviceInfo;

    // ---- modules and kernels
    /// Loads the embedded code object for this device's architecture.
    fn load_module(&self) -> Result<Module> {
        let co = code_object_for_arch(&self.info().arch)?;
        self.load_module_data(co)
    }
    /// Loads a given code object (tests, tools).
    fn load_module_data(&self, code_object: &[u8]) -> Result<Module>;
    /// Looks a kernel up and checks its metadata against `spec` ([`check_spec`]).
    fn function(&self, module: &Module, spec: &KernelSpec) -> Result<Kernel>;

    // ---- device memory
    /// Device memory; more than is free is [`GpuError::OutOfMemory`].
    fn malloc(&self, bytes: usize) -> Result<DevicePtr>;
    fn free(&self, ptr: DevicePtr) -> Result<()>;
    /// Free and total device memory now (`hipMemGetInfo`), for sizing the expert cache.
    fn mem_info(&self) -> Result<MemInfo>;

    // ---- host memory
    /// Pinned host memory (`hipHostMalloc`), optionally device-mapped; with
    /// `allow_pageable_fallback`, a failed pin returns pageable memory and says why.
    fn host_alloc(&self, bytes: usize, opts: HostAllocOptions) -> Result<HostBuf>;
    fn host_free(&self, buf: HostBuf) -> Result<()>;
    fn host_write(&self, buf: &HostBuf, offset: usize, src: &[u8]) -> Result<()>;
    fn host_read(&self, buf: &HostBuf, offset: usize, dst: &mut [u8]) -> Result<()>;
    /// Pins `len` bytes of host memory from `ptr` and maps them into the device's address space
    /// (`hipHostRegister` mapped, then `hipHostGetDevicePointer`), so kernels read them over
    /// PCIe without a copy: how `--pcie-frac` reads experts kept in RAM. The software device
    /// models it as a device-visible copy taken now, which is the same thing for bytes that
    /// never change (weights).
    ///
    /// # Safety
    /// `[ptr, ptr + len)` is readable memory of this process that stays mapped and unchanged
    /// until [`GpuApi::host_unregister`].
    unsafe fn host_register(&self, ptr: *const u8, len: usize) -> Result<HostRegion> {
        let _ = (ptr, len);
        Err(error::invalid("host_register", "this device cannot map host memory"))
    }
    /// Ends a [`GpuApi::host_register`] (after the device is done reading it).
    fn host_unregister(&self, region: HostRegion) -> Result<()> {
        let _ = region;
        Err(error::invalid("host_unregister", "this device cannot map host memory"))
    }

    // ---- synchronous copies (complete on return)
    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()>;
    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()>;
    fn memcpy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;
    fn memset(&self, dst: DevicePtr, byte: u8, bytes: usize) -> Result<()>;

    // ---- copies on a stream (host side must be a HostBuf that outlives the copy)
    fn memcpy_htod_async(
        &self,
        stream: &Stream,
        dst: DevicePtr,
        src: &HostBuf,
        offset: usize,
        bytes: usize,
    ) -> Result<()>;
    fn memcpy_dtoh_async(
        &self,
        stream: &Stream,
        dst: &HostBuf,
        offset: usize,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<()>;
    fn memcpy_dtod_async(&self, stream: &Stream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;
    fn memset_async(&self, stream: &Stream, dst: DevicePtr, byte: u8, bytes: usize) -> Result<()>;

    // ---- streams and events
    fn stream_create(&self) -> Result<Stream>;
    fn stream_destroy(&self, stream: Stream) -> Result<()>;
    fn stream_synchronize(&self, stream: &Stream) -> Result<()>;
    fn stream_wait_event(&self, stream: &Stream, event: &Event) -> Result<()>;
    fn event_create(&self) -> Result<Event>;
    fn event_destroy(&self, event: Event) -> Result<()>;
    fn event_record(&self, event: &Event, stream: &Stream) -> Result<()>;
    fn event_synchronize(&self, event: &Event) -> Result<()>;
    /// Waits for all work on the device.
    fn synchronize(&self) -> Result<()>;

    // ---- sequence words (mapped-memory handoff, see [`handoff`])
    /// Makes `stream` wait until the u64 at `ptr` (device memory or a mapped host buffer's
    /// [`HostBuf::device_ptr`]) satisfies `cond` against `value` (`hipStreamWaitValue64`). On
    /// the software device the calling thread polls (up to [`handoff::WAIT_TIMEOUT`]).
    fn stream_wait_value64(&self, stream: &Stream, ptr: DevicePtr, value: u64, cond: WaitCond) -> Result<()>;
    /// Writes `value` to the u64 at `ptr` after all earlier work of `stream` (`hipStreamWriteValue64`).
    fn stream_write_value64(&self, stream: &Stream, ptr: DevicePtr, value: u64) -> Result<()>;
    /// Acquire-load of a u64 in a host buffer (a sequence word written by the device).
    fn host_load_u64(&self, buf: &HostBuf, offset: usize) -> Result<u64>;
    /// Release-store of a u64 in a host buffer (everything written before is visible first).
    fn host_store_u64(&self, buf: &HostBuf, offset: usize, value: u64) -> Result<()>;

    // ---- kernels
    /// Launches after [`check_launch`] (kernarg length, block size, LDS, empty grid).
    fn launch(&self, stream: &Stream, kernel: &Kernel, cfg: &LaunchConfig, kernargs: &[u8]) -> Result<()>;

    // ---- graphs
    fn begin_capture(&self, stream: &Stream) -> Result<()>;
    /// Ends the capture and instantiates the graph.
    fn end_capture(&self, stream: &Stream) -> Result<Graph>;
    fn launch_graph(&self, graph: &Graph, stream: &Stream) -> Result<()>;
    fn graph_destroy(&self, graph: Graph) -> Result<()>;

    // ---- dense GEMM
    fn gemm(&self, stream: &Stream, g: &Gemm) -> Result<()>;

    // ---- hipBLASLt (optional; see gpu::calibrate)
    /// Up to `max` candidate algorithms for `g` (hipBLASLt's heuristic on HIP). Backends
    /// without hipBLASLt return an error saying why.
    fn gemm_lt_candidates(&self, g: &Gemm, max: usize) -> Result<Vec<LtAlgo>> {
        let _ = (g, max);
        Err(GpuError::Gemm(format!("hipBLASLt unavailable on {}", self.info().runtime)))
    }
    /// `g` with algorithm `algo` and `workspace_bytes` of device workspace at `workspace`
    /// (0/0 when the algorithm needs none). Same semantics as [`GpuApi::gemm`].
    fn gemm_lt(
        &self,
        stream: &Stream,
        g: &Gemm,
        algo: &LtAlgo,
        workspace: DevicePtr,
        workspace_bytes: usize,
    ) -> Result<()> {
        let _ = (stream, g, algo, workspace, workspace_bytes);
        Err(GpuError::Gemm(format!("hipBLASLt unavailable on {}", self.info().runtime)))
    }

    // ---- timing
    /// An event that can be timed with [`GpuApi::event_elapsed_ms`] (HIP: `hipEventDefault`).
    fn event_create_timing(&self) -> Result<Event> {
        self.event_create()
    }
    /// Milliseconds between two completed timing events; `None` when the backend has no
    /// device timer (the software device runs synchronously: callers use the wall clock).
    fn event_elapsed_ms(&self, start: &Event, end: &Event) -> Result<Option<f32>> {
        let _ = (start, end);
        Ok(None)
    }

    /// Counters summed over the launches since the last call (emulator only; HIP: None).
    fn take_stats(&self) -> Option<LaunchStats> {
        None
    }
}
