//! [`Recorder`]: a [`GpuApi`] that forwards every call to the device and remembers the names of
//! the kernels launched, so a selftest check's claim "this validates kernel X" is checked
//! against what actually ran.
use gpu_executor::device::{
    DeviceInfo, DevicePtr, Event, Gemm, GpuApi, Graph, HostAllocOptions, HostBuf, Kernel, KernelSpec, LaunchConfig,
    LaunchStats, LtAlgo, Module, Result, Stream, WaitCond,
};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

pub struct Recorder {
    inner: Arc<dyn GpuApi>,
    launched: Mutex<BTreeSet<String>>,
}

impl Recorder {
    pub fn new(inner: Arc<dyn GpuApi>) -> Recorder {
        Recorder { inner, launched: Mutex::new(BTreeSet::new()) }
    }
    /// Kernel names launched since the last call (sorted), and forgets them.
    pub fn take_launched(&self) -> Vec<String> {
        let mut l = self.launched.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *l).into_iter().collect()
    }
}

impl GpuApi for Recorder {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn load_module(&self) -> Result<Module> {
        self.inner.load_module()
    }
    fn load_module_data(&self, code_object: &[u8]) -> Result<Module> {
        self.inner.load_module_data(code_object)
    }
    fn function(&self, module: &Module, spec: &KernelSpec) -> Result<Kernel> {
        self.inner.function(module, spec)
    }
    fn mem_info(&self) -> Result<gpu_executor::device::MemInfo> {
        self.inner.mem_info()
    }
    fn malloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.inner.malloc(bytes)
    }
    fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.inner.free(ptr)
    }
    fn host_alloc(&self, bytes: usize, opts: HostAllocOptions) -> Result<HostBuf> {
        self.inner.host_alloc(bytes, opts)
    }
    fn host_free(&self, buf: HostBuf) -> Result<()> {
        self.inner.host_free(buf)
    }
    fn host_write(&self, buf: &HostBuf, offset: usize, src: &[u8]) -> Result<()> {
        self.inner.host_write(buf, offset, src)
    }
    fn host_read(&self, buf: &HostBuf, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.inner.host_read(buf, offset, dst)
    }
    unsafe fn host_register(&self, ptr: *const u8, len: usize) -> Result<gpu_executor::device::HostRegion> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.host_register(ptr, len) }
    }
    fn host_unregister(&self, region: gpu_executor::device::HostRegion) -> Result<()> {
        self.inner.host_unregister(region)
    }
    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.inner.memcpy_htod(dst, src)
    }
    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.inner.memcpy_dtoh(dst, src)
    }
    fn memcpy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.inner.memcpy_dtod(dst, src, bytes)
    }
    fn memset(&self, dst: DevicePtr, byte: u8, bytes: usize) -> Result<()> {
        self.inner.memset(dst, byte, bytes)
    }
    fn memcpy_htod_async(
        &self,
        stream: &Stream,
        dst: DevicePtr,
        src: &HostBuf,
        offset: usize,
        bytes: usize,
    ) -> Result<()> {
        self.inner.memcpy_htod_async(stream, dst, src, offset, bytes)
    }
    fn memcpy_dtoh_async(
        &self,
        stream: &Stream,
        dst: &HostBuf,
        offset: usize,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<()> {
        self.inner.memcpy_dtoh_async(stream, dst, offset, src, bytes)
    }
    fn memcpy_dtod_async(&self, stream: &Stream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.inner.memcpy_dtod_async(stream, dst, src, bytes)
    }
    fn memset_async(&self, stream: &Stream, dst: DevicePtr, byte: u8, bytes: usize) -> Result<()> {
        self.inner.memset_async(stream, dst, byte, bytes)
    }
    fn stream_create(&self) -> Result<Stream> {
        self.inner.stream_create()
    }
    fn stream_destroy(&self, stream: Stream) -> Result<()> {
        self.inner.stream_destroy(stream)
    }
    fn stream_synchronize(&self, stream: &Stream) -> Result<()> {
        self.inner.stream_synchronize(stream)
    }
    fn stream_wait_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        self.inner.stream_wait_event(stream, event)
    }
    fn event_create(&self) -> Result<Event> {
        self.inner.event_create()
    }
    fn event_destroy(&self, event: Event) -> Result<()> {
        self.inner.event_destroy(event)
    }
    fn event_record(&self, event: &Event, stream: &Stream) -> Result<()> {
        self.inner.event_record(event, stream)
    }
    fn event_synchronize(&self, event: &Event) -> Result<()> {
        self.inner.event_synchronize(event)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn stream_wait_value64(&self, stream: &Stream, ptr: DevicePtr, value: u64, cond: WaitCond) -> Result<()> {
        self.inner.stream_wait_value64(stream, ptr, value, cond)
    }
    fn stream_write_value64(&self, stream: &Stream, ptr: DevicePtr, value: u64) -> Result<()> {
        self.inner.stream_write_value64(stream, ptr, value)
    }
    fn host_load_u64(&self, buf: &HostBuf, offset: usize) -> Result<u64> {
        self.inner.host_load_u64(buf, offset)
    }
    fn host_store_u64(&self, buf: &HostBuf, offset: usize, value: u64) -> Result<()> {
        self.inner.host_store_u64(buf, offset, value)
    }
    fn launch(&self, stream: &Stream, kernel: &Kernel, cfg: &LaunchConfig, kernargs: &[u8]) -> Result<()> {
        self.launched.lock().unwrap_or_else(|p| p.into_inner()).insert(kernel.info.name.clone());
        self.inner.launch(stream, kernel, cfg, kernargs)
    }
    fn begin_capture(&self, stream: &Stream) -> Result<()> {
        self.inner.begin_capture(stream)
    }
    fn end_capture(&self, stream: &Stream) -> Result<Graph> {
        self.inner.end_capture(stream)
    }
    fn launch_graph(&self, graph: &Graph, stream: &Stream) -> Result<()> {
        self.inner.launch_graph(graph, stream)
    }
    fn graph_destroy(&self, graph: Graph) -> Result<()> {
        self.inner.graph_destroy(graph)
    }
    fn gemm(&self, stream: &Stream, g: &Gemm) -> Result<()> {
        self.inner.gemm(stream, g)
    }
    fn gemm_lt_candidates(&self, g: &Gemm, max: usize) -> Result<Vec<LtAlgo>> {
        self.inner.gemm_lt_candidates(g, max)
    }
    fn gemm_lt(
        &self,
        stream: &Stream,
        g: &Gemm,
        algo: &LtAlgo,
        workspace: DevicePtr,
        workspace_bytes: usize,
    ) -> Result<()> {
        self.inner.gemm_lt(stream, g, algo, workspace, workspace_bytes)
    }
    fn event_create_timing(&self) -> Result<Event> {
        self.inner.event_create_timing()
    }
    fn event_elapsed_ms(&self, start: &Event, end: &Event) -> Result<Option<f32>> {
        self.inner.event_elapsed_ms(start, end)
    }
    fn take_stats(&self) -> Option<LaunchStats> {
        self.inner.take_stats()
    }
}
