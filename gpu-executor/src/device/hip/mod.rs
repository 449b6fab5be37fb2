//! [`GpuApi`] over the HIP runtime, opened at run time (no ROCm needed to build).
//!
//! Opening ([`HipApi::open`]):
//! 1. `libamdhip64.so` (then `.so.7`, `.so.6`) from `$ROCM_PATH/lib`, `/opt/rocm/lib`, then the
//!    system library path; when none exists, the same places for `.so.5` / `.so.4`, which
//!    step 2 then reports as too old; nothing at all → [`GpuError::LibraryNotFound`] naming
//!    every place searched.
//! 2. `hipRuntimeGetVersion`: below 6.0 → [`GpuError::RuntimeTooOld`]; then the function table
//!    ([`ffi::HipFns`]), a missing symbol → [`GpuError::MissingSymbol`].
//! 3. `hipInit`, `hipGetDeviceCount` (no device → [`GpuError::NoDevice`]), `hipSetDevice`.
//!    Device selection is the runtime's: `HIP_VISIBLE_DEVICES` / `ROCR_VISIBLE_DEVICES` hide
//!    devices before we see them, and [`HipConfig::device`] indexes the visible ones.
//! 4. Architecture: `hipDeviceProp_t` is large and its layout changed in ROCm 6.0 (the `R0600`
//!    struct, 1472 bytes, kept by 7.x). We call `hipGetDevicePropertiesR0600` into a zeroed
//!    4 KiB buffer (room for growth) and read only `name` (offset 0) and `gcnArchName`
//!    (offset 1160, 256 bytes). The layout is verified at run time: the `name` read must equal
//!    `hipDeviceGetName`'s and `gcnArchName` must start with `gfx`, else the device is refused
//!    with a message naming the runtime version rather than misread.
//!    Wave size and CU count come from `hipDeviceGetAttribute`, VRAM from `hipDeviceTotalMem`.
//! 5. Checks: gfx11 arch with an embedded code object, wave32, VRAM ≥ [`HipConfig::min_vram_bytes`];
//!    otherwise [`GpuError::UnsupportedDevice`] naming the GPU, arch, library and version.
//! 6. hipBLAS and hipBLASLt are optional: when missing, GEMM returns an error saying so and
//!    everything else works. hipBLASLt ([`ffi::LtFns`]) is opened, a handle created and its
//!    version read (`hipblasLtGetVersion`) at open; any failure leaves it off with the reason
//!    (`gemm_lt*` report it) and `DeviceInfo::blas_lt_version` None.
mod blas_lt;
pub mod ffi;

use blas_lt::{Lt, lt_check, open_lt};

use super::error::{GpuError, Result, invalid};
use super::kernel_check::{check_launch, check_spec, kernarg_extent};
use super::{
    ComputeType, DType, Device, DeviceInfo, DevicePtr, Event, Gemm, GpuApi, Graph, HostAllocOptions, HostBuf,
    HostRegion, HostStorage, Kernel, KernelSpec, LaunchConfig, LtAlgo, MemInfo, Module, Stream, Transpose, WaitCond,
    arch_base, code_object_for_arch, embedded_archs,
};
use ffi::*;
use libloading::Library;
use std::ffi::{CStr, CString, c_char, c_void};
use std::path::PathBuf;
use std::sync::Mutex;

/// Offsets in `hipDeviceProp_tR0600` (ROCm 6.0+; see the module docs).
const PROP_NAME_OFFSET: usize = 0;
const PROP_GCN_ARCH_OFFSET: usize = 1160;
const PROP_BUF_BYTES: usize = 4096;
/// Runtime file names this build speaks, searched first everywhere.
pub const HIP_NAMES: [&str; 3] = ["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"];
/// Older runtimes, opened only when none of [`HIP_NAMES`] exists, to report their version.
pub const HIP_OLD_NAMES: [&str; 2] = ["libamdhip64.so.5", "libamdhip64.so.4"];
/// Largest workspace a hipBLASLt candidate may ask for (the heuristic's preference).
pub const LT_MAX_WORKSPACE: usize = 32 << 20;

/// Where and what to open.
#[derive(Clone, Debug)]
pub struct HipConfig {
    /// Directories searched first, in order.
    pub lib_dirs: Vec<PathBuf>,
    /// Then try bare library names through the dynamic loader's path.
    pub system_search: bool,
    /// Index among the visible devices.
    pub device: u32,
    /// Refuse smaller cards.
    pub min_vram_bytes: u64,
}

impl HipConfig {
    /// `$ROCM_PATH/lib`, `/opt/rocm/lib`, the system path; device `STRATA_HIP_DEVICE` (default 0).
    pub fn from_env() -> Self {
        let mut lib_dirs = Vec::new();
        if let Some(r) = std::env::var_os("ROCM_PATH") {
            lib_dirs.push(PathBuf::from(r).join("lib"));
        }
        lib_dirs.push(PathBuf::from("/opt/rocm/lib"));
        let device = std::env::var("STRATA_HIP_DEVICE").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        HipConfig { lib_dirs, system_search: true, device, min_vram_bytes: 2 << 30 }
    }
    /// Only `dir` (tests with a stand-in library).
    pub fn only_dir(dir: impl Into<PathBuf>) -> Self {
        HipConfig { lib_dirs: vec![dir.into()], system_search: false, device: 0, min_vram_bytes: 2 << 30 }
    }
}

/// hipBLAS, resolved at open; the handle is created at the first GEMM (rocBLAS start-up is slow).
struct Blas {
    fns: BlasFns,
    gemm: GemmExFn,
    handle: Mutex<usize>,
    _lib: Library,
}

