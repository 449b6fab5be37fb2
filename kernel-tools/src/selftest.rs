//! `strata device --selftest`: every kernel of the code object, on the chosen device, against
//! an independent CPU reference (the `quant` crate's scalar quantizers / dequantizers / dots,
//! `cpu_kernels`, the engine's CPU attention, KV cache and MoE code), then timed.
//!
//! The suite is a list of named [`Check`]s over [`GpuOps`] (the launch path shared by `emu`
//! and `hip`), each declaring the kernels it validates. [`run_suite`] runs them through a
//! [`Recorder`] that sees every launch, so a check that does not launch what it declares fails,
//! and the report lists every kernel of the code object that no check covers as a failure.
//! After its comparisons a check times its main launch ([`Cx::bench`]): with device events
//! (HIP) it reports µs, GB/s of the ideal bytes (every input and output byte once) and the
//! share of the card's peak bandwidth ([`peak_bandwidth`]); the software device has no clock,
//! so its times are null and its report carries the emulator's byte counters instead.
//!
//! Shapes: small on `emu` (the whole suite in well under a minute), full-size (4096-wide
//! decode shapes) on a card. Checks live in `selftest/checks_*.rs`, references and
//! tolerances in `selftest/reference.rs`, the pass/fail logic in `selftest/compare.rs`.
mod checks_matmul;
mod checks_ops;
mod checks_qwen4exp;
pub mod compare;
mod record;
pub mod reference;
mod report;

pub use compare::{Comparison, Metric};
pub use record::Recorder;
pub use report::{KernelSummary, PeakBandwidth, Report, peak_bandwidth};

use crate::bench::random_blocks;
use gpu_executor::WType;
use gpu_executor::device::{DevicePtr, Event, GpuApi, GpuError, Module, Stream};
use gpu_executor::ops::GpuOps;
use rng::SplitMix64;
use std::sync::Arc;

/// Problem sizes of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shapes {
    /// Small shapes (edge cases, remainders) that the software device runs quickly.
    Small,
    /// Decode-sized shapes of a 4096-wide model: meaningful times on a card.
    Full,
}

impl Shapes {
    pub fn name(self) -> &'static str {
        match self {
            Shapes::Small => "small",
            Shapes::Full => "full",
        }
    }
}

/// What [`run_suite`] runs.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `None`: small on the software device, full on a card.
    pub shapes: Option<Shapes>,
    /// Run only the checks whose name contains one of these (empty: all).
    pub only: Vec<String>,
    /// Test hook: the checks whose name contains this string compare against a deliberately
    /// corrupted CPU reference, so they must fail (proves a failure is reported as one).
    pub corrupt_reference: Option<String>,
    /// Peak bandwidth (GB/s) to report shares against instead of the table's value.
    pub peak_gbs: Option<f64>,
}

/// The error of a check that could not complete (a refused or failed launch, a bad shape).
#[derive(Debug)]
pub struct CheckError(pub String);
impl From<GpuError> for CheckError {
    fn from(e: GpuError) -> Self {
        CheckError(e.to_string())
    }
}
impl From<String> for CheckError {
    fn from(e: String) -> Self {
        CheckError(e)
    }
}
impl From<&str> for CheckError {
    fn from(e: &str) -> Self {
        CheckError(e.to_string())
    }
}
pub type CheckResultOf<T> = std::result::Result<T, CheckError>;

type CheckFn = Box<dyn Fn(&mut Cx) -> CheckResultOf<()> + Send + Sync>;

/// One named check: uploads inputs, launches, compares with a CPU reference, times a launch.
pub struct Check {
    pub name: String,
    /// The kernels this check validates; each must be launched by it.
    pub kernels: Vec<&'static str>,
    /// The CPU reference it compares against.
    pub reference: &'static str,
    run: CheckFn,
}

impl Check {
    pub fn new(
        name: impl Into<String>,
        kernels: Vec<&'static str>,
        reference: &'static str,
        run: impl Fn(&mut Cx) -> CheckResultOf<()> + Send + Sync + 'static,
    ) -> Check {
        Check { name: name.into(), kernels, reference, run: Box::new(run) }
    }
}

/// Every check of the suite, in report order.
pub fn all_checks() -> Vec<Check> {
    let mut v = checks_matmul::checks();
    v.extend(checks_ops::checks());
    v.extend(checks_qwen4exp::checks());
    v
}

