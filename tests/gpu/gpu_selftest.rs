//! `strata device --selftest` (kernel-tools/src/selftest.rs): the whole suite through the binary
//! on the software device (every kernel of the registry passes, times are null), a corrupted
//! reference reported as a failure with a non-zero exit, every kernel covered by a check, and
//! the timed path (GB/s, share of the peak) on the software device with a simulated card clock.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use strata::gpu::device::{
    Device, DeviceInfo, DevicePtr, EmuApi, Event, Gemm, GpuApi, Graph, HostAllocOptions, HostBuf, Kernel, KernelSpec,
    LaunchConfig, LaunchStats, Module, Result as GpuResult, Stream, WaitCond,
};
use strata::gpu::registry;
use strata::kernel_tools::selftest::{self, Options, Shapes};

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("strata-selftest-{}-{name}", std::process::id()))
}

/// Every kernel the suite must cover, from sources independent of the suite: the kernel
/// registry and the names in the embedded gfx1100 code object's metadata.
fn expected_kernels() -> BTreeSet<String> {
    let mut k: BTreeSet<String> = registry::all().map(|e| e.name.to_string()).collect();
    let module = EmuApi::new().expect("software device").load_module().expect("gfx1100 code object");
    k.extend(module.kernels.iter().map(|i| i.name.clone()));
    k
}

