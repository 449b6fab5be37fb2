//! [`GpuApi`] over the software RDNA3 device (`emulator::Device`).
//!
//! - Streams execute synchronously in call order (each call completes before it returns), so
//!   events and stream waits only validate their handles.
//! - Graph capture records the operations issued on the capturing stream (launches with their
//!   kernarg bytes, copies, memsets, GEMMs) instead of running them; replay runs the list again,
//!   reading device and host buffers at replay time, like a HIP graph.
//! - Pinned host memory is the device's `host_malloc_pinned` (device-visible, so "mapped");
//!   `device().set_fail_large_pinned_alloc(Some(n))` makes larger requests fail, which tests
//!   the pageable fallback.
//! - GEMM runs on the host ([`super::gemm_ref`]) over copies of the device buffers.
//! - hipBLASLt stand-in: [`GpuApi::gemm_lt_candidates`] offers [`EMU_LT_TILES`].len()
//!   "algorithms", blockings of the host GEMM that give results identical to [`GpuApi::gemm`]
//!   bit for bit (only the visiting order differs), so `strata calibrate --device emu` and
//!   the table lookup run end to end on the software device. Their timings are host timings
//!   and say nothing about a card.
use super::error::{GpuError, Result, emu, invalid};
use super::gemm_ref::{gemm_host, gemm_host_tiled};
use super::handoff::WAIT_TIMEOUT;
use super::kernel_check::{check_launch, check_spec, kernarg_extent};
use super::{
    DeviceInfo, DevicePtr, Event, Gemm, GpuApi, Graph, HostAllocOptions, HostBuf, HostRegion, HostStorage, Kernel,
    KernelSpec, LaunchConfig, LaunchStats, LtAlgo, MemInfo, Module, Stream, WaitCond,
};
use emulator::{Device, Function};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard};

/// The architecture the software device implements.
pub const EMU_ARCH: &str = "gfx1100";

/// The blockings (tile rows × tile columns of C) offered as hipBLASLt candidates.
pub const EMU_LT_TILES: [(usize, usize); 3] = [(usize::MAX, 1), (16, 16), (64, 4)];
/// Magic prefix of the software device's algorithm bytes.
const EMU_LT_MAGIC: &[u8; 6] = b"emu-lt";

/// Host side of an asynchronous copy, resolved when the operation runs.
#[derive(Clone)]
enum HostSide {
    Dev(DevicePtr),
    Heap(Arc<Mutex<Vec<u8>>>),
}

/// One recorded (or immediately executed) stream operation.
#[derive(Clone)]
enum Op {
    Launch { func: Function, cfg: LaunchConfig, args: Vec<u8> },
    HtoD { dst: DevicePtr, src: HostSide, offset: usize, bytes: usize },
    DtoH { dst: HostSide, offset: usize, src: DevicePtr, bytes: usize },
    DtoD { dst: DevicePtr, src: DevicePtr, bytes: usize },
    Memset { dst: DevicePtr, byte: u8, bytes: usize },
    Gemm(Gemm),
    GemmTiled(Gemm, (usize, usize)),
    WaitValue { ptr: DevicePtr, value: u64, cond: WaitCond },
    WriteValue { ptr: DevicePtr, value: u64 },
}

#[derive(Default)]
struct State {
    next_id: u64,
    modules: HashMap<u64, emulator::Module>,
    kernels: HashMap<u64, Function>,
    /// Created streams; `Some(ops)` while capturing.
    streams: HashMap<u64, Option<Vec<Op>>>,
    events: HashSet<u64>,
    graphs: HashMap<u64, Arc<Vec<Op>>>,
    stats: LaunchStats,
    /// Device allocations and their sizes (host buffers are not VRAM), against `vram_bytes`.
    device_allocs: HashMap<u64, usize>,
    device_used: u64,
}

