//! The selftest report: the device, every check, a per-kernel summary, the table printed to
//! stdout and the JSON written to `--report`; and the peak bandwidth a card is compared with.
use super::{CheckResult, Comparison, Shapes};
use gpu_executor::device::{Device, DeviceInfo, arch_base};
use serde_json::{Value, json};
use std::fmt::Write;

/// Bump when the JSON layout changes.
pub const REPORT_FORMAT: &str = "strata-selftest/1";

/// Peak DRAM bandwidth a card's GB/s are shared against.
#[derive(Clone, Debug, PartialEq)]
pub struct PeakBandwidth {
    pub gbs: f64,
    /// Where the figure comes from (the matched card, or the override).
    pub source: String,
}

/// RDNA3 cards by marketing name (as `hipDeviceGetName` reports it), most specific first: bus
/// width x memory data rate from AMD's specifications (e.g. RX 7900 XTX: 384 bit x 20 Gbps =
/// 960 GB/s). A name not in the table has no peak (shares are null; `STRATA_PEAK_GBS` sets one).
const CARDS: &[(&str, f64)] = &[
    ("7900 XTX", 960.0), // gfx1100, 384-bit GDDR6 20 Gbps
    ("7900 XT", 800.0),  // gfx1100, 320-bit 20 Gbps
    ("7900 GRE", 576.0), // gfx1100, 256-bit 18 Gbps
    ("W7900", 864.0),    // gfx1100, 384-bit 18 Gbps
    ("W7800", 576.0),    // gfx1100, 256-bit 18 Gbps
    ("7800 XT", 624.0),  // gfx1101, 256-bit 19.5 Gbps
    ("7700 XT", 432.0),  // gfx1101, 192-bit 18 Gbps
    ("7600", 288.0),     // gfx1102 (7600, 7600 XT), 128-bit 18 Gbps
];

/// The peak bandwidth of the device by its name (gfx11 cards only); `None` for the software
/// device and for cards not in the table.
pub fn peak_bandwidth(info: &DeviceInfo) -> Option<PeakBandwidth> {
    if info.backend == Device::Emu || !arch_base(&info.arch).starts_with("gfx11") {
        return None;
    }
    // "7900 XT" is a prefix of "7900 XTX": the table lists the longer name first, and a match
    // must not continue with a letter or digit.
    let name = info.name.to_ascii_uppercase();
    CARDS.iter().find_map(|&(card, gbs)| {
        let at = name.find(card)?;
        let next = name[at + card.len()..].chars().next();
        (!next.is_some_and(|c| c.is_ascii_alphanumeric()))
            .then(|| PeakBandwidth { gbs, source: format!("{card} ({} GB/s, AMD specification)", gbs) })
    })
}

/// One kernel of the registry over the checks that validate it.
#[derive(Clone, Debug)]
pub struct KernelSummary {
    pub name: String,
    pub checks: Vec<String>,
    pub pass: bool,
    /// The comparison closest to its tolerance over those checks.
    pub worst: Option<Comparison>,
    /// Timing of the first of its checks that timed a launch (µs; None on the software device).
    pub time_us: Option<f64>,
    pub gbs: Option<f64>,
    pub ideal_bytes: Option<u64>,
}

/// Everything a selftest run found.
#[derive(Clone, Debug)]
pub struct Report {
    pub info: DeviceInfo,
    pub shapes: Shapes,
    pub peak: Option<PeakBandwidth>,
    /// Whether launches were timed (the device has a clock).
    pub timed: bool,
    pub checks: Vec<CheckResult>,
    /// Every kernel the suite must cover (code object metadata and gpu-abi lists).
    pub registry: Vec<String>,
    /// Kernels of the registry that no check of the suite declares: a failure.
    pub unchecked: Vec<String>,
    /// Only some checks ran (`Options::only`): kernels without a run check are not failures.
    pub filtered: bool,
    pub wall_s: f64,
}

fn num(v: f64) -> Value {
    // JSON has no inf/NaN: such errors are written as strings.
    if v.is_finite() { json!(v) } else { json!(format!("{v}")) }
}

fn comparison_json(c: &Comparison) -> Value {
    json!({
        "what": c.what,
        "metric": c.metric.name(),
        "max_error": num(c.max_error),
        "tolerance": c.tolerance,
        "elements": c.elements,
        "mismatches": c.mismatches,
        "pass": c.pass(),
        "first_failure": c.first_failure,
    })
}

impl Report {
    pub fn pass(&self) -> bool {
        self.unchecked.is_empty()
            && !self.checks.is_empty()
            && self.checks.iter().all(CheckResult::pass)
            && self.kernels().iter().all(|k| k.pass)
    }

    fn share(&self, gbs: Option<f64>) -> Option<f64> {
        Some(gbs? / self.peak.as_ref()?.gbs)
    }

