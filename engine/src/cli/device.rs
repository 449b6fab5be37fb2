//! `strata device`: the AMD GPUs of this machine and whether Strata can use them.
//!
//! Two sources, both always reported: the HIP runtime (with `--features gpu`: every device it
//! opens, with runtime, hipBLAS and hipBLASLt versions, or why it does not open) and the
//! kernel's KFD topology ([`gpu_executor::kfd`], works in a CPU build and without ROCm). The
//! recommended backend is `hip` when HIP opens a usable device or, failing that, KFD shows a
//! supported card (ROCm then has to be installed), else `cpu`. `--json` prints the same facts
//! for `setup.sh`; `--selftest` hands over to the GPU self-test.
use anyhow::{Result, bail};
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;

use super::Common;
use gpu_executor::kfd::{self, KfdReport, gib};

#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Print the facts as one JSON object (for scripts such as setup.sh).
    #[arg(long)]
    pub json: bool,
    /// Choose GPU N of the listing (default: the supported GPU with the most VRAM).
    #[arg(long, value_name = "N")]
    pub gpu: Option<usize>,
    /// Run every kernel parity test and microbenchmark on the chosen device (--device hip|emu)
    /// and write a JSON report.
    #[arg(long)]
    pub selftest: bool,
    /// With --selftest: where the JSON report is written.
    #[arg(long, value_name = "FILE", requires = "selftest")]
    pub report: Option<PathBuf>,
}

/// A device HIP opened and accepted.
#[derive(Clone, Debug, Serialize)]
pub struct HipDevice {
    pub index: u32,
    pub name: String,
    pub arch: String,
    pub compute_units: u32,
    pub vram_bytes: u64,
    pub wave_size: u32,
    /// Runtime version and library path.
    pub runtime: String,
    pub blas: Option<String>,
    pub blas_lt: Option<String>,
    pub blas_lt_version: Option<String>,
}

/// A device HIP sees but this build refuses (arch, wave size, VRAM).
#[derive(Clone, Debug, Serialize)]
pub struct HipRefused {
    pub index: u32,
    pub name: String,
    pub arch: String,
    pub why: String,
}

/// The HIP half of the listing.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HipListing {
    /// Built with `--features gpu` (else HIP is not tried).
    pub built: bool,
    /// Why the runtime gave no device (library missing or too old, no device).
    pub error: Option<String>,
    pub devices: Vec<HipDevice>,
    pub refused: Vec<HipRefused>,
}

/// Opens HIP device 0, 1, ... until the runtime says there are no more.
#[cfg(feature = "gpu")]
fn probe_hip() -> HipListing {
    use gpu_executor::device::{GpuApi, GpuError, HipApi, HipConfig};
    let mut out = HipListing { built: true, ..Default::default() };
    for i in 0..16u32 {
        let cfg = HipConfig { device: i, ..HipConfig::from_env() };
        match HipApi::open(&cfg) {
            Ok(api) => {
                let d = api.info();
                out.devices.push(HipDevice {
                    index: i,
                    name: d.name.clone(),
                    arch: d.arch.clone(),
                    compute_units: d.compute_units,
                    vram_bytes: d.vram_bytes,
                    wave_size: d.wave_size,
                    runtime: d.runtime.clone(),
                    blas: d.blas.clone(),
                    blas_lt: d.blas_lt.clone(),
                    blas_lt_version: d.blas_lt_version.clone(),
                });
            }
            Err(GpuError::UnsupportedDevice { index, name, arch, why, .. }) => {
                out.refused.push(HipRefused { index, name, arch, why })
            }
            Err(e) => {
                // Index 0: the runtime itself failed; later: past the last device.
                if i == 0 {
                    out.error = Some(e.to_string());
                } else if !matches!(e, GpuError::NoDevice { .. }) {
                    out.refused.push(HipRefused {
                        index: i,
                        name: String::new(),
                        arch: String::new(),
                        why: e.to_string(),
                    });
                }
                break;
            }
        }
    }
    out
}