impl State {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

/// The software-device implementation of [`GpuApi`].
pub struct EmuApi {
    dev: Device,
    info: DeviceInfo,
    state: Mutex<State>,
}

fn add_stats(sum: &mut LaunchStats, s: &LaunchStats) {
    sum.launches += s.launches;
    sum.instructions += s.instructions;
    sum.lane_ops += s.lane_ops;
    sum.global_bytes_read += s.global_bytes_read;
    sum.global_bytes_written += s.global_bytes_written;
    sum.lds_bytes += s.lds_bytes;
    sum.waves += s.waves;
    for (k, v) in &s.by_family {
        *sum.by_family.entry(k.clone()).or_default() += v;
    }
}

impl EmuApi {
    /// A new software device.
    pub fn new() -> Result<Self> {
        Ok(Self::with_device(Device::new()))
    }

    /// Wraps an existing software device (e.g. one with a changed instruction budget).
    pub fn with_device(dev: Device) -> Self {
        let info = DeviceInfo {
            backend: crate::options::Device::Emu,
            index: 0,
            name: "software RDNA3 device".into(),
            arch: EMU_ARCH.into(),
            wave_size: 32,
            // The emulator allocates from host RAM; report a 24 GiB card like the RX 7900 XTX.
            vram_bytes: 24 << 30,
            compute_units: 96,
            runtime: format!("emulator {}", env!("CARGO_PKG_VERSION")),
            blas: Some("host GEMM (gemm_ref)".into()),
            blas_lt: Some(format!("host GEMM blockings ({} candidates, software device)", EMU_LT_TILES.len())),
            blas_lt_version: Some(format!("emu-{}", env!("CARGO_PKG_VERSION"))),
        };
        EmuApi { dev, info, state: Mutex::new(State::default()) }
    }

    /// The same device with `bytes` of VRAM (default 24 GiB): allocations past it fail with
    /// [`GpuError::OutOfMemory`], as on a card of that size.
    pub fn with_vram(mut self, bytes: u64) -> Self {
        self.info.vram_bytes = bytes;
        self
    }

    /// A software device that reports `arch` (e.g. `gfx1101`), so [`GpuApi::load_module`] (and
    /// `GpuOps`) take that arch's embedded code object, as on a card of that arch. The device
    /// executes all gfx11 objects: gfx1101 receives the workgroup id in another SGPR, gfx1102 is
    /// gfx1100's ISA with other ELF flags.
    pub fn with_arch(dev: Device, arch: &str) -> Self {
        let mut api = Self::with_device(dev);
        api.info.arch = arch.to_string();
        api
    }

    /// The underlying device (test knobs: `set_fail_large_pinned_alloc`, instruction budget).
    pub fn device(&self) -> &Device {
        &self.dev
    }

    fn state(&self) -> Result<MutexGuard<'_, State>> {
        self.state.lock().map_err(|_| invalid("emu", "device state lock poisoned by an earlier panic"))
    }

    fn check_stream(st: &State, stream: &Stream, call: &'static str) -> Result<()> {
        if stream.0 == 0 || st.streams.contains_key(&stream.0) {
            Ok(())
        } else {
            Err(invalid(call, format!("unknown stream {}", stream.0)))
        }
    }

    /// Records `op` if `stream` is capturing, else runs it now.
    fn submit(&self, stream: &Stream, call: &'static str, op: Op) -> Result<()> {
        {
            let mut st = self.state()?;
            Self::check_stream(&st, stream, call)?;
            if let Some(Some(ops)) = st.streams.get_mut(&stream.0) {
                ops.push(op);
                return Ok(());
            }
        }
        self.run(&op)
    }

    fn host_side(buf: &HostBuf, call: &'static str) -> Result<HostSide> {
        match &buf.storage {
            HostStorage::Emu { ptr } => Ok(HostSide::Dev(*ptr)),
            HostStorage::Heap(v) => Ok(HostSide::Heap(v.clone())),
            HostStorage::Raw { .. } => Err(invalid(call, "host buffer belongs to another backend")),
        }
    }