    /// Per kernel of the registry (sorted), over the checks that ran. Without a filter a kernel
    /// no check ran fails.
    pub fn kernels(&self) -> Vec<KernelSummary> {
        self.registry
            .iter()
            .filter_map(|k| {
                let runs: Vec<&CheckResult> = self.checks.iter().filter(|c| c.kernels.contains(&k.as_str())).collect();
                if runs.is_empty() && self.filtered {
                    return None;
                }
                let worst =
                    runs.iter().filter_map(|c| c.worst()).max_by(|a, b| a.severity().total_cmp(&b.severity())).cloned();
                let timed = runs.iter().find_map(|c| c.timing.as_ref());
                Some(KernelSummary {
                    name: k.clone(),
                    checks: runs.iter().map(|c| c.name.clone()).collect(),
                    pass: !runs.is_empty() && runs.iter().all(|c| c.pass()),
                    worst,
                    time_us: timed.and_then(|t| t.time_us),
                    gbs: timed.and_then(|t| t.gbs()),
                    ideal_bytes: timed.map(|t| t.ideal_bytes),
                })
            })
            .collect()
    }

    /// "3 of 150 checks failed (a, b, c); kernels without a check: x".
    pub fn failure_summary(&self) -> String {
        let failed: Vec<&str> = self.checks.iter().filter(|c| !c.pass()).map(|c| c.name.as_str()).collect();
        let mut s = format!("{} of {} checks failed", failed.len(), self.checks.len());
        if !failed.is_empty() {
            let _ = write!(
                s,
                " ({}{})",
                failed.iter().take(10).copied().collect::<Vec<_>>().join(", "),
                if failed.len() > 10 { ", ..." } else { "" }
            );
        }
        if !self.unchecked.is_empty() {
            let _ = write!(s, "; kernels of the code object without a check: {}", self.unchecked.join(", "));
        }
        s
    }

    /// The closing lines of the printed table.
    pub fn summary(&self) -> String {
        let kernels = self.kernels();
        let kpass = kernels.iter().filter(|k| k.pass).count();
        let mut s = format!(
            "{} of {} checks passed, {kpass} of {} kernels; {:.1} s on {}",
            self.checks.iter().filter(|c| c.pass()).count(),
            self.checks.len(),
            kernels.len(),
            self.wall_s,
            self.info.name
        );
        if !self.timed {
            s += "\n(no device clock: times are null; the software device's byte counters are in the report)";
        }
        match &self.peak {
            Some(p) if self.timed => {
                let _ = write!(s, "\npeak bandwidth {:.0} GB/s: {}", p.gbs, p.source);
            }
            None if self.timed => s += "\npeak bandwidth unknown for this card name: set STRATA_PEAK_GBS for shares",
            _ => {}
        }
        if !self.pass() {
            let _ = write!(s, "\nFAILED: {}", self.failure_summary());
        }
        s
    }

    pub fn to_json(&self) -> Value {
        let i = &self.info;
        let checks: Vec<Value> = self
            .checks
            .iter()
            .map(|c| {
                let w = c.worst();
                let t = c.timing.as_ref();
                json!({
                    "name": c.name,
                    "kernels": c.kernels,
                    "launched": c.launched,
                    "reference": c.reference,
                    "shape": c.shape,
                    "pass": c.pass(),
                    "max_error": w.map(|w| num(w.max_error)),
                    "tolerance": w.map(|w| w.tolerance),
                    "metric": w.map(|w| w.metric.name()),
                    "comparisons": c.comparisons.iter().map(comparison_json).collect::<Vec<_>>(),
                    "error": c.error,
                    "corrupted_reference": c.corrupted_reference,
                    "time_us": t.and_then(|t| t.time_us),
                    "gbs": t.and_then(|t| t.gbs()),
                    "peak_fraction": self.share(t.and_then(|t| t.gbs())),
                    "ideal_bytes": t.map(|t| t.ideal_bytes),
                    "timed_launches": t.map(|t| t.launches),
                    "emu_bytes_moved": t.and_then(|t| t.emu_bytes_moved),
                    "wall_ms": c.wall_ms,
                })
            })
            .collect();
        let kernels: Vec<Value> = self
            .kernels()
            .iter()
            .map(|k| {
                json!({
                    "name": k.name,
                    "pass": k.pass,
                    "checks": k.checks,
                    "max_error": k.worst.as_ref().map(|w| num(w.max_error)),
                    "tolerance": k.worst.as_ref().map(|w| w.tolerance),
                    "metric": k.worst.as_ref().map(|w| w.metric.name()),
                    "time_us": k.time_us,
                    "gbs": k.gbs,
                    "peak_fraction": self.share(k.gbs),
                    "ideal_bytes": k.ideal_bytes,
                })
            })
            .collect();
        let passed = self.checks.iter().filter(|c| c.pass()).count();
        json!({
            "format": REPORT_FORMAT,
            "strata_version": env!("CARGO_PKG_VERSION"),
            "created_unix": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            "pass": self.pass(),
            "device": {
                "backend": if i.backend == Device::Emu { "emu" } else { "hip" },
                "index": i.index,
                "name": i.name,
                "arch": arch_base(&i.arch),
                "arch_full": i.arch,
                "compute_units": i.compute_units,
                "vram_bytes": i.vram_bytes,
                "wave_size": i.wave_size,
                "runtime": i.runtime,
                // "HIP runtime 6.4.43483 at /opt/rocm/lib/libamdhip64.so" -> "6.4.43483".
                "hip_version": i.runtime.strip_prefix("HIP runtime ").and_then(|r| r.split(" at ").next()),
                "hipblas": i.blas,
                "hipblaslt": i.blas_lt,
                "hipblaslt_version": i.blas_lt_version,
            },
            "shapes": self.shapes.name(),
            "timed": self.timed,
            "peak_bandwidth_gbs": self.peak.as_ref().map(|p| p.gbs),
            "peak_bandwidth_source": self.peak.as_ref().map(|p| p.source.clone()),
            "summary": {
                "checks": self.checks.len(),
                "passed": passed,
                "failed": self.checks.len() - passed,
                "kernels": kernels.len(),
                "kernels_passed": self.kernels().iter().filter(|k| k.pass).count(),
                "kernels_without_check": self.unchecked,
                "filtered": self.filtered,
            },
            "wall_seconds": self.wall_s,
            "checks": checks,
            "kernels": kernels,
        })
    }
}