fn run_selftest(report: &PathBuf, env: &[(&str, &str)]) -> (std::process::Output, Value) {
    let _ = std::fs::remove_file(report);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
    cmd.args(["device", "--selftest", "--device", "emu", "--report", report.to_str().unwrap()]);
    for k in ["STRATA_SELFTEST_ONLY", "STRATA_SELFTEST_CORRUPT", "STRATA_SELFTEST_SHAPES", "STRATA_PEAK_GBS"] {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("running strata");
    let text = std::fs::read_to_string(report).unwrap_or_else(|e| {
        panic!(
            "no report at {} ({e}); stdout:\n{}\nstderr:\n{}",
            report.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let v: Value = serde_json::from_str(&text).expect("report is JSON");
    (out, v)
}

#[test]
fn gpu_selftest_emu_report_every_kernel_passes() {
    let report = tmp("emu.json");
    let t0 = std::time::Instant::now();
    let (out, v) = run_selftest(&report, &[]);
    let wall = t0.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "selftest failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("report written to {}", report.display())), "{stdout}");
    eprintln!("emu selftest: {wall:.1} s wall, {} checks", v["summary"]["checks"]);
    assert!(wall < 120.0, "the emu suite took {wall:.0} s: keep its shapes small");

    assert_eq!(v["format"], "strata-selftest/1");
    assert_eq!(v["pass"], true);
    assert_eq!(v["device"]["arch"], "gfx1100");
    assert_eq!(v["device"]["backend"], "emu");
    for key in ["runtime", "hipblas", "hipblaslt", "hipblaslt_version"] {
        assert!(v["device"][key].is_string(), "device.{key}: {}", v["device"]);
    }
    assert!(v["device"]["hip_version"].is_null(), "{}", v["device"]);
    assert_eq!(v["shapes"], "small");
    assert_eq!(v["timed"], false);
    assert!(v["peak_bandwidth_gbs"].is_null());
    assert_eq!(v["summary"]["failed"], 0);
    assert_eq!(v["summary"]["kernels_without_check"], serde_json::json!([]));

    let checks = v["checks"].as_array().unwrap();
    let mut names = BTreeSet::new();
    for c in checks {
        let name = c["name"].as_str().unwrap();
        assert!(names.insert(name), "duplicate check {name}");
        assert_eq!(c["pass"], true, "{c}");
        assert_eq!(c["corrupted_reference"], false, "{c}");
        assert!(c["error"].is_null(), "{c}");
        // No clock on the software device: times null, bytes counted by the emulator.
        assert!(c["time_us"].is_null() && c["gbs"].is_null() && c["peak_fraction"].is_null(), "{c}");
        assert!(c["ideal_bytes"].as_u64().unwrap() > 0, "{c}");
        assert!(c["emu_bytes_moved"].as_u64().unwrap() > 0, "{c}");
        assert!(c["tolerance"].is_number() && c["max_error"].is_number(), "{c}");
        assert!(c["max_error"].as_f64().unwrap() <= c["tolerance"].as_f64().unwrap(), "{c}");
        let launched: Vec<&str> = c["launched"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
        for k in c["kernels"].as_array().unwrap() {
            assert!(launched.contains(&k.as_str().unwrap()), "{name} declares {k} but launched {launched:?}");
        }
        for cmp in c["comparisons"].as_array().unwrap() {
            assert_eq!(cmp["pass"], true, "{name}: {cmp}");
            assert!(cmp["elements"].as_u64().unwrap() > 0, "{name}: {cmp}");
        }
    }

    let kernels: std::collections::BTreeMap<&str, &Value> =
        v["kernels"].as_array().unwrap().iter().map(|k| (k["name"].as_str().unwrap(), k)).collect();
    let expected = expected_kernels();
    assert!(expected.len() >= 130, "{} kernels", expected.len());
    for k in &expected {
        let e = kernels.get(k.as_str()).unwrap_or_else(|| panic!("kernel {k} missing from the report"));
        assert_eq!(e["pass"], true, "{e}");
        assert!(!e["checks"].as_array().unwrap().is_empty(), "{e}");
        assert!(e["time_us"].is_null() && e["gbs"].is_null() && e["peak_fraction"].is_null(), "{e}");
    }
    let _ = std::fs::remove_file(&report);
}

/// A check held to a deliberately corrupted CPU reference fails, the report says so, the other
/// checks still pass, and the command exits non-zero.
#[test]
fn gpu_selftest_corrupted_reference_fails() {
    let report = tmp("corrupt.json");
    let only = "rms_norm_f32,mmvq_q4_k_q8_1_c2,quantize_q8_1,attn_fast_f16_d64,moe_router";
    let (out, v) =
        run_selftest(&report, &[("STRATA_SELFTEST_ONLY", only), ("STRATA_SELFTEST_CORRUPT", "mmvq_q4_k_q8_1_c2")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a failing check must fail the command");
    assert!(stderr.contains("selftest failed") && stderr.contains("mmvq_q4_k_q8_1_c2"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(v["pass"], false);
    assert_eq!(v["summary"]["filtered"], true);
    for c in v["checks"].as_array().unwrap() {
        let corrupted = c["name"] == "mmvq_q4_k_q8_1_c2";
        assert_eq!(c["corrupted_reference"], corrupted, "{c}");
        assert_eq!(c["pass"], !corrupted, "{c}");
        if corrupted {
            let cmp = &c["comparisons"][0];
            assert_eq!(cmp["pass"], false, "{cmp}");
            assert!(cmp["mismatches"].as_u64().unwrap() >= 1, "{cmp}");
            assert!(cmp["first_failure"].as_str().unwrap().starts_with("element 0"), "{cmp}");
        }
    }
    let k = v["kernels"].as_array().unwrap().iter().find(|k| k["name"] == "mmvq_q4_k_q8_1_c2").expect("kernel entry");
    assert_eq!(k["pass"], false, "{k}");
    assert_eq!(v["summary"]["failed"], 1);
    let _ = std::fs::remove_file(&report);
}

#[test]
fn gpu_selftest_every_registry_kernel_has_a_check() {
    let module = EmuApi::new().unwrap().load_module().unwrap();
    let registry: BTreeSet<String> = selftest::registry("gfx1100", &module).into_iter().collect();
    assert!(registry.is_superset(&expected_kernels()));
    let checks = selftest::all_checks();
    let covered: BTreeSet<&str> = checks.iter().flat_map(|c| c.kernels.iter().copied()).collect();
    let missing: Vec<&String> = registry.iter().filter(|k| !covered.contains(k.as_str())).collect();
    assert!(missing.is_empty(), "kernels without a selftest check: {missing:?}");
    let names: BTreeSet<&str> = checks.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names.len(), checks.len(), "check names are unique");
}

/// The software device under a card's name with a simulated clock (10 µs per launch): the
/// timed path reports µs, GB/s of the ideal bytes and the share of the 7900 XTX's 960 GB/s.
struct SimulatedCard {
    inner: EmuApi,
    info: DeviceInfo,
    launches: AtomicU32,
    marks: Mutex<Vec<u32>>,
}

const SIMULATED_US_PER_LAUNCH: f64 = 10.0;

impl GpuApi for SimulatedCard {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn load_module(&self) -> GpuResult<Module> {
        self.inner.load_module()
    }
    fn load_module_data(&self, co: &[u8]) -> GpuResult<Module> {
        self.inner.load_module_data(co)
    }
    fn function(&self, m: &Module, spec: &KernelSpec) -> GpuResult<Kernel> {
        self.inner.function(m, spec)
    }
    fn malloc(&self, bytes: usize) -> GpuResult<DevicePtr> {
        self.inner.malloc(bytes)
    }
    fn mem_info(&self) -> GpuResult<strata::gpu::device::MemInfo> {
        self.inner.mem_info()
    }
    fn free(&self, p: DevicePtr) -> GpuResult<()> {
        self.inner.free(p)
    }
    fn host_alloc(&self, bytes: usize, o: HostAllocOptions) -> GpuResult<HostBuf> {
        self.inner.host_alloc(bytes, o)
    }
    fn host_free(&self, b: HostBuf) -> GpuResult<()> {
        self.inner.host_free(b)
    }
    fn host_write(&self, b: &HostBuf, off: usize, src: &[u8]) -> GpuResult<()> {
        self.inner.host_write(b, off, src)
    }
    fn host_read(&self, b: &HostBuf, off: usize, dst: &mut [u8]) -> GpuResult<()> {
        self.inner.host_read(b, off, dst)
    }
    fn memcpy_htod(&self, d: DevicePtr, s: &[u8]) -> GpuResult<()> {
        self.inner.memcpy_htod(d, s)
    }
    fn memcpy_dtoh(&self, d: &mut [u8], s: DevicePtr) -> GpuResult<()> {
        self.inner.memcpy_dtoh(d, s)
    }
    fn memcpy_dtod(&self, d: DevicePtr, s: DevicePtr, n: usize) -> GpuResult<()> {
        self.inner.memcpy_dtod(d, s, n)
    }
    fn memset(&self, d: DevicePtr, b: u8, n: usize) -> GpuResult<()> {
        self.inner.memset(d, b, n)
    }
    fn memcpy_htod_async(&self, st: &Stream, d: DevicePtr, s: &HostBuf, off: usize, n: usize) -> GpuResult<()> {
        self.inner.memcpy_htod_async(st, d, s, off, n)
    }
    fn memcpy_dtoh_async(&self, st: &Stream, d: &HostBuf, off: usize, s: DevicePtr, n: usize) -> GpuResult<()> {
        self.inner.memcpy_dtoh_async(st, d, off, s, n)
    }
    fn memcpy_dtod_async(&self, st: &Stream, d: DevicePtr, s: DevicePtr, n: usize) -> GpuResult<()> {
        self.inner.memcpy_dtod_async(st, d, s, n)
    }
    fn memset_async(&self, st: &Stream, d: DevicePtr, b: u8, n: usize) -> GpuResult<()> {
        self.inner.memset_async(st, d, b, n)
    }
    fn stream_create(&self) -> GpuResult<Stream> {
        self.inner.stream_create()
    }
    fn stream_destroy(&self, s: Stream) -> GpuResult<()> {
        self.inner.stream_destroy(s)
    }
    fn stream_synchronize(&self, s: &Stream) -> GpuResult<()> {
        self.inner.stream_synchronize(s)
    }
    fn stream_wait_event(&self, s: &Stream, e: &Event) -> GpuResult<()> {
        self.inner.stream_wait_event(s, e)
    }
    fn event_create(&self) -> GpuResult<Event> {
        self.inner.event_create()
    }
    fn event_destroy(&self, e: Event) -> GpuResult<()> {
        self.inner.event_destroy(e)
    }
    fn event_record(&self, e: &Event, s: &Stream) -> GpuResult<()> {
        self.marks.lock().unwrap().push(self.launches.load(Ordering::SeqCst));
        self.inner.event_record(e, s)
    }
    fn event_synchronize(&self, e: &Event) -> GpuResult<()> {
        self.inner.event_synchronize(e)
    }
    fn synchronize(&self) -> GpuResult<()> {
        self.inner.synchronize()
    }
    fn stream_wait_value64(&self, s: &Stream, p: DevicePtr, v: u64, c: WaitCond) -> GpuResult<()> {
        self.inner.stream_wait_value64(s, p, v, c)
    }
    fn stream_write_value64(&self, s: &Stream, p: DevicePtr, v: u64) -> GpuResult<()> {
        self.inner.stream_write_value64(s, p, v)
    }
    fn host_load_u64(&self, b: &HostBuf, off: usize) -> GpuResult<u64> {
        self.inner.host_load_u64(b, off)
    }
    fn host_store_u64(&self, b: &HostBuf, off: usize, v: u64) -> GpuResult<()> {
        self.inner.host_store_u64(b, off, v)
    }
    fn launch(&self, s: &Stream, k: &Kernel, cfg: &LaunchConfig, args: &[u8]) -> GpuResult<()> {
        self.launches.fetch_add(1, Ordering::SeqCst);
        self.inner.launch(s, k, cfg, args)
    }
    fn begin_capture(&self, s: &Stream) -> GpuResult<()> {
        self.inner.begin_capture(s)
    }
    fn end_capture(&self, s: &Stream) -> GpuResult<Graph> {
        self.inner.end_capture(s)
    }
    fn launch_graph(&self, g: &Graph, s: &Stream) -> GpuResult<()> {
        self.inner.launch_graph(g, s)
    }
    fn graph_destroy(&self, g: Graph) -> GpuResult<()> {
        self.inner.graph_destroy(g)
    }
    fn gemm(&self, s: &Stream, g: &Gemm) -> GpuResult<()> {
        self.inner.gemm(s, g)
    }
    /// Launches between the last two recorded events, at 10 µs each.
    fn event_elapsed_ms(&self, _start: &Event, _end: &Event) -> GpuResult<Option<f32>> {
        let m = self.marks.lock().unwrap();
        let n = match m.as_slice() {
            [.., a, b] => b - a,
            _ => 0,
        };
        Ok(Some((n as f64 * SIMULATED_US_PER_LAUNCH / 1e3) as f32))
    }
    fn take_stats(&self) -> Option<LaunchStats> {
        None
    }
}

#[test]
fn gpu_selftest_timed_device_reports_gbs_and_peak_share() {
    let inner = EmuApi::new().unwrap();
    let mut info = inner.info().clone();
    info.backend = Device::Hip;
    info.name = "AMD Radeon RX 7900 XTX".into();
    info.runtime = "HIP runtime 6.4.43483 at /opt/rocm/lib/libamdhip64.so".into();
    let card = SimulatedCard { inner, info, launches: AtomicU32::new(0), marks: Mutex::new(Vec::new()) };
    let opts = Options {
        shapes: Some(Shapes::Small),
        only: vec!["rms_norm_f32".into(), "mmvq_q8_0_q8_1_c1".into()],
        ..Default::default()
    };
    let mut seen = 0;
    let rep = selftest::run_suite(Arc::new(card), &opts, &mut |_| seen += 1).expect("suite runs");
    assert!(rep.pass(), "{}", rep.summary());
    assert!(rep.timed);
    assert_eq!(seen, rep.checks.len());
    assert_eq!(rep.peak.as_ref().map(|p| p.gbs), Some(960.0));
    let v = rep.to_json();
    assert_eq!(v["peak_bandwidth_gbs"], 960.0);
    assert_eq!(v["device"]["backend"], "hip");
    assert_eq!(v["device"]["hip_version"], "6.4.43483");
    let checks = v["checks"].as_array().unwrap();
    assert!(checks.len() >= 3, "{}", checks.len()); // rms_norm_f32, its ggml order, mmvq c1 (+ row list)
    for c in checks {
        let t = c["time_us"].as_f64().unwrap_or_else(|| panic!("no time: {c}"));
        assert!((t - SIMULATED_US_PER_LAUNCH).abs() < 1e-3, "{c}");
        let bytes = c["ideal_bytes"].as_f64().unwrap();
        let gbs = c["gbs"].as_f64().unwrap();
        assert!((gbs - bytes / t / 1e3).abs() <= 1e-9 * gbs.max(1.0), "{c}");
        let share = c["peak_fraction"].as_f64().unwrap();
        assert!((share - gbs / 960.0).abs() < 1e-12, "{c}");
        assert!(c["timed_launches"].as_u64().unwrap() > 1, "{c}");
        assert!(c["emu_bytes_moved"].is_null(), "{c}");
    }
    for k in v["kernels"].as_array().unwrap() {
        assert!(k["time_us"].is_number() && k["peak_fraction"].is_number(), "{k}");
    }
}