    fn run(&self, op: &Op) -> Result<()> {
        match op {
            Op::Launch { func, cfg, args } => {
                let name = &func.info().name;
                let s = self
                    .dev
                    .launch(func, cfg.grid, cfg.block, cfg.dynamic_lds, args)
                    .map_err(emu(format!("launch {name}")))?;
                add_stats(&mut self.state()?.stats, &s);
                Ok(())
            }
            Op::HtoD { dst, src, offset, bytes } => match src {
                HostSide::Dev(p) => {
                    self.dev.memcpy_dtod(*dst, p + *offset as u64, *bytes).map_err(emu("copy host to device"))
                }
                HostSide::Heap(v) => {
                    let v = v.lock().map_err(|_| invalid("memcpy_htod_async", "host buffer lock poisoned"))?;
                    self.dev.memcpy_htod(*dst, &v[*offset..*offset + *bytes]).map_err(emu("copy host to device"))
                }
            },
            Op::DtoH { dst, offset, src, bytes } => match dst {
                HostSide::Dev(p) => {
                    self.dev.memcpy_dtod(p + *offset as u64, *src, *bytes).map_err(emu("copy device to host"))
                }
                HostSide::Heap(v) => {
                    let mut v = v.lock().map_err(|_| invalid("memcpy_dtoh_async", "host buffer lock poisoned"))?;
                    self.dev.memcpy_dtoh(&mut v[*offset..*offset + *bytes], *src).map_err(emu("copy device to host"))
                }
            },
            Op::DtoD { dst, src, bytes } => {
                self.dev.memcpy_dtod(*dst, *src, *bytes).map_err(emu("copy device to device"))
            }
            Op::Memset { dst, byte, bytes } => self.dev.memset(*dst, *byte, *bytes).map_err(emu("memset")),
            Op::Gemm(g) => self.run_gemm(g),
            Op::GemmTiled(g, t) => self.run_gemm_tiled(g, *t),
            Op::WaitValue { ptr, value, cond } => {
                // Streams run on the calling thread: poll until another thread (a host
                // producer) has published, like the command processor polling the word.
                let start = std::time::Instant::now();
                loop {
                    let mut w = [0u8; 8];
                    self.dev.memcpy_dtoh(&mut w, *ptr).map_err(emu("stream_wait_value64"))?;
                    if cond.holds(u64::from_le_bytes(w), *value) {
                        fence(Ordering::Acquire);
                        return Ok(());
                    }
                    if start.elapsed() > WAIT_TIMEOUT {
                        return Err(GpuError::Capture(format!(
                            "stream_wait_value64: the word at {ptr:#x} is {} after {WAIT_TIMEOUT:?}, waiting for {cond:?} {value} (no producer?)",
                            u64::from_le_bytes(w)
                        )));
                    }
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            }
            Op::WriteValue { ptr, value } => {
                fence(Ordering::Release);
                self.dev.memcpy_htod(*ptr, &value.to_le_bytes()).map_err(emu("stream_write_value64"))
            }
        }
    }

    fn run_gemm(&self, g: &Gemm) -> Result<()> {
        let (ea, eb, ec) = g.extents();
        let read = |p: DevicePtr, n: usize, what: &str| -> Result<Vec<u8>> {
            let mut v = vec![0u8; n];
            self.dev
                .memcpy_dtoh(&mut v, p)
                .map_err(|e| GpuError::Gemm(format!("reading {what} ({n} bytes at {p:#x}): {e}")))?;
            Ok(v)
        };
        let a = read(g.a, ea * g.a_type.size(), "A")?;
        let b = read(g.b, eb * g.b_type.size(), "B")?;
        // C is read even when beta = 0: the gaps between ldc columns must be preserved.
        let mut c = read(g.c, ec * g.c_type.size(), "C")?;
        gemm_host(g, &a, &b, &mut c);
        self.dev.memcpy_htod(g.c, &c).map_err(|e| GpuError::Gemm(format!("writing C: {e}")))?;
        // The host GEMM stands in for hipBLAS: count the traffic an ideal GEMM has (A and B
        // read once, C written once; no instructions), so per-part byte profiles stay whole.
        let mut st = self.state()?;
        st.stats.global_bytes_read += (a.len() + b.len()) as u64;
        st.stats.global_bytes_written += (g.m * g.n * g.batch * g.c_type.size()) as u64;
        Ok(())
    }
}

/// The hipBLASLt stand-in (see the module docs).
impl EmuApi {
    /// `g` with the host GEMM blocked in `tile_m` × `tile_n` tiles of C (results identical to
    /// `run_gemm`); counts the same ideal traffic as a GEMM (A and B read once, C written once).
    fn run_gemm_tiled(&self, g: &Gemm, (tile_m, tile_n): (usize, usize)) -> Result<()> {
        let (ea, eb, ec) = g.extents();
        let read = |p: DevicePtr, n: usize, what: &str| -> Result<Vec<u8>> {
            let mut v = vec![0u8; n];
            self.dev
                .memcpy_dtoh(&mut v, p)
                .map_err(|e| GpuError::Gemm(format!("reading {what} ({n} bytes at {p:#x}): {e}")))?;
            Ok(v)
        };
        let a = read(g.a, ea * g.a_type.size(), "A")?;
        let b = read(g.b, eb * g.b_type.size(), "B")?;
        let mut c = read(g.c, ec * g.c_type.size(), "C")?;
        gemm_host_tiled(g, &a, &b, &mut c, tile_m, tile_n);
        self.dev.memcpy_htod(g.c, &c).map_err(|e| GpuError::Gemm(format!("writing C: {e}")))?;
        let mut st = self.state()?;
        st.stats.global_bytes_read += (a.len() + b.len()) as u64;
        st.stats.global_bytes_written += (g.m * g.n * g.batch * g.c_type.size()) as u64;
        Ok(())
    }
}

impl GpuApi for EmuApi {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn load_module_data(&self, code_object: &[u8]) -> Result<Module> {
        let m = self.dev.load_module(code_object).map_err(emu("load code object"))?;
        let kernels = m.kernels();
        let mut st = self.state()?;
        let id = st.id();
        st.modules.insert(id, m);
        Ok(Module { id, kernels })
    }