/// Column titles of [`table_row`].
pub fn table_header() -> String {
    format!(
        "{:<34} {:<4} {:>10} {:>9} {:>10} {:>8} {:>6}  {}",
        "check", "", "max error", "tolerance", "time us", "GB/s", "peak", "shape"
    )
}

/// One line per check: status, worst error and its tolerance, time, GB/s and share of `peak`.
pub fn table_row(r: &CheckResult, peak: Option<&PeakBandwidth>) -> String {
    let status = if r.pass() { "ok" } else { "FAIL" };
    let w = r.worst();
    let err = w.map_or("-".into(), |w| format!("{:.2e}", w.max_error));
    let tol = w.map_or("-".into(), |w| match w.metric {
        m if m.is_exact() => "exact".into(),
        super::Metric::RelBound => "bound".into(),
        _ => format!("{:.0e}", w.tolerance),
    });
    let t = r.timing.as_ref();
    let time = t.and_then(|t| t.time_us).map_or("-".into(), |v| format!("{v:.2}"));
    let gbs = t.and_then(|t| t.gbs());
    let share = gbs.zip(peak).map_or("-".into(), |(g, p)| format!("{:.0}%", 100.0 * g / p.gbs));
    let mut line = format!(
        "{:<34} {status:<4} {err:>10} {tol:>9} {time:>10} {:>8} {share:>6}  {}",
        r.name,
        gbs.map_or("-".into(), |g| format!("{g:.1}")),
        r.shape
    );
    if let Some(e) = &r.error {
        let _ = write!(line, "\n    error: {e}");
    }
    for c in r.comparisons.iter().filter(|c| !c.pass()) {
        let _ = write!(
            line,
            "\n    {}: {} ({}, tolerance {:e})",
            c.what,
            c.first_failure.as_deref().unwrap_or("mismatch"),
            c.metric.name(),
            c.tolerance
        );
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(name: &str) -> DeviceInfo {
        DeviceInfo {
            backend: Device::Hip,
            index: 0,
            name: name.into(),
            arch: "gfx1100".into(),
            wave_size: 32,
            vram_bytes: 24 << 30,
            compute_units: 96,
            runtime: "HIP runtime 6.4".into(),
            blas: None,
            blas_lt: None,
            blas_lt_version: None,
        }
    }

    #[test]
    fn peak_bandwidth_by_card_name() {
        assert_eq!(peak_bandwidth(&card("AMD Radeon RX 7900 XTX")).map(|p| p.gbs), Some(960.0));
        assert_eq!(peak_bandwidth(&card("AMD Radeon RX 7900 XT")).map(|p| p.gbs), Some(800.0));
        assert_eq!(peak_bandwidth(&card("Radeon RX 7900 GRE")).map(|p| p.gbs), Some(576.0));
        assert_eq!(peak_bandwidth(&card("AMD Radeon PRO W7900")).map(|p| p.gbs), Some(864.0));
        assert_eq!(peak_bandwidth(&card("AMD Radeon RX 7600 XT")).map(|p| p.gbs), Some(288.0));
        assert_eq!(peak_bandwidth(&card("AMD Radeon Graphics")), None);
        let mut emu = card("AMD Radeon RX 7900 XTX");
        emu.backend = Device::Emu;
        assert_eq!(peak_bandwidth(&emu), None);
    }
}