/// Every kernel the suite must cover: the kernel registry's entries for `arch` and the kernels
/// of the loaded code object (its metadata, in case the two ever differ), sorted.
pub fn registry(arch: &str, module: &Module) -> Vec<String> {
    let mut names: std::collections::BTreeSet<String> = module.kernels.iter().map(|k| k.name.clone()).collect();
    names.extend(gpu_executor::registry::for_arch(arch).map(|k| k.name.to_string()));
    names.into_iter().collect()
}

/// Launch time of one check's main launch.
#[derive(Clone, Debug)]
pub struct Timing {
    /// Every input and output byte of the launch once (weights, activations, outputs).
    pub ideal_bytes: u64,
    /// Median µs per launch (device events); `None` without a device clock (software device).
    pub time_us: Option<f64>,
    /// Launches timed in total (0 without a clock).
    pub launches: u32,
    /// Global bytes the software device counted for one launch (`None` on a card).
    pub emu_bytes_moved: Option<u64>,
}

impl Timing {
    /// GB/s of the ideal bytes.
    pub fn gbs(&self) -> Option<f64> {
        self.time_us.filter(|&t| t > 0.0).map(|t| self.ideal_bytes as f64 / t / 1e3)
    }
}

/// The outcome of one check.
#[derive(Clone, Debug)]
pub struct CheckResult {
    pub name: String,
    pub kernels: Vec<&'static str>,
    pub reference: &'static str,
    /// Every kernel the check launched (sorted).
    pub launched: Vec<String>,
    pub shape: String,
    pub comparisons: Vec<Comparison>,
    /// Why the check could not complete (then it fails).
    pub error: Option<String>,
    pub timing: Option<Timing>,
    /// Whether the reference was corrupted on purpose ([`Options::corrupt_reference`]).
    pub corrupted_reference: bool,
    pub wall_ms: f64,
}

impl CheckResult {
    pub fn pass(&self) -> bool {
        self.error.is_none() && !self.comparisons.is_empty() && self.comparisons.iter().all(Comparison::pass)
    }
    /// The comparison closest to (or past) its tolerance.
    pub fn worst(&self) -> Option<&Comparison> {
        self.comparisons.iter().max_by(|a, b| a.severity().total_cmp(&b.severity()))
    }
}

/// Device events of the timed launches.
struct Clock {
    start: Event,
    end: Event,
    /// Whether the device reports elapsed times (HIP) or not (the software device).
    available: bool,
}

/// Samples per timed launch and the batch length of a sample (~2 ms of launches, at most 200).
const TIMING_SAMPLES: usize = 5;
const TIMING_SAMPLE_US: f64 = 2000.0;
const TIMING_MAX_BATCH: u32 = 200;

/// What a check works with: the ops and device, its random source, the shape scale, and the
/// buffers it allocated (freed when it ends).
pub struct Cx<'a> {
    pub ops: &'a GpuOps,
    pub api: &'a dyn GpuApi,
    pub s: &'a Stream,
    pub full: bool,
    pub rng: SplitMix64,
    corrupt: bool,
    clock: &'a Clock,
    bufs: Vec<DevicePtr>,
    shape: String,
    comparisons: Vec<Comparison>,
    timing: Option<Timing>,
}