/// The HIP implementation of [`GpuApi`].
pub struct HipApi {
    fns: HipFns,
    host_alloc_fn: HostAllocFn,
    wait_value64: Option<WaitValue64Fn>,
    write_value64: Option<WriteValue64Fn>,
    info: DeviceInfo,
    blas: std::result::Result<Blas, String>,
    lt: std::result::Result<Lt, String>,
    event_elapsed: Option<EventElapsedFn>,
    // Declared last: dropped after everything that points into it.
    _lib: Library,
}

fn as_ptr(p: DevicePtr) -> Ptr {
    p as usize as Ptr
}

fn cstr_at(buf: &[u8], off: usize, max: usize) -> String {
    let s = &buf[off..(off + max).min(buf.len())];
    let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
    String::from_utf8_lossy(&s[..end]).into_owned()
}

/// `HIP_VERSION` encoding: major * 10^7 + minor * 10^5 + patch.
fn version_string(v: i32) -> (i32, String) {
    let major = v / 10_000_000;
    (major, format!("{}.{}.{}", major, (v / 100_000) % 100, v % 100_000))
}

/// Which hipBLAS GEMM symbol speaks `hipDataType` (see `ffi` docs); Err = why GEMM is off.
fn open_blas(cfg: &HipConfig) -> std::result::Result<(Blas, String), String> {
    let names = ["libhipblas.so", "libhipblas.so.3", "libhipblas.so.2"];
    let (lib, path) =
        open_library("libhipblas", &names, &cfg.lib_dirs, cfg.system_search).map_err(|e| e.to_string())?;
    let fns = BlasFns::load(&lib, &path).map_err(|e| e.to_string())?;
    // SAFETY: GemmExFn is the C signature of both symbols (hipDataType flavour).
    let v2: Option<GemmExFn> = unsafe { sym_opt(&lib, "hipblasGemmStridedBatchedEx_v2") };
    let real = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
    let file = real.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let major: Option<u32> =
        file.strip_prefix("libhipblas.so.").and_then(|v| v.split('.').next()).and_then(|m| m.parse().ok());
    let (gemm, flavour) = match (v2, major) {
        (Some(f), _) => (f, "hipBLAS 2.x, hipblasGemmStridedBatchedEx_v2"),
        (None, Some(m)) if m >= 3 => {
            // SAFETY: in hipBLAS >= 3 the un-suffixed symbol has the hipDataType signature.
            let f: GemmExFn =
                unsafe { sym(&lib, &path, "libhipblas", "hipblasGemmStridedBatchedEx") }.map_err(|e| e.to_string())?;
            (f, "hipBLAS 3.x, hipblasGemmStridedBatchedEx")
        }
        _ => {
            return Err(format!(
                "{} has no hipDataType GEMM (hipblasGemmStridedBatchedEx_v2 missing and not hipBLAS >= 3): hipBLAS 2.0 (ROCm 6.0) or newer is needed",
                real.display()
            ));
        }
    };
    let desc = format!("{flavour} at {}", real.display());
    Ok((Blas { fns, gemm, handle: Mutex::new(0), _lib: lib }, desc))
}

impl HipApi {
    /// Opens the runtime and checks the device (see the module docs for every step).
    pub fn open(cfg: &HipConfig) -> Result<Self> {
        let (lib, path) = match open_library("libamdhip64", &HIP_NAMES, &cfg.lib_dirs, cfg.system_search) {
            Ok(found) => found,
            // Only an old runtime (e.g. Debian's libamdhip64.so.5): open it to say so by version.
            Err(not_found @ GpuError::LibraryNotFound { .. }) => {
                open_library("libamdhip64", &HIP_OLD_NAMES, &cfg.lib_dirs, cfg.system_search).map_err(|_| not_found)?
            }
            Err(e) => return Err(e),
        };
        let pstr = path.display().to_string();
        // SAFETY: `hipError_t hipRuntimeGetVersion(int*)` in every HIP release.
        let get_version: unsafe extern "C" fn(*mut i32) -> HipError =
            unsafe { sym(&lib, &path, "libamdhip64", "hipRuntimeGetVersion")? };
        let mut v = 0i32;
        // SAFETY: valid out-pointer.
        let rc = unsafe { get_version(&mut v) };
        let (major, version) = version_string(v);
        if rc != 0 || major < 6 {
            return Err(GpuError::RuntimeTooOld {
                lib: "libamdhip64",
                path: pstr,
                version: if rc != 0 { format!("unknown (error {rc})") } else { version },
            });
        }
        let fns = HipFns::load(&lib, &path)?;
        // SAFETY: all three have the `(void**, size_t, unsigned)` signature.
        let host_alloc_fn: HostAllocFn = unsafe { sym_opt(&lib, "hipHostMalloc") }
            .or_else(|| unsafe { sym_opt(&lib, "hipExtHostAlloc") })
            .or_else(|| unsafe { sym_opt(&lib, "hipHostAlloc") })
            .ok_or(GpuError::MissingSymbol {
                lib: "libamdhip64",
                path: pstr.clone(),
                symbol: "hipHostMalloc",
                why: "no pinned-memory allocator",
            })?;
        let runtime = format!("HIP runtime {version} at {pstr}");
        let no_device = |why: String| GpuError::NoDevice { lib: "libamdhip64", version: version.clone(), why };

        // SAFETY (this block and below): every call passes valid out-pointers/buffers of the
        // sizes the C API documents.
        let rc = unsafe { (fns.hipInit)(0) };
        if rc == ERR_NO_DEVICE || rc == ERR_INVALID_DEVICE || rc == ERR_INSUFFICIENT_DRIVER {
            return Err(no_device(format!("hipInit: {}", err_string(&fns, rc))));
        }
        check(&fns, "hipInit", rc, String::new)?;
        let mut count = 0i32;
        let rc = unsafe { (fns.hipGetDeviceCount)(&mut count) };
        if rc == ERR_NO_DEVICE || (rc == 0 && count <= 0) {
            return Err(no_device("hipGetDeviceCount reports 0 devices".into()));
        }
        check(&fns, "hipGetDeviceCount", rc, String::new)?;
        if cfg.device as i64 >= count as i64 {
            return Err(no_device(format!("device index {} but only {count} visible", cfg.device)));
        }
        let dev = cfg.device as i32;
        check(&fns, "hipSetDevice", unsafe { (fns.hipSetDevice)(dev) }, || format!(" (device {dev})"))?;

        let mut name_buf = [0 as c_char; 256];
        check(
            &fns,
            "hipDeviceGetName",
            unsafe { (fns.hipDeviceGetName)(name_buf.as_mut_ptr(), 256, dev) },
            String::new,
        )?;
        // SAFETY: the buffer is NUL-terminated by the runtime (and zero-initialised).
        let name = unsafe { CStr::from_ptr(name_buf.as_ptr()) }.to_string_lossy().into_owned();
        let mut props = vec![0u64; PROP_BUF_BYTES / 8];
        let rc = unsafe { (fns.hipGetDevicePropertiesR0600)(props.as_mut_ptr() as *mut c_void, dev) };
        check(&fns, "hipGetDevicePropertiesR0600", rc, String::new)?;
        let pbytes: Vec<u8> = props.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let prop_name = cstr_at(&pbytes, PROP_NAME_OFFSET, 256);
        let arch = cstr_at(&pbytes, PROP_GCN_ARCH_OFFSET, 256);
        let unsupported = |arch: &str, why: String| GpuError::UnsupportedDevice {
            index: cfg.device,
            name: name.clone(),
            arch: arch.to_string(),
            lib: "libamdhip64",
            version: version.clone(),
            why,
        };
        if prop_name != name || !arch.starts_with("gfx") {
            return Err(unsupported(
                "unknown",
                format!(
                    "hipDeviceProp_tR0600 layout not as expected (name {prop_name:?}, gcnArchName {arch:?}); this runtime's ABI is not supported"
                ),
            ));
        }
        let attr = |a: u32, what: &'static str| -> Result<i32> {
            let mut v = 0i32;
            check(&fns, "hipDeviceGetAttribute", unsafe { (fns.hipDeviceGetAttribute)(&mut v, a, dev) }, || {
                format!(" ({what})")
            })?;
            Ok(v)
        };
        let wave_size = attr(ATTR_WARP_SIZE, "warp size")? as u32;
        let compute_units = attr(ATTR_MULTIPROCESSOR_COUNT, "multiprocessor count")?.max(0) as u32;
        let mut vram = 0usize;
        check(&fns, "hipDeviceTotalMem", unsafe { (fns.hipDeviceTotalMem)(&mut vram, dev) }, String::new)?;