#[cfg(not(feature = "gpu"))]
fn probe_hip() -> HipListing {
    HipListing {
        built: false,
        error: Some("not checked: this build has no --features gpu".into()),
        ..Default::default()
    }
}

/// The chosen GPU and where it was seen.
#[derive(Clone, Debug, Serialize)]
pub struct Selected {
    /// `hip` or `kfd`.
    pub via: &'static str,
    pub index: usize,
    pub name: String,
    pub arch: String,
    pub vram_bytes: Option<u64>,
    /// `ROCR_VISIBLE_DEVICES` value that shows only this card (from KFD; None without KFD).
    pub rocr_visible_devices: Option<String>,
}

/// Everything `strata device` reports.
#[derive(Clone, Debug, Serialize)]
pub struct Listing {
    pub sysfs_root: PathBuf,
    /// Archs this binary has (or, in a CPU build, a gpu build would have) code objects for.
    pub supported_archs: Vec<String>,
    pub kfd: Option<KfdReport>,
    /// A KFD file that could not be read or parsed.
    pub kfd_error: Option<String>,
    pub hip: HipListing,
    /// `hip` or `cpu`.
    pub backend: &'static str,
    pub reason: String,
    pub selected: Option<Selected>,
    /// `--gpu N` could not be honoured.
    pub selection_error: Option<String>,
}

