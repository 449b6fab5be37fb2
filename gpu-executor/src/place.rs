//! Device placement, in one function: [`place`] puts a model description on the device the
//! configuration asks for, or on the CPU. It opens the device, falls back to the CPU under
//! `auto` (saying why, unless there is no ROCm at all: the normal CPU-only machine), sizes the
//! expert cache, attaches the hipBLASLt calibration table and fills the cache from a profile.
//! A build without the `gpu` feature has the same function: it places on the CPU and refuses
//! `--device hip|emu` with a typed error.

use std::path::Path;

use model::KvType;
use model::error::Result;
use model::loaded::{HostModel, LoadedModel};

use crate::options::{Device, GpuOptions};

/// What placement needs from the configuration.
#[derive(Clone, Copy, Debug)]
pub struct Placement<'a> {
    /// The model file, for messages.
    pub path: &'a Path,
    pub device: Device,
    /// The `--gpu-*` settings; `ordered` is or-ed with [`Placement::ordered`].
    pub gpu: GpuOptions,
    /// `--ordered`: the device computes in the CPU's reference order.
    pub ordered: bool,
    /// Session sizes the expert cache's `auto` fit leaves room for.
    pub kv: KvType,
    pub positions: usize,
    pub prefill: usize,
    /// `--calibration` (None: the device's default table when there is one).
    pub calibration: Option<&'a Path>,
    /// `--expert-profile`: fills the expert cache at start.
    pub expert_profile: Option<&'a Path>,
}

/// A placed model and, on a device, the GPU settings it runs with (what placement made of the
/// configured ones: Flash-Next's expert cache defaults to `auto`, `--ordered` fixes the mode).
pub struct Placed {
    pub model: Box<dyn LoadedModel>,
    pub gpu: Option<GpuOptions>,
}

impl Placed {
    fn cpu(m: HostModel) -> Placed {
        Placed { model: cpu_executor::on_cpu(m), gpu: None }
    }
}

/// Puts `m` where `p` says. `reload` reads the description again for the `auto` fallback
/// when the device took it and then could not run it (a dimension, its memory).
#[cfg(feature = "gpu")]
pub fn place(m: HostModel, p: &Placement, reload: &dyn Fn() -> Result<HostModel>) -> Result<Placed> {
    use crate::device::{GpuError, open_device_with};
    use model::error::EngineError;
    if p.device == Device::Cpu {
        return Ok(Placed::cpu(m));
    }
    let mut opts = p.gpu;
    opts.ordered |= p.ordered;
    if matches!(m, HostModel::Qwen4Exp(_)) {
        // Flash-Next's experts rarely all fit a card: size the cache from the free VRAM unless
        // told otherwise (every expert resident when they do fit).
        opts.expert_cache = opts.expert_cache.or(Some(crate::options::ExpertCacheSize::Auto));
    }
    let api: std::sync::Arc<dyn crate::device::GpuApi> = match open_device_with(p.device, &opts) {
        Ok(api) => api.into(),
        Err(GpuError::NoUsableGpu(why)) => {
            // No ROCm at all is the normal CPU-only machine: stay quiet then.
            if !matches!(*why, GpuError::LibraryNotFound { .. }) {
                eprintln!("strata: no usable GPU ({why}); running on the CPU");
            }
            return Ok(Placed::cpu(m));
        }
        Err(e) => return Err(EngineError::Gpu(format!("--device {}: {e}", p.device.name()))),
    };
    // A usable card when there is one; a model the card cannot take (a dimension, its memory)
    // runs on the CPU under `auto`, with the reason.
    let fallback = |why: EngineError| -> Result<Placed> {
        if p.device != Device::Auto {
            return Err(why);
        }
        eprintln!("strata: {} does not run on the GPU ({why}); running on the CPU", p.path.display());
        Ok(Placed::cpu(reload()?))
    };
    match m {
        HostModel::Decoder(m) => match crate::model::GpuModel::new(*m, api, opts) {
            Ok(mut g) => {
                prepare_decoder(&mut g, p)?;
                Ok(Placed { gpu: Some(*g.opts()), model: Box::new(g) })
            }
            Err(why) => fallback(why),
        },
        HostModel::Qwen4Exp(m) => match crate::qwen4exp::GpuQwen4Exp::new(*m, api, opts) {
            Ok(mut g) => {
                prepare_qwen4exp(&mut g, p)?;
                Ok(Placed { gpu: Some(*g.opts()), model: Box::new(g) })
            }
            Err(why) => fallback(why),
        },
    }
}