        let base = arch_base(&arch);
        if !base.starts_with("gfx11") {
            return Err(unsupported(
                &arch,
                format!("not an RDNA3 (gfx11) GPU; this build's kernels are for {}", embedded_archs().join(", ")),
            ));
        }
        if let Err(e) = code_object_for_arch(&arch) {
            return Err(unsupported(&arch, e.to_string()));
        }
        if wave_size != 32 {
            return Err(unsupported(&arch, format!("wavefront size {wave_size}; the kernels are wave32")));
        }
        if (vram as u64) < cfg.min_vram_bytes {
            return Err(unsupported(
                &arch,
                format!("{} MiB of VRAM < the {} MiB minimum", vram >> 20, cfg.min_vram_bytes >> 20),
            ));
        }

        let (blas, blas_desc) = match open_blas(cfg) {
            Ok((b, d)) => (Ok(b), Some(d)),
            Err(why) => (Err(format!("hipBLAS unavailable: {why}")), None),
        };
        let (lt, lt_desc) = match open_lt(cfg) {
            Ok((l, d)) => (Ok(l), Some(d)),
            Err(why) => (Err(format!("hipBLASLt unavailable: {why}")), None),
        };
        let info = DeviceInfo {
            backend: Device::Hip,
            index: cfg.device,
            name,
            arch,
            wave_size,
            vram_bytes: vram as u64,
            compute_units,
            runtime,
            blas: blas_desc,
            blas_lt: lt_desc,
            blas_lt_version: lt.as_ref().ok().map(|l| l.version.clone()),
        };
        // SAFETY: the signatures of the ROCm 6.x/7.x headers (see ffi).
        let wait_value64 = unsafe { sym_opt::<WaitValue64Fn>(&lib, "hipStreamWaitValue64") };
        let write_value64 = unsafe { sym_opt::<WriteValue64Fn>(&lib, "hipStreamWriteValue64") };
        // SAFETY: the signature of hip_runtime_api.h (6.x and 7.x).
        let event_elapsed = unsafe { sym_opt::<EventElapsedFn>(&lib, "hipEventElapsedTime") };
        Ok(HipApi { fns, host_alloc_fn, wait_value64, write_value64, info, blas, lt, event_elapsed, _lib: lib })
    }

    /// Makes this API's device current on the calling thread (HIP's current device is per
    /// thread; device 0 is every thread's default, so this is a no-op then).
    fn bind(&self) -> Result<()> {
        if self.info.index == 0 {
            return Ok(());
        }
        // SAFETY: plain integer argument.
        self.check("hipSetDevice", unsafe { (self.fns.hipSetDevice)(self.info.index as i32) }, String::new)
    }

    fn check(&self, call: &'static str, rc: HipError, ctx: impl FnOnce() -> String) -> Result<()> {
        check(&self.fns, call, rc, ctx)
    }

    fn raw(buf: &HostBuf, call: &'static str) -> Result<*mut u8> {
        match buf.storage {
            HostStorage::Raw { ptr, .. } => Ok(ptr),
            _ => Err(invalid(call, "host buffer belongs to another backend")),
        }
    }

    fn copy(
        &self,
        call: &'static str,
        dst: Ptr,
        src: *const c_void,
        bytes: usize,
        kind: u32,
        stream: Option<&Stream>,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller validated both ranges (host slices by construction, HostBuf by
        // check_range; device pointers are the runtime's to validate).
        let rc = unsafe {
            match stream {
                Some(s) => (self.fns.hipMemcpyAsync)(dst, src, bytes, kind, as_ptr(s.0)),
                None => (self.fns.hipMemcpy)(dst, src, bytes, kind),
            }
        };
        self.check(call, rc, || format!(" ({bytes} bytes)"))
    }
}