    fn function(&self, module: &Module, spec: &KernelSpec) -> Result<Kernel> {
        let mut st = self.state()?;
        let m =
            st.modules.get(&module.id).ok_or_else(|| invalid("function", format!("unknown module {}", module.id)))?;
        let f = m.function(spec.name).map_err(|_| GpuError::NoSuchKernel { kernel: spec.name.to_string() })?;
        check_spec(f.info(), spec)?;
        let info = f.info().clone();
        let id = st.id();
        st.kernels.insert(id, f);
        Ok(Kernel { id, kernarg_bytes: kernarg_extent(&info), info })
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr> {
        let mut st = self.state()?;
        let total = self.info.vram_bytes;
        let free = total.saturating_sub(st.device_used);
        if bytes as u64 > free {
            return Err(GpuError::OutOfMemory { bytes, free, total });
        }
        let p = self.dev.malloc(bytes).map_err(emu(format!("malloc {bytes} bytes")))?;
        st.device_allocs.insert(p, bytes);
        st.device_used += bytes as u64;
        Ok(p)
    }
    fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.dev.free(ptr).map_err(emu(format!("free {ptr:#x}")))?;
        let mut st = self.state()?;
        if let Some(b) = st.device_allocs.remove(&ptr) {
            st.device_used -= b as u64;
        }
        Ok(())
    }
    fn mem_info(&self) -> Result<MemInfo> {
        let total = self.info.vram_bytes;
        Ok(MemInfo { free: total.saturating_sub(self.state()?.device_used), total })
    }