fn le_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn le_u32(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Cx<'_> {
    /// Describes the shape the check ran (for the report).
    pub fn set_shape(&mut self, shape: impl Into<String>) {
        self.shape = shape.into();
    }
    pub fn rand_f32(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.rng.symmetric() * scale).collect()
    }
    /// `nblocks` random blocks of `ty` (every quant bit pattern, realistic scales).
    pub fn blocks(&mut self, ty: WType, nblocks: usize) -> Vec<u8> {
        random_blocks(ty, nblocks, &mut self.rng)
    }
    pub fn up(&mut self, bytes: &[u8]) -> CheckResultOf<DevicePtr> {
        let p = self.api.malloc(bytes.len().max(16))?;
        self.bufs.push(p);
        self.api.memcpy_htod(p, bytes)?;
        Ok(p)
    }
    pub fn upf(&mut self, v: &[f32]) -> CheckResultOf<DevicePtr> {
        self.up(&le_f32(v))
    }
    pub fn upu(&mut self, v: &[u32]) -> CheckResultOf<DevicePtr> {
        self.up(&le_u32(v))
    }
    pub fn zeros(&mut self, bytes: usize) -> CheckResultOf<DevicePtr> {
        let p = self.api.malloc(bytes.max(16))?;
        self.bufs.push(p);
        self.api.memset(p, 0, bytes.max(16))?;
        Ok(p)
    }
    /// `bytes` bytes at `p` after the stream's work is done.
    pub fn read(&self, p: DevicePtr, bytes: usize) -> CheckResultOf<Vec<u8>> {
        self.api.stream_synchronize(self.s)?;
        self.api.synchronize()?;
        let mut v = vec![0u8; bytes];
        self.api.memcpy_dtoh(&mut v, p)?;
        Ok(v)
    }
    pub fn read_f32(&self, p: DevicePtr, n: usize) -> CheckResultOf<Vec<f32>> {
        Ok(self.read(p, n * 4)?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
    pub fn read_u32(&self, p: DevicePtr, n: usize) -> CheckResultOf<Vec<u32>> {
        Ok(self.read(p, n * 4)?.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
    pub fn read_u16(&self, p: DevicePtr, n: usize) -> CheckResultOf<Vec<u16>> {
        Ok(self.read(p, n * 2)?.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect())
    }

    // ---- comparisons (the corruption hook changes the reference's first element)

    fn corrupted_f32(&self, want: &[f32]) -> Vec<f32> {
        let mut w = want.to_vec();
        if self.corrupt
            && let Some(x) = w.first_mut()
        {
            *x = if x.is_finite() { *x + 1.0 + 2.0 * x.abs() } else { 0.0 };
        }
        w
    }
    pub fn cmp_bits(&mut self, what: &str, got: &[f32], want: &[f32]) {
        let want = self.corrupted_f32(want);
        self.comparisons.push(compare::bits_f32(what, got, &want));
    }
    pub fn cmp_bytes(&mut self, what: &str, got: &[u8], want: &[u8]) {
        let mut want = want.to_vec();
        if self.corrupt
            && let Some(x) = want.first_mut()
        {
            *x ^= 0xff;
        }
        self.comparisons.push(compare::bytes(what, got, &want));
    }
    pub fn cmp_halves(&mut self, what: &str, got: &[u16], want: &[u16], bf16: bool) {
        let mut want = want.to_vec();
        if self.corrupt
            && let Some(x) = want.first_mut()
        {
            *x ^= 0x4000;
        }
        self.comparisons.push(compare::halves(what, got, &want, bf16));
    }
    pub fn cmp_ids(&mut self, what: &str, got: &[u32], want: &[u32]) {
        let mut want = want.to_vec();
        if self.corrupt
            && let Some(x) = want.first_mut()
        {
            *x = x.wrapping_add(1);
        }
        self.comparisons.push(compare::ids(what, got, &want));
    }
    pub fn cmp_abs(&mut self, what: &str, got: &[f32], want: &[f32], tol: f64) {
        let want = self.corrupted_f32(want);
        self.comparisons.push(compare::abs(what, got, &want, tol));
    }
    pub fn cmp_rel_floor1(&mut self, what: &str, got: &[f32], want: &[f32], tol: f64) {
        let want = self.corrupted_f32(want);
        self.comparisons.push(compare::rel_floor1(what, got, &want, tol));
    }
    /// Against an f64 reference with per-element scales ([`Metric::RelDotMagnitude`] /
    /// [`Metric::RelBound`]).
    pub fn cmp_scaled(&mut self, what: &str, metric: Metric, got: &[f32], want: &[f64], scale: &[f64], tol: f64) {
        let mut want = want.to_vec();
        if self.corrupt
            && let (Some(x), Some(s)) = (want.first_mut(), scale.first())
        {
            *x += 10.0 * (s + 1.0);
        }
        self.comparisons.push(compare::rel_scaled(what, metric, got, &want, scale, tol));
    }

    /// Times `launch` (the check's main launch, already validated): with a device clock, the
    /// median of [`TIMING_SAMPLES`] batches of back-to-back launches; without one (the software
    /// device) one launch whose byte counters are kept. `ideal_bytes` = every input and output
    /// byte of one launch once. Call after the comparisons (launches may work in place).
    pub fn bench(
        &mut self,
        ideal_bytes: u64,
        launch: &dyn Fn(&GpuOps, &Stream) -> Result<(), GpuError>,
    ) -> CheckResultOf<()> {
        let (api, s) = (self.api, self.s);
        let _ = api.take_stats();
        launch(self.ops, s)?;
        api.stream_synchronize(s)?;
        let emu_bytes_moved = api.take_stats().map(|st| st.global_bytes_read + st.global_bytes_written);
        let (mut time_us, mut launches) = (None, 0);
        if self.clock.available {
            let batch = |n: u32| -> Result<f64, GpuError> {
                api.event_record(&self.clock.start, s)?;
                for _ in 0..n {
                    launch(self.ops, s)?;
                }
                api.event_record(&self.clock.end, s)?;
                api.event_synchronize(&self.clock.end)?;
                let ms = api.event_elapsed_ms(&self.clock.start, &self.clock.end)?.unwrap_or(0.0);
                Ok(ms as f64 * 1e3 / n as f64)
            };
            let one = batch(1)?;
            let n = ((TIMING_SAMPLE_US / one.max(0.5)).ceil() as u32).clamp(1, TIMING_MAX_BATCH);
            let mut samples = Vec::with_capacity(TIMING_SAMPLES);
            for _ in 0..TIMING_SAMPLES {
                samples.push(batch(n)?);
            }
            samples.sort_by(f64::total_cmp);
            time_us = Some(samples[TIMING_SAMPLES / 2]);
            launches = 1 + n * TIMING_SAMPLES as u32;
        }
        self.timing = Some(Timing { ideal_bytes, time_us, launches, emu_bytes_moved });
        Ok(())
    }
}

/// A deterministic seed per check name (FNV-1a), so a check's data do not depend on which
/// other checks ran.
fn seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// Runs the suite on `api` (`progress` after each check) and returns the report. Errors only
/// when the device cannot load the kernels at all; a failing check is a failed entry.
pub fn run_suite(
    api: Arc<dyn GpuApi>,
    opts: &Options,
    progress: &mut dyn FnMut(&CheckResult),
) -> Result<Report, GpuError> {
    let t0 = std::time::Instant::now();
    let info = api.info().clone();
    let shapes = opts.shapes.unwrap_or(if info.backend == gpu_executor::device::Device::Emu {
        Shapes::Small
    } else {
        Shapes::Full
    });
    let recorder = Arc::new(Recorder::new(api));
    let ops = GpuOps::new(recorder.clone())?;
    let module = recorder.load_module()?;
    let stream = recorder.stream_create()?;
    let clock = {
        let (start, end) = (recorder.event_create_timing()?, recorder.event_create_timing()?);
        // Does the device report elapsed times? (HIP: yes; the software device: no.)
        recorder.event_record(&start, &stream)?;
        recorder.event_record(&end, &stream)?;
        recorder.event_synchronize(&end)?;
        let available = recorder.event_elapsed_ms(&start, &end)?.is_some();
        Clock { start, end, available }
    };
    let checks = all_checks();
    let covered: std::collections::BTreeSet<&str> = checks.iter().flat_map(|c| c.kernels.iter().copied()).collect();
    let registry = registry(&info.arch, &module);
    let unchecked: Vec<String> = registry.iter().filter(|k| !covered.contains(k.as_str())).cloned().collect();
    let mut results = Vec::new();
    for check in checks.iter().filter(|c| opts.only.is_empty() || opts.only.iter().any(|o| c.name.contains(o.as_str())))
    {
        let corrupt = opts.corrupt_reference.as_deref().is_some_and(|c| check.name.contains(c));
        let mut cx = Cx {
            ops: &ops,
            api: &*recorder,
            s: &stream,
            full: shapes == Shapes::Full,
            rng: SplitMix64::new(seed(&check.name)),
            corrupt,
            clock: &clock,
            bufs: Vec::new(),
            shape: String::new(),
            comparisons: Vec::new(),
            timing: None,
        };
        let _ = recorder.take_launched();
        let tc = std::time::Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (check.run)(&mut cx)));
        let _ = recorder.synchronize();
        let mut error = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.0),
            Err(p) => Some(format!("the check panicked: {}", panic_message(p))),
        };
        for p in cx.bufs.drain(..) {
            let _ = recorder.free(p);
        }
        let launched = recorder.take_launched();
        if error.is_none() {
            let missing: Vec<&str> =
                check.kernels.iter().copied().filter(|k| !launched.iter().any(|l| l == k)).collect();
            if !missing.is_empty() {
                error = Some(format!("declared kernels not launched: {}", missing.join(", ")));
            } else if cx.comparisons.is_empty() {
                error = Some("no comparison was made".into());
            }
        }
        let r = CheckResult {
            name: check.name.clone(),
            kernels: check.kernels.clone(),
            reference: check.reference,
            launched,
            shape: std::mem::take(&mut cx.shape),
            comparisons: std::mem::take(&mut cx.comparisons),
            error,
            timing: cx.timing.take(),
            corrupted_reference: corrupt,
            wall_ms: tc.elapsed().as_secs_f64() * 1e3,
        };
        progress(&r);
        results.push(r);
    }
    let _ = recorder.event_destroy(clock.start);
    let _ = recorder.event_destroy(clock.end);
    let _ = recorder.stream_destroy(stream);
    let peak = peak_of(opts, &info);
    Ok(Report {
        info,
        shapes,
        peak,
        timed: clock.available,
        checks: results,
        registry,
        unchecked,
        filtered: !opts.only.is_empty(),
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

/// The peak bandwidth shares are computed against: the override, else the card table.
fn peak_of(opts: &Options, info: &gpu_executor::device::DeviceInfo) -> Option<PeakBandwidth> {
    match opts.peak_gbs {
        Some(gbs) => Some(PeakBandwidth { gbs, source: "given (STRATA_PEAK_GBS)".into() }),
        None => peak_bandwidth(info),
    }
}

/// `strata device --selftest [--report FILE]` on `--device hip|emu` (auto = hip): prints a
/// table, writes the JSON report, fails when a check fails. Environment: `STRATA_SELFTEST_ONLY`
/// (comma-separated name filters), `STRATA_SELFTEST_SHAPES` (small|full),
/// `STRATA_PEAK_GBS` (peak bandwidth to compare with), `STRATA_SELFTEST_CORRUPT` (test hook:
/// corrupt the reference of matching checks).
/// `device`: `--device`; `gpu`: `--gpu N`; `report`: `--report FILE`.
pub fn run_cli(
    device: gpu_executor::options::Device,
    gpu: Option<usize>,
    report: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    use anyhow::{Context, bail};
    use gpu_executor::device::open_device;
    use gpu_executor::options::Device;
    let kind = match device {
        Device::Emu => Device::Emu,
        Device::Hip | Device::Auto => Device::Hip,
        Device::Cpu => bail!(
            "the selftest checks the GPU kernels: use --device hip (a card) or --device emu (the software RDNA3 device)"
        ),
    };
    // `--gpu N` picks a HIP device by the index `strata device` lists (else STRATA_HIP_DEVICE).
    let opened = match (kind, gpu) {
        (Device::Hip, Some(n)) => {
            let cfg =
                gpu_executor::device::HipConfig { device: n as u32, ..gpu_executor::device::HipConfig::from_env() };
            gpu_executor::device::HipApi::open(&cfg).map(|h| Box::new(h) as Box<dyn GpuApi>)
        }
        _ => open_device(kind),
    };
    let api = opened.map_err(|e| {
        anyhow::anyhow!("--device {}: {e}\n(the kernels can be checked on the software RDNA3 device: strata device --selftest --device emu)", device.name())
    })?;
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let shapes = match env("STRATA_SELFTEST_SHAPES").as_deref() {
        None => None,
        Some("small") => Some(Shapes::Small),
        Some("full") => Some(Shapes::Full),
        Some(other) => bail!("STRATA_SELFTEST_SHAPES={other:?}: expected small or full"),
    };
    let peak_gbs = match env("STRATA_PEAK_GBS") {
        None => None,
        Some(v) => match v.trim().parse::<f64>() {
            Ok(g) if g > 0.0 => Some(g),
            _ => bail!("STRATA_PEAK_GBS={v:?}: expected a positive number of GB/s"),
        },
    };
    let opts = Options {
        shapes,
        only: env("STRATA_SELFTEST_ONLY")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default(),
        corrupt_reference: env("STRATA_SELFTEST_CORRUPT"),
        peak_gbs,
    };
    let info = api.info().clone();
    let arch = gpu_executor::device::arch_base(&info.arch).to_string();
    let emu = info.backend == gpu_executor::options::Device::Emu;
    let shape_name = opts.shapes.unwrap_or(if emu { Shapes::Small } else { Shapes::Full }).name();
    println!(
        "strata selftest on {} ({arch}, {}): {shape_name} shapes{}",
        info.name,
        info.runtime,
        if emu { ", no device clock (times null)" } else { "" }
    );
    let peak = peak_of(&opts, &info);
    println!("{}", report::table_header());
    let rep = run_suite(Arc::from(api), &opts, &mut |r| println!("{}", report::table_row(r, peak.as_ref())))
        .context("selftest")?;
    println!("{}", rep.summary());
    let path = report.unwrap_or_else(|| std::path::PathBuf::from(format!("strata-selftest-{arch}.json")));
    let text = serde_json::to_string_pretty(&rep.to_json()).context("serializing the report")?;
    std::fs::write(&path, text + "\n").with_context(|| format!("writing the report to {}", path.display()))?;
    println!("report written to {}", path.display());
    if !rep.pass() {
        bail!("selftest failed: {} (report: {})", rep.failure_summary(), path.display());
    }
    Ok(())
}