fn err_string(fns: &HipFns, rc: HipError) -> String {
    // SAFETY: hipGetErrorString returns a static NUL-terminated string (or null).
    let p = unsafe { (fns.hipGetErrorString)(rc) };
    if p.is_null() { "unknown error".into() } else { unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned() }
}

fn check(fns: &HipFns, call: &'static str, rc: HipError, ctx: impl FnOnce() -> String) -> Result<()> {
    if rc == 0 { Ok(()) } else { Err(GpuError::Hip { call, code: rc, message: err_string(fns, rc), context: ctx() }) }
}

impl Drop for HipApi {
    fn drop(&mut self) {
        if let Ok(b) = &self.blas
            && let Ok(h) = b.handle.lock()
            && *h != 0
        {
            // SAFETY: the handle was created by hipblasCreate and is destroyed once.
            unsafe { (b.fns.hipblasDestroy)(*h as Ptr) };
        }
        if let Ok(l) = &self.lt {
            // SAFETY: created by hipblasLtCreate at open, destroyed once.
            unsafe { (l.fns.hipblasLtDestroy)(l.handle as Ptr) };
        }
    }
}

impl GpuApi for HipApi {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn load_module_data(&self, code_object: &[u8]) -> Result<Module> {
        // Metadata comes from the code object itself, parsed by the software device's ELF
        // reader (the module it builds is dropped): the same checks as on `emu`.
        let kernels = emulator::Device::new()
            .load_module(code_object)
            .map_err(super::error::emu("reading code object metadata"))?
            .kernels();
        self.bind()?;
        let mut m: Ptr = std::ptr::null_mut();
        // SAFETY: `code_object` is a complete ELF image; HIP copies it.
        let rc = unsafe { (self.fns.hipModuleLoadData)(&mut m, code_object.as_ptr() as *const c_void) };
        self.check("hipModuleLoadData", rc, || {
            format!(" ({} code object, {} bytes)", self.info.arch, code_object.len())
        })?;
        Ok(Module { id: m as usize as u64, kernels })
    }