    fn host_alloc(&self, bytes: usize, opts: HostAllocOptions) -> Result<HostBuf> {
        match self.dev.host_malloc_pinned(bytes) {
            Ok(ptr) => Ok(HostBuf {
                storage: HostStorage::Emu { ptr },
                bytes,
                device_ptr: opts.mapped.then_some(ptr),
                fallback: None,
            }),
            Err(e) if opts.allow_pageable_fallback => Ok(HostBuf {
                storage: HostStorage::Heap(Arc::new(Mutex::new(vec![0u8; bytes]))),
                bytes,
                device_ptr: None,
                fallback: Some(format!("pinned allocation of {bytes} bytes failed ({e}); using pageable memory")),
            }),
            Err(e) => Err(GpuError::PinnedAlloc { bytes, reason: e.to_string() }),
        }
    }
    fn host_free(&self, buf: HostBuf) -> Result<()> {
        match buf.storage {
            HostStorage::Emu { ptr } => self.dev.free(ptr).map_err(emu("free pinned host buffer")),
            HostStorage::Heap(_) => Ok(()),
            HostStorage::Raw { .. } => Err(invalid("host_free", "host buffer belongs to another backend")),
        }
    }
    fn host_write(&self, buf: &HostBuf, offset: usize, src: &[u8]) -> Result<()> {
        buf.check_range("host_write", offset, src.len())?;
        match Self::host_side(buf, "host_write")? {
            HostSide::Dev(p) => self.dev.memcpy_htod(p + offset as u64, src).map_err(emu("host_write")),
            HostSide::Heap(v) => {
                let mut v = v.lock().map_err(|_| invalid("host_write", "host buffer lock poisoned"))?;
                v[offset..offset + src.len()].copy_from_slice(src);
                Ok(())
            }
        }
    }
    fn host_read(&self, buf: &HostBuf, offset: usize, dst: &mut [u8]) -> Result<()> {
        buf.check_range("host_read", offset, dst.len())?;
        match Self::host_side(buf, "host_read")? {
            HostSide::Dev(p) => self.dev.memcpy_dtoh(dst, p + offset as u64).map_err(emu("host_read")),
            HostSide::Heap(v) => {
                let v = v.lock().map_err(|_| invalid("host_read", "host buffer lock poisoned"))?;
                dst.copy_from_slice(&v[offset..offset + dst.len()]);
                Ok(())
            }
        }
    }