/// Gathers the listing (`gpu`: the `--gpu N` choice).
pub fn probe(gpu: Option<usize>) -> Listing {
    let root = kfd::root_from_env();
    let supported_archs = kfd::supported_archs();
    let (kfd, kfd_error) = match kfd::discover(&root, &supported_archs) {
        Ok(r) => (Some(r), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let hip = probe_hip();
    let kfd_gpu = |i: usize| kfd.as_ref().and_then(|k| k.gpus.get(i));
    let mut l = Listing {
        sysfs_root: root,
        supported_archs,
        kfd: kfd.clone(),
        kfd_error,
        hip: hip.clone(),
        backend: "cpu",
        reason: String::new(),
        selected: None,
        selection_error: None,
    };
    if !hip.devices.is_empty() {
        let pick = match gpu {
            Some(n) => hip.devices.iter().find(|d| d.index as usize == n).ok_or_else(|| {
                let why = hip
                    .refused
                    .iter()
                    .find(|r| r.index as usize == n)
                    .map_or("no such device".to_string(), |r| r.why.clone());
                format!("--gpu {n}: HIP device {n} is not usable: {why}")
            }),
            None => {
                Ok(hip.devices.iter().fold(&hip.devices[0], |b, d| if d.vram_bytes > b.vram_bytes { d } else { b }))
            }
        };
        match pick {
            Ok(d) => {
                l.backend = "hip";
                l.reason = format!("HIP opens GPU {} ({}, {})", d.index, d.name, d.arch);
                l.selected = Some(Selected {
                    via: "hip",
                    index: d.index as usize,
                    name: d.name.clone(),
                    arch: d.arch.clone(),
                    vram_bytes: Some(d.vram_bytes),
                    rocr_visible_devices: kfd_gpu(d.index as usize).map(|g| g.rocr_visible_devices()),
                });
            }
            Err(e) => {
                l.reason = e.clone();
                l.selection_error = Some(e);
            }
        }
        return l;
    }
    match &kfd {
        None => l.reason = "the KFD topology could not be read".into(),
        Some(k) if !k.present => l.reason = "no AMD GPU: no KFD topology".into(),
        Some(k) => match k.select(gpu) {
            Ok(Some(g)) => {
                l.backend = "hip";
                l.reason = if hip.built {
                    "KFD shows a supported GPU, but HIP does not open it (see above)".into()
                } else {
                    "KFD shows a supported GPU; this CPU build does not try HIP".into()
                };
                l.selected = Some(Selected {
                    via: "kfd",
                    index: g.index,
                    name: g.name.clone(),
                    arch: g.arch.clone(),
                    vram_bytes: g.vram_bytes,
                    rocr_visible_devices: Some(g.rocr_visible_devices()),
                });
            }
            Ok(None) if k.gpus.is_empty() => l.reason = "no AMD GPU: KFD lists no GPU node".into(),
            Ok(None) => l.reason = format!("no supported AMD GPU: none of the {} KFD GPUs is supported", k.gpus.len()),
            Err(e) => {
                l.reason = e.clone();
                l.selection_error = Some(e);
            }
        },
    }
    l
}

/// The human-readable listing.
pub fn render(l: &Listing) -> String {
    let mut s = String::new();
    let mut line = |t: String| {
        s.push_str(&t);
        s.push('\n');
    };
    let sel = |via: &str, i: usize| l.selected.as_ref().is_some_and(|x| x.via == via && x.index == i);
    line(format!("HIP runtime:{}", if l.hip.built { "" } else { " (CPU build)" }));
    if let Some(e) = &l.hip.error {
        line(format!("  {e}"));
    }
    for d in &l.hip.devices {
        let mark = if sel("hip", d.index as usize) { "  <- selected" } else { "" };
        line(format!(
            "  GPU {}: {} ({}), {} CUs, {} VRAM, wave{}: usable{mark}",
            d.index,
            d.name,
            d.arch,
            d.compute_units,
            gib(d.vram_bytes),
            d.wave_size
        ));
        line(format!("    {}", d.runtime));
        line(format!("    hipBLAS: {}", d.blas.as_deref().unwrap_or("not loaded (dense GEMM unavailable)")));
        let lt = match (&d.blas_lt, &d.blas_lt_version) {
            (Some(p), Some(v)) => format!("{v} at {p}"),
            _ => "not loaded (optional)".into(),
        };
        line(format!("    hipBLASLt: {lt}"));
    }
    for r in &l.hip.refused {
        line(format!("  GPU {}: {} ({}): not supported: {}", r.index, r.name, r.arch, r.why));
    }
    line(format!("KFD topology ({}):", l.sysfs_root.join("sys/class/kfd").display()));
    match (&l.kfd, &l.kfd_error) {
        (_, Some(e)) => line(format!("  error: {e}")),
        (Some(k), _) if !k.present => line("  none (the amdgpu driver is not loaded, or there is no AMD GPU)".into()),
        (Some(k), _) => {
            let driver =
                k.driver_version.as_ref().map_or("in-tree (no /sys/module/amdgpu/version)".to_string(), |v| v.clone());
            let kernel = k.kernel.as_ref().map_or(String::new(), |v| format!(", kernel {v}"));
            line(format!("  amdgpu driver {driver}{kernel}"));
            if k.gpus.is_empty() {
                line("  no GPU nodes".into());
            }
            for g in &k.gpus {
                let verdict = match &g.why_not {
                    None => "supported".to_string(),
                    Some(w) => format!("not supported: {w}"),
                };
                let mark = if sel("kfd", g.index) { "  <- selected" } else { "" };
                line(format!("  {}, KFD node {}: {verdict}{mark}", g.summary(), g.node));
            }
        }
        (None, None) => {}
    }
    let have = if l.supported_archs.is_empty() { "none".to_string() } else { l.supported_archs.join(", ") };
    line(if l.hip.built {
        format!("Code objects in this build: {have}")
    } else {
        format!("Code objects: none in this CPU build; a --features gpu build has {have}")
    });
    match &l.selected {
        Some(x) => line(format!("Backend: hip (GPU {}: {} {}; {})", x.index, x.name, x.arch, l.reason)),
        None => line(format!("Backend: cpu ({})", l.reason)),
    }
    s
}

pub fn run(common: &Common, args: &DeviceArgs) -> Result<()> {
    if args.selftest {
        // kernel-tools/src/selftest.rs: the kernel suite and its JSON report.
        return kernel_tools::selftest(common.run.device, args.gpu, args.report.clone());
    }
    let l = probe(args.gpu);
    if args.json {
        // Exit 0 even with a selection error: the caller reads `selection_error`.
        println!("{}", serde_json::to_string_pretty(&l)?);
        return Ok(());
    }
    print!("{}", render(&l));
    if let Some(e) = &l.selection_error {
        bail!("{e}");
    }
    Ok(())
}