    fn function(&self, module: &Module, spec: &KernelSpec) -> Result<Kernel> {
        let info = module
            .kernels
            .iter()
            .find(|k| k.name == spec.name)
            .cloned()
            .ok_or_else(|| GpuError::NoSuchKernel { kernel: spec.name.to_string() })?;
        check_spec(&info, spec)?;
        let cname = CString::new(spec.name).map_err(|_| invalid("function", "kernel name contains NUL"))?;
        let mut f: Ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer, module handle from hipModuleLoadData, NUL-terminated name.
        let rc = unsafe { (self.fns.hipModuleGetFunction)(&mut f, as_ptr(module.id), cname.as_ptr()) };
        self.check("hipModuleGetFunction", rc, || format!(" ({})", spec.name))?;
        Ok(Kernel { id: f as usize as u64, kernarg_bytes: kernarg_extent(&info), info })
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.bind()?;
        let mut p: Ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let rc = unsafe { (self.fns.hipMalloc)(&mut p, bytes) };
        if rc == HIP_ERROR_OUT_OF_MEMORY {
            let m = self.mem_info()?;
            return Err(GpuError::OutOfMemory { bytes, free: m.free, total: m.total });
        }
        self.check("hipMalloc", rc, || format!(" ({bytes} bytes)"))?;
        Ok(p as usize as u64)
    }
    fn mem_info(&self) -> Result<MemInfo> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        self.check("hipMemGetInfo", unsafe { (self.fns.hipMemGetInfo)(&mut free, &mut total) }, String::new)?;
        Ok(MemInfo { free: free as u64, total: total as u64 })
    }
    fn free(&self, ptr: DevicePtr) -> Result<()> {
        // SAFETY: the runtime validates the pointer.
        self.check("hipFree", unsafe { (self.fns.hipFree)(as_ptr(ptr)) }, || format!(" ({ptr:#x})"))
    }

    fn host_alloc(&self, bytes: usize, opts: HostAllocOptions) -> Result<HostBuf> {
        self.bind()?;
        let flags = if opts.mapped { HOST_MALLOC_MAPPED | HOST_MALLOC_PORTABLE } else { 0 };
        let mut p: Ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let rc = unsafe { (self.host_alloc_fn)(&mut p, bytes.max(1), flags) };
        if rc == 0 && !p.is_null() {
            let mut device_ptr = None;
            if opts.mapped {
                let mut d: Ptr = std::ptr::null_mut();
                // SAFETY: `p` is a mapped pinned allocation.
                self.check(
                    "hipHostGetDevicePointer",
                    unsafe { (self.fns.hipHostGetDevicePointer)(&mut d, p, 0) },
                    String::new,
                )?;
                device_ptr = Some(d as usize as u64);
            }
            return Ok(HostBuf {
                storage: HostStorage::Raw { ptr: p as *mut u8, pinned: true },
                bytes,
                device_ptr,
                fallback: None,
            });
        }
        let reason = format!("hipHostMalloc: {}", err_string(&self.fns, rc));
        if !opts.allow_pageable_fallback {
            return Err(GpuError::PinnedAlloc { bytes, reason });
        }
        let layout =
            std::alloc::Layout::from_size_align(bytes.max(1), 64).map_err(|e| invalid("host_alloc", e.to_string()))?;
        // SAFETY: non-zero size layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(GpuError::PinnedAlloc {
                bytes,
                reason: format!("{reason}; pageable fallback allocation failed too"),
            });
        }
        Ok(HostBuf {
            storage: HostStorage::Raw { ptr, pinned: false },
            bytes,
            device_ptr: None,
            fallback: Some(format!("pinned allocation of {bytes} bytes failed ({reason}); using pageable memory")),
        })
    }
    fn host_free(&self, buf: HostBuf) -> Result<()> {
        match buf.storage {
            // SAFETY: allocated by the host allocator above; hipHostFree waits for the device.
            HostStorage::Raw { ptr, pinned: true } => {
                self.check("hipHostFree", unsafe { (self.fns.hipHostFree)(ptr as Ptr) }, String::new)
            }
            HostStorage::Raw { ptr, pinned: false } => {
                self.synchronize()?; // an async copy may still read it
                let layout = std::alloc::Layout::from_size_align(buf.bytes.max(1), 64)
                    .map_err(|e| invalid("host_free", e.to_string()))?;
                // SAFETY: same layout as the allocation in host_alloc.
                unsafe { std::alloc::dealloc(ptr, layout) };
                Ok(())
            }
            _ => Err(invalid("host_free", "host buffer belongs to another backend")),
        }
    }
    fn host_write(&self, buf: &HostBuf, offset: usize, src: &[u8]) -> Result<()> {
        buf.check_range("host_write", offset, src.len())?;
        let p = Self::raw(buf, "host_write")?;
        // SAFETY: range checked against the allocation; `src` cannot overlap host memory we own.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p.add(offset), src.len()) };
        Ok(())
    }
    fn host_read(&self, buf: &HostBuf, offset: usize, dst: &mut [u8]) -> Result<()> {
        buf.check_range("host_read", offset, dst.len())?;
        let p = Self::raw(buf, "host_read")?;
        // SAFETY: range checked against the allocation.
        unsafe { std::ptr::copy_nonoverlapping(p.add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn host_register(&self, ptr: *const u8, len: usize) -> Result<HostRegion> {
        self.bind()?;
        // SAFETY: the caller's contract ([`GpuApi::host_register`]): the range is mapped memory
        // of this process that outlives the registration.
        let rc = unsafe { (self.fns.hipHostRegister)(ptr as Ptr, len, HOST_REGISTER_MAPPED) };
        if rc != 0 {
            return Err(GpuError::PinnedAlloc {
                bytes: len,
                reason: format!("hipHostRegister: {}", err_string(&self.fns, rc)),
            });
        }
        let mut d: Ptr = std::ptr::null_mut();
        // SAFETY: `ptr` was registered mapped just above.
        let got = self.check(
            "hipHostGetDevicePointer",
            unsafe { (self.fns.hipHostGetDevicePointer)(&mut d, ptr as Ptr, 0) },
            String::new,
        );
        if let Err(e) = got {
            // SAFETY: registered above, not yet used by any kernel.
            let _ = unsafe { (self.fns.hipHostUnregister)(ptr as Ptr) };
            return Err(e);
        }
        Ok(HostRegion { device_ptr: d as usize as u64, bytes: len, handle: ptr as usize as u64 })
    }
    fn host_unregister(&self, region: HostRegion) -> Result<()> {
        self.synchronize()?; // a queued kernel may still read it
        // SAFETY: `handle` is the address `host_register` registered.
        self.check(
            "hipHostUnregister",
            unsafe { (self.fns.hipHostUnregister)(region.handle as usize as Ptr) },
            String::new,
        )
    }

    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.copy("hipMemcpy(HostToDevice)", as_ptr(dst), src.as_ptr() as *const c_void, src.len(), H2D, None)
    }
    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.copy("hipMemcpy(DeviceToHost)", dst.as_mut_ptr() as Ptr, as_ptr(src), dst.len(), D2H, None)
    }
    fn memcpy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.copy("hipMemcpy(DeviceToDevice)", as_ptr(dst), as_ptr(src), bytes, D2D, None)
    }
    fn memset(&self, dst: DevicePtr, byte: u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the runtime validates the device range.
        self.check("hipMemset", unsafe { (self.fns.hipMemset)(as_ptr(dst), byte as i32, bytes) }, || {
            format!(" ({bytes} bytes)")
        })
    }

    fn memcpy_htod_async(
        &self,
        stream: &Stream,
        dst: DevicePtr,
        src: &HostBuf,
        offset: usize,
        bytes: usize,
    ) -> Result<()> {
        src.check_range("memcpy_htod_async", offset, bytes)?;
        // SAFETY: offset within the checked range.
        let p = unsafe { Self::raw(src, "memcpy_htod_async")?.add(offset) };
        self.copy("hipMemcpyAsync(HostToDevice)", as_ptr(dst), p as *const c_void, bytes, H2D, Some(stream))
    }
    fn memcpy_dtoh_async(
        &self,
        stream: &Stream,
        dst: &HostBuf,
        offset: usize,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<()> {
        dst.check_range("memcpy_dtoh_async", offset, bytes)?;
        // SAFETY: offset within the checked range.
        let p = unsafe { Self::raw(dst, "memcpy_dtoh_async")?.add(offset) };
        self.copy("hipMemcpyAsync(DeviceToHost)", p as Ptr, as_ptr(src), bytes, D2H, Some(stream))
    }
    fn memcpy_dtod_async(&self, stream: &Stream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.copy("hipMemcpyAsync(DeviceToDevice)", as_ptr(dst), as_ptr(src), bytes, D2D, Some(stream))
    }
    fn memset_async(&self, stream: &Stream, dst: DevicePtr, byte: u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the runtime validates the device range and stream.
        let rc = unsafe { (self.fns.hipMemsetAsync)(as_ptr(dst), byte as i32, bytes, as_ptr(stream.0)) };
        self.check("hipMemsetAsync", rc, || format!(" ({bytes} bytes)"))
    }

    fn stream_create(&self) -> Result<Stream> {
        self.bind()?;
        let mut s: Ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.check(
            "hipStreamCreateWithFlags",
            unsafe { (self.fns.hipStreamCreateWithFlags)(&mut s, STREAM_NON_BLOCKING) },
            String::new,
        )?;
        Ok(Stream(s as usize as u64))
    }
    fn stream_destroy(&self, stream: Stream) -> Result<()> {
        // SAFETY: handle from hipStreamCreateWithFlags, consumed here.
        self.check("hipStreamDestroy", unsafe { (self.fns.hipStreamDestroy)(as_ptr(stream.0)) }, String::new)
    }
    fn stream_synchronize(&self, stream: &Stream) -> Result<()> {
        // SAFETY: stream handle (or null = default stream).
        self.check("hipStreamSynchronize", unsafe { (self.fns.hipStreamSynchronize)(as_ptr(stream.0)) }, String::new)
    }
    fn stream_wait_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        // SAFETY: handles from this API.
        self.check(
            "hipStreamWaitEvent",
            unsafe { (self.fns.hipStreamWaitEvent)(as_ptr(stream.0), as_ptr(event.0), 0) },
            String::new,
        )
    }
    fn event_create(&self) -> Result<Event> {
        self.bind()?;
        let mut e: Ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.check(
            "hipEventCreateWithFlags",
            unsafe { (self.fns.hipEventCreateWithFlags)(&mut e, EVENT_DISABLE_TIMING) },
            String::new,
        )?;
        Ok(Event(e as usize as u64))
    }
    fn event_destroy(&self, event: Event) -> Result<()> {
        // SAFETY: handle from hipEventCreateWithFlags, consumed here.
        self.check("hipEventDestroy", unsafe { (self.fns.hipEventDestroy)(as_ptr(event.0)) }, String::new)
    }
    fn event_record(&self, event: &Event, stream: &Stream) -> Result<()> {
        // SAFETY: handles from this API.
        self.check(
            "hipEventRecord",
            unsafe { (self.fns.hipEventRecord)(as_ptr(event.0), as_ptr(stream.0)) },
            String::new,
        )
    }
    fn event_synchronize(&self, event: &Event) -> Result<()> {
        // SAFETY: handle from this API.
        self.check("hipEventSynchronize", unsafe { (self.fns.hipEventSynchronize)(as_ptr(event.0)) }, String::new)
    }
    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: no arguments.
        self.check("hipDeviceSynchronize", unsafe { (self.fns.hipDeviceSynchronize)() }, String::new)
    }

    fn stream_wait_value64(&self, stream: &Stream, ptr: DevicePtr, value: u64, cond: WaitCond) -> Result<()> {
        let flags = if cond == WaitCond::Ge { WAIT_VALUE_GTE } else { WAIT_VALUE_EQ };
        let f = self
            .wait_value64
            .ok_or_else(|| invalid("stream_wait_value64", "this HIP runtime lacks hipStreamWaitValue64"))?;
        // SAFETY: stream from this API; `ptr` is device or mapped memory (the runtime checks).
        self.check(
            "hipStreamWaitValue64",
            unsafe { f(as_ptr(stream.0), as_ptr(ptr), value, flags, u64::MAX) },
            String::new,
        )
    }
    fn stream_write_value64(&self, stream: &Stream, ptr: DevicePtr, value: u64) -> Result<()> {
        let f = self
            .write_value64
            .ok_or_else(|| invalid("stream_write_value64", "this HIP runtime lacks hipStreamWriteValue64"))?;
        // SAFETY: as above.
        self.check("hipStreamWriteValue64", unsafe { f(as_ptr(stream.0), as_ptr(ptr), value, 0) }, String::new)
    }
    fn host_load_u64(&self, buf: &HostBuf, offset: usize) -> Result<u64> {
        buf.check_range("host_load_u64", offset, 8)?;
        if !offset.is_multiple_of(8) {
            return Err(invalid("host_load_u64", format!("offset {offset} is not 8-byte aligned")));
        }
        let p = Self::raw(buf, "host_load_u64")?;
        // SAFETY: in range and aligned (allocations are at least 64-byte aligned); volatile
        // because the device writes this word behind the compiler's back.
        let v = unsafe { std::ptr::read_volatile(p.add(offset) as *const u64) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        Ok(u64::from_le(v))
    }
    fn host_store_u64(&self, buf: &HostBuf, offset: usize, value: u64) -> Result<()> {
        buf.check_range("host_store_u64", offset, 8)?;
        if !offset.is_multiple_of(8) {
            return Err(invalid("host_store_u64", format!("offset {offset} is not 8-byte aligned")));
        }
        let p = Self::raw(buf, "host_store_u64")?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: in range and aligned; volatile so the store is not elided or merged.
        unsafe { std::ptr::write_volatile(p.add(offset) as *mut u64, value.to_le()) };
        Ok(())
    }

    fn launch(&self, stream: &Stream, kernel: &Kernel, cfg: &LaunchConfig, kernargs: &[u8]) -> Result<()> {
        check_launch(&kernel.info, cfg, kernargs)?;
        self.bind()?;
        let mut size = kernargs.len();
        // The `extra` form passes the packed argument buffer as is (HIP copies it at launch,
        // also when the launch is captured into a graph).
        let mut extra: [Ptr; 5] = [
            LAUNCH_PARAM_BUFFER_POINTER as Ptr,
            kernargs.as_ptr() as Ptr,
            LAUNCH_PARAM_BUFFER_SIZE as Ptr,
            &mut size as *mut usize as Ptr,
            LAUNCH_PARAM_END as Ptr,
        ];
        let [gx, gy, gz] = cfg.grid;
        let [bx, by, bz] = cfg.block;
        // SAFETY: function handle from hipModuleGetFunction; `extra` and `size` outlive the call.
        let rc = unsafe {
            (self.fns.hipModuleLaunchKernel)(
                as_ptr(kernel.id),
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                cfg.dynamic_lds,
                as_ptr(stream.0),
                std::ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        };
        self.check("hipModuleLaunchKernel", rc, || {
            format!(" ({} grid {:?} block {:?} lds {})", kernel.info.name, cfg.grid, cfg.block, cfg.dynamic_lds)
        })
    }

    fn begin_capture(&self, stream: &Stream) -> Result<()> {
        if stream.0 == 0 {
            return Err(GpuError::Capture("the default stream cannot be captured; create a stream".into()));
        }
        // SAFETY: stream handle from this API.
        self.check(
            "hipStreamBeginCapture",
            unsafe { (self.fns.hipStreamBeginCapture)(as_ptr(stream.0), CAPTURE_MODE_THREAD_LOCAL) },
            String::new,
        )
    }
    fn end_capture(&self, stream: &Stream) -> Result<Graph> {
        let mut g: Ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer, capturing stream.
        self.check(
            "hipStreamEndCapture",
            unsafe { (self.fns.hipStreamEndCapture)(as_ptr(stream.0), &mut g) },
            String::new,
        )?;
        let mut exec: Ptr = std::ptr::null_mut();
        // SAFETY: graph from hipStreamEndCapture; no error-node/log buffers requested.
        let rc = unsafe { (self.fns.hipGraphInstantiate)(&mut exec, g, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        // The executable graph is independent of the template graph: release the template.
        // SAFETY: `g` is destroyed exactly once.
        unsafe { (self.fns.hipGraphDestroy)(g) };
        self.check("hipGraphInstantiate", rc, String::new)?;
        Ok(Graph(exec as usize as u64))
    }
    fn launch_graph(&self, graph: &Graph, stream: &Stream) -> Result<()> {
        // SAFETY: executable graph and stream handles from this API.
        self.check(
            "hipGraphLaunch",
            unsafe { (self.fns.hipGraphLaunch)(as_ptr(graph.0), as_ptr(stream.0)) },
            String::new,
        )
    }
    fn graph_destroy(&self, graph: Graph) -> Result<()> {
        // SAFETY: executable graph handle, consumed here.
        self.check("hipGraphExecDestroy", unsafe { (self.fns.hipGraphExecDestroy)(as_ptr(graph.0)) }, String::new)
    }

    fn gemm(&self, stream: &Stream, g: &Gemm) -> Result<()> {
        g.validate()?;
        let blas = self.blas.as_ref().map_err(|why| GpuError::Gemm(why.clone()))?;
        self.bind()?;
        let mut h = blas.handle.lock().map_err(|_| GpuError::Gemm("hipBLAS handle lock poisoned".into()))?;
        let bcheck = |call: &'static str, s: i32| -> Result<()> {
            if s == 0 {
                Ok(())
            } else {
                Err(GpuError::Blas { call, status: s, name: blas_status_name(s), context: String::new() })
            }
        };
        if *h == 0 {
            let mut p: Ptr = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            bcheck("hipblasCreate", unsafe { (blas.fns.hipblasCreate)(&mut p) })?;
            *h = p as usize;
        }
        let handle = *h as Ptr;
        // SAFETY: handle from hipblasCreate, stream from this API (or null).
        bcheck("hipblasSetStream", unsafe { (blas.fns.hipblasSetStream)(handle, as_ptr(stream.0)) })?;
        let dt = |t: DType| match t {
            DType::F32 => HIP_R_32F,
            DType::F16 => HIP_R_16F,
            DType::BF16 => HIP_R_16BF,
        };
        let op = |t: Transpose| if t == Transpose::N { HIPBLAS_OP_N } else { HIPBLAS_OP_T };
        // Scalars have the compute type (host pointer mode, hipBLAS's default).
        let (a32, b32) = (g.alpha, g.beta);
        let (a16, b16) = (quant::f32_to_f16(g.alpha), quant::f32_to_f16(g.beta));
        let (alpha, beta, compute): (*const c_void, *const c_void, u32) = match g.compute {
            ComputeType::F32 => (&a32 as *const f32 as _, &b32 as *const f32 as _, HIPBLAS_COMPUTE_32F),
            ComputeType::F16 => (&a16 as *const u16 as _, &b16 as *const u16 as _, HIPBLAS_COMPUTE_16F),
        };
        // SAFETY: sizes were validated to fit i32; device pointers are the runtime's to check;
        // the scalars outlive the (host pointer mode) call.
        let s = unsafe {
            (blas.gemm)(
                handle,
                op(g.trans_a),
                op(g.trans_b),
                g.m as i32,
                g.n as i32,
                g.k as i32,
                alpha,
                as_ptr(g.a),
                dt(g.a_type),
                g.lda as i32,
                g.stride_a as i64,
                as_ptr(g.b),
                dt(g.b_type),
                g.ldb as i32,
                g.stride_b as i64,
                beta,
                as_ptr(g.c),
                dt(g.c_type),
                g.ldc as i32,
                g.stride_c as i64,
                g.batch as i32,
                compute,
                HIPBLAS_GEMM_DEFAULT,
            )
        };
        bcheck("hipblasGemmStridedBatchedEx", s).map_err(|e| match e {
            GpuError::Blas { call, status, name, .. } => GpuError::Blas {
                call,
                status,
                name,
                context: format!(" (m={} n={} k={} batch={})", g.m, g.n, g.k, g.batch),
            },
            e => e,
        })
    }

    fn gemm_lt_candidates(&self, g: &Gemm, max: usize) -> Result<Vec<LtAlgo>> {
        g.validate()?;
        let lt = self.lt.as_ref().map_err(|why| GpuError::Gemm(why.clone()))?;
        self.bind()?;
        let p = lt.problem(g)?;
        let max = max.clamp(1, 1024);
        let mut pref: Ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        lt_check("hipblasLtMatmulPreferenceCreate", unsafe { (lt.fns.hipblasLtMatmulPreferenceCreate)(&mut pref) }, g)?;
        let ws: u64 = LT_MAX_WORKSPACE as u64;
        let mut results = vec![0u64; max * LT_HEURISTIC_BYTES / 8];
        let mut count = 0i32;
        // SAFETY: uint64 attribute; `results` holds `max` 56-byte heuristic records (8-aligned);
        // the descriptors come from `problem` (C doubles as D).
        let rc = unsafe {
            let r = (lt.fns.hipblasLtMatmulPreferenceSetAttribute)(
                pref,
                LT_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as _,
                8,
            );
            if r != 0 {
                r
            } else {
                (lt.fns.hipblasLtMatmulAlgoGetHeuristic)(
                    lt.handle as Ptr,
                    p.desc,
                    p.layouts[0],
                    p.layouts[1],
                    p.layouts[2],
                    p.layouts[2],
                    pref,
                    max as i32,
                    results.as_mut_ptr() as *mut c_void,
                    &mut count,
                )
            }
        };
        // SAFETY: created above, destroyed once.
        unsafe { (lt.fns.hipblasLtMatmulPreferenceDestroy)(pref) };
        lt_check("hipblasLtMatmulAlgoGetHeuristic", rc, g)?;
        let bytes: Vec<u8> = results.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let count = (count.max(0) as usize).min(max);
        let mut out = Vec::new();
        for (i, r) in bytes.chunks_exact(LT_HEURISTIC_BYTES).take(count).enumerate() {
            let state =
                i32::from_ne_bytes(r[LT_HEURISTIC_STATE_OFFSET..LT_HEURISTIC_STATE_OFFSET + 4].try_into().expect("4"));
            if state != 0 {
                continue;
            }
            let workspace = u64::from_ne_bytes(
                r[LT_HEURISTIC_WORKSPACE_OFFSET..LT_HEURISTIC_WORKSPACE_OFFSET + 8].try_into().expect("8"),
            ) as usize;
            out.push(LtAlgo { index: i as u32, bytes: r[..LT_ALGO_BYTES].to_vec(), workspace });
        }
        Ok(out)
    }

    fn gemm_lt(
        &self,
        stream: &Stream,
        g: &Gemm,
        algo: &LtAlgo,
        workspace: DevicePtr,
        workspace_bytes: usize,
    ) -> Result<()> {
        g.validate()?;
        let lt = self.lt.as_ref().map_err(|why| GpuError::Gemm(why.clone()))?;
        if algo.bytes.len() != LT_ALGO_BYTES {
            return Err(GpuError::Gemm(format!(
                "hipBLASLt algorithm of {} bytes (hipblasLtMatmulAlgo_t has {LT_ALGO_BYTES})",
                algo.bytes.len()
            )));
        }
        if workspace_bytes < algo.workspace {
            return Err(GpuError::Gemm(format!(
                "hipBLASLt algorithm needs {} workspace bytes, {workspace_bytes} given",
                algo.workspace
            )));
        }
        self.bind()?;
        let p = lt.problem(g)?;
        // 8-byte aligned copy of the algorithm struct.
        let mut a = [0u64; LT_ALGO_BYTES / 8];
        for (w, c) in a.iter_mut().zip(algo.bytes.chunks_exact(8)) {
            *w = u64::from_ne_bytes(c.try_into().expect("8"));
        }
        let (a32, b32) = (g.alpha, g.beta);
        let (a16, b16) = (quant::f32_to_f16(g.alpha), quant::f32_to_f16(g.beta));
        let (alpha, beta): (*const c_void, *const c_void) = match g.compute {
            ComputeType::F32 => (&a32 as *const f32 as _, &b32 as *const f32 as _),
            ComputeType::F16 => (&a16 as *const u16 as _, &b16 as *const u16 as _),
        };
        // SAFETY: descriptors from `problem`; device pointers are the runtime's to check;
        // scalars (host pointer mode, the default) and the algo copy outlive the call.
        let s = unsafe {
            (lt.fns.hipblasLtMatmul)(
                lt.handle as Ptr,
                p.desc,
                alpha,
                as_ptr(g.a),
                p.layouts[0],
                as_ptr(g.b),
                p.layouts[1],
                beta,
                as_ptr(g.c),
                p.layouts[2],
                as_ptr(g.c),
                p.layouts[2],
                a.as_ptr() as *const c_void,
                as_ptr(workspace),
                workspace_bytes,
                as_ptr(stream.0),
            )
        };
        lt_check("hipblasLtMatmul", s, g)
    }

    fn event_create_timing(&self) -> Result<Event> {
        self.bind()?;
        let mut e: Ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.check(
            "hipEventCreateWithFlags",
            unsafe { (self.fns.hipEventCreateWithFlags)(&mut e, EVENT_DEFAULT) },
            String::new,
        )?;
        Ok(Event(e as usize as u64))
    }

    fn event_elapsed_ms(&self, start: &Event, end: &Event) -> Result<Option<f32>> {
        let Some(f) = self.event_elapsed else { return Ok(None) };
        let mut ms = 0f32;
        // SAFETY: timing events from event_create_timing, both recorded and completed.
        self.check("hipEventElapsedTime", unsafe { f(&mut ms, as_ptr(start.0), as_ptr(end.0)) }, String::new)?;
        Ok(Some(ms))
    }
}