    unsafe fn host_register(&self, ptr: *const u8, len: usize) -> Result<HostRegion> {
        // SAFETY: the caller's contract ([`GpuApi::host_register`]).
        let src = unsafe { std::slice::from_raw_parts(ptr, len) };
        // A device-visible copy stands for the pinned pages: the bytes never change after.
        let copy = self
            .dev
            .host_malloc_pinned(len.max(1))
            .map_err(|e| GpuError::PinnedAlloc { bytes: len, reason: e.to_string() })?;
        self.dev.memcpy_htod(copy, src).map_err(emu("host_register"))?;
        Ok(HostRegion { device_ptr: copy, bytes: len, handle: copy })
    }
    fn host_unregister(&self, region: HostRegion) -> Result<()> {
        self.dev.free(region.handle).map_err(emu("host_unregister"))
    }

    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.dev.memcpy_htod(dst, src).map_err(emu(format!("memcpy_htod {} bytes to {dst:#x}", src.len())))
    }
    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let n = dst.len();
        self.dev.memcpy_dtoh(dst, src).map_err(emu(format!("memcpy_dtoh {n} bytes from {src:#x}")))
    }
    fn memcpy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.run(&Op::DtoD { dst, src, bytes })
    }
    fn memset(&self, dst: DevicePtr, byte: u8, bytes: usize) -> Result<()> {
        self.run(&Op::Memset { dst, byte, bytes })
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
        let src = Self::host_side(src, "memcpy_htod_async")?;
        self.submit(stream, "memcpy_htod_async", Op::HtoD { dst, src, offset, bytes })
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
        let dst = Self::host_side(dst, "memcpy_dtoh_async")?;
        self.submit(stream, "memcpy_dtoh_async", Op::DtoH { dst, offset, src, bytes })
    }
    fn memcpy_dtod_async(&self, stream: &Stream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.submit(stream, "memcpy_dtod_async", Op::DtoD { dst, src, bytes })
    }
    fn memset_async(&self, stream: &Stream, dst: DevicePtr, byte: u8, bytes: usize) -> Result<()> {
        self.submit(stream, "memset_async", Op::Memset { dst, byte, bytes })
    }

    fn stream_create(&self) -> Result<Stream> {
        let mut st = self.state()?;
        let id = st.id();
        st.streams.insert(id, None);
        Ok(Stream(id))
    }
    fn stream_destroy(&self, stream: Stream) -> Result<()> {
        let mut st = self.state()?;
        match st.streams.remove(&stream.0) {
            Some(None) => Ok(()),
            Some(Some(ops)) => {
                st.streams.insert(stream.0, Some(ops));
                Err(GpuError::Capture(format!("stream {} is still capturing", stream.0)))
            }
            None => Err(invalid("stream_destroy", format!("unknown stream {}", stream.0))),
        }
    }
    fn stream_synchronize(&self, stream: &Stream) -> Result<()> {
        let st = self.state()?;
        Self::check_stream(&st, stream, "stream_synchronize")?;
        if matches!(st.streams.get(&stream.0), Some(Some(_))) {
            return Err(GpuError::Capture(format!("stream_synchronize on stream {} while it is capturing", stream.0)));
        }
        Ok(())
    }
    fn stream_wait_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        let st = self.state()?;
        Self::check_stream(&st, stream, "stream_wait_event")?;
        if !st.events.contains(&event.0) {
            return Err(invalid("stream_wait_event", format!("unknown event {}", event.0)));
        }
        Ok(())
    }
    fn event_create(&self) -> Result<Event> {
        let mut st = self.state()?;
        let id = st.id();
        st.events.insert(id);
        Ok(Event(id))
    }
    fn event_destroy(&self, event: Event) -> Result<()> {
        if self.state()?.events.remove(&event.0) {
            Ok(())
        } else {
            Err(invalid("event_destroy", format!("unknown event {}", event.0)))
        }
    }
    fn event_record(&self, event: &Event, stream: &Stream) -> Result<()> {
        let st = self.state()?;
        Self::check_stream(&st, stream, "event_record")?;
        if !st.events.contains(&event.0) {
            return Err(invalid("event_record", format!("unknown event {}", event.0)));
        }
        Ok(())
    }
    fn event_synchronize(&self, event: &Event) -> Result<()> {
        if self.state()?.events.contains(&event.0) {
            Ok(())
        } else {
            Err(invalid("event_synchronize", format!("unknown event {}", event.0)))
        }
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn stream_wait_value64(&self, stream: &Stream, ptr: DevicePtr, value: u64, cond: WaitCond) -> Result<()> {
        self.submit(stream, "stream_wait_value64", Op::WaitValue { ptr, value, cond })
    }
    fn stream_write_value64(&self, stream: &Stream, ptr: DevicePtr, value: u64) -> Result<()> {
        self.submit(stream, "stream_write_value64", Op::WriteValue { ptr, value })
    }
    fn host_load_u64(&self, buf: &HostBuf, offset: usize) -> Result<u64> {
        let mut w = [0u8; 8];
        self.host_read(buf, offset, &mut w)?;
        fence(Ordering::Acquire);
        Ok(u64::from_le_bytes(w))
    }
    fn host_store_u64(&self, buf: &HostBuf, offset: usize, value: u64) -> Result<()> {
        fence(Ordering::Release);
        self.host_write(buf, offset, &value.to_le_bytes())
    }

    fn launch(&self, stream: &Stream, kernel: &Kernel, cfg: &LaunchConfig, kernargs: &[u8]) -> Result<()> {
        check_launch(&kernel.info, cfg, kernargs)?;
        let func = self.state()?.kernels.get(&kernel.id).cloned().ok_or_else(|| {
            invalid("launch", format!("kernel {} was not looked up on this device", kernel.info.name))
        })?;
        self.submit(stream, "launch", Op::Launch { func, cfg: *cfg, args: kernargs.to_vec() })
    }

    fn begin_capture(&self, stream: &Stream) -> Result<()> {
        let mut st = self.state()?;
        match st.streams.get_mut(&stream.0) {
            _ if stream.0 == 0 => {
                Err(GpuError::Capture("the default stream cannot be captured; create a stream".into()))
            }
            Some(slot @ None) => {
                *slot = Some(Vec::new());
                Ok(())
            }
            Some(Some(_)) => Err(GpuError::Capture(format!("stream {} is already capturing", stream.0))),
            None => Err(invalid("begin_capture", format!("unknown stream {}", stream.0))),
        }
    }
    fn end_capture(&self, stream: &Stream) -> Result<Graph> {
        let mut st = self.state()?;
        let ops = match st.streams.get_mut(&stream.0) {
            Some(slot @ Some(_)) => slot.take().unwrap_or_default(),
            Some(None) => return Err(GpuError::Capture(format!("stream {} is not capturing", stream.0))),
            None => return Err(invalid("end_capture", format!("unknown stream {}", stream.0))),
        };
        let id = st.id();
        st.graphs.insert(id, Arc::new(ops));
        Ok(Graph(id))
    }
    fn launch_graph(&self, graph: &Graph, stream: &Stream) -> Result<()> {
        let ops = {
            let st = self.state()?;
            Self::check_stream(&st, stream, "launch_graph")?;
            if matches!(st.streams.get(&stream.0), Some(Some(_))) {
                return Err(GpuError::Capture("launching a graph into a capturing stream is not supported".into()));
            }
            st.graphs
                .get(&graph.0)
                .cloned()
                .ok_or_else(|| invalid("launch_graph", format!("unknown graph {}", graph.0)))?
        };
        ops.iter().try_for_each(|op| self.run(op))
    }
    fn graph_destroy(&self, graph: Graph) -> Result<()> {
        match self.state()?.graphs.remove(&graph.0) {
            Some(_) => Ok(()),
            None => Err(invalid("graph_destroy", format!("unknown graph {}", graph.0))),
        }
    }

    fn gemm(&self, stream: &Stream, g: &Gemm) -> Result<()> {
        g.validate()?;
        self.submit(stream, "gemm", Op::Gemm(*g))
    }

    fn gemm_lt_candidates(&self, g: &Gemm, max: usize) -> Result<Vec<LtAlgo>> {
        g.validate()?;
        Ok((0..EMU_LT_TILES.len().min(max))
            .map(|i| {
                let mut bytes = EMU_LT_MAGIC.to_vec();
                bytes.push(i as u8);
                LtAlgo { index: i as u32, bytes, workspace: 0 }
            })
            .collect())
    }

    fn gemm_lt(
        &self,
        stream: &Stream,
        g: &Gemm,
        algo: &LtAlgo,
        _workspace: DevicePtr,
        _workspace_bytes: usize,
    ) -> Result<()> {
        g.validate()?;
        let tile = match algo.bytes.split_last() {
            Some((&i, magic)) if magic == EMU_LT_MAGIC && (i as usize) < EMU_LT_TILES.len() => EMU_LT_TILES[i as usize],
            _ => {
                return Err(GpuError::Gemm(format!(
                    "algorithm bytes {:02x?} are not a software-device blocking",
                    algo.bytes
                )));
            }
        };
        self.submit(stream, "gemm_lt", Op::GemmTiled(*g, tile))
    }

    fn take_stats(&self) -> Option<LaunchStats> {
        self.state().ok().map(|mut st| std::mem::take(&mut st.stats))
    }
}