/// [`place`] in a build without the GPU backends: the CPU, or a typed refusal.
#[cfg(not(feature = "gpu"))]
pub fn place(m: HostModel, p: &Placement, reload: &dyn Fn() -> Result<HostModel>) -> Result<Placed> {
    let _ = reload;
    match p.device {
        Device::Cpu | Device::Auto => Ok(Placed::cpu(m)),
        Device::Hip | Device::Emu => {
            Err(model::error::EngineError::NoGpuSupport { what: format!("--device {}", p.device.name()) })
        }
    }
}

/// The shared decoder's expert cache sized (`--expert-cache auto`), its calibration table
/// attached and its cache filled from a profile.
#[cfg(feature = "gpu")]
fn prepare_decoder(g: &mut crate::model::GpuModel, p: &Placement) -> Result<()> {
    if g.opts().expert_cache == Some(crate::options::ExpertCacheSize::Auto)
        && let Some(fit) = g.fit_expert_cache(p.kv, p.positions, p.prefill)?
    {
        eprintln!("strata: {fit}");
    }
    attach_calibration(g, p.calibration)?;
    fill_from_profile(p, |path| g.fill_expert_cache(path))
}

/// Flash-Next's expert cache sized (`auto`, the default for this architecture; said only when
/// not every expert fits or `auto` was asked for) and filled from a profile.
#[cfg(feature = "gpu")]
fn prepare_qwen4exp(g: &mut crate::qwen4exp::GpuQwen4Exp, p: &Placement) -> Result<()> {
    if g.opts().expert_cache == Some(crate::options::ExpertCacheSize::Auto) {
        let fit = g.fit_expert_cache_chunked(p.kv, p.positions, p.prefill)?;
        if !fit.all_resident() || p.gpu.expert_cache.is_some() {
            let chunk = g.prompt_chunk(p.positions, p.prefill);
            eprintln!("strata: {fit}; sessions of {} positions, prompts in chunks of {chunk} tokens", p.positions);
        }
    }
    fill_from_profile(p, |path| g.fill_expert_cache(path))
}

#[cfg(feature = "gpu")]
fn fill_from_profile(p: &Placement, fill: impl FnOnce(&Path) -> Result<usize>) -> Result<()> {
    if let Some(path) = p.expert_profile {
        let n = fill(path)?;
        eprintln!("strata: expert cache: {n} experts copied from {}", path.display());
    }
    Ok(())
}

/// Loads the hipBLASLt calibration table (`calibrate`): the one given (`--calibration`, an
/// error when it cannot be used), else the device's default file when present (a warning when
/// it cannot be used). Without hipBLASLt on the device, a given table is an error.
#[cfg(feature = "gpu")]
fn attach_calibration(m: &mut crate::model::GpuModel, given: Option<&Path>) -> Result<()> {
    use crate::calibrate::{CalibrationTable, default_path};
    use model::error::EngineError;
    let info = m.api().info().clone();
    let Some(ver) = info.blas_lt_version.as_deref() else {
        if let Some(p) = given {
            return Err(EngineError::Gpu(format!(
                "--calibration {}: this device has no usable hipBLASLt ({})",
                p.display(),
                info.blas_lt.as_deref().unwrap_or("not found")
            )));
        }
        return Ok(());
    };
    let (path, explicit) = match given {
        Some(p) => (p.to_path_buf(), true),
        None => match default_path(&info.arch, ver) {
            Some(p) if p.is_file() => (p, false),
            _ => return Ok(()),
        },
    };
    match CalibrationTable::load(&path, &info.arch, ver) {
        Ok(t) => m.set_calibration(t, path),
        Err(e) if explicit => Err(EngineError::Gpu(e.to_string())),
        Err(e) => {
            eprintln!("strata: ignoring the default calibration table: {e}");
            Ok(())
        }
    }
}
