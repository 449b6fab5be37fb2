//! The gfx11 kernels' own tools, kept out of the production crates:
//!
//! - [`selftest`]: `strata device --selftest`, every kernel of the code object against an
//!   independent CPU reference on the chosen device, then timed.
//! - [`bench`]: `strata bench kernels` (instructions, bytes against the ideal, registers,
//!   occupancy) and the random blocks and routings the kernel tests draw.
//! - [`device_profile`]: the software device's counters per part of the forward pass
//!   (`strata bench --device emu`).
//!
//! The entry points exist in every build: without the `gpu` feature they say the build has no
//! kernels, so the commands need no `cfg` of their own.

#[cfg(feature = "gpu")]
pub mod bench;
#[cfg(feature = "gpu")]
pub mod selftest;

use model::error::EngineError;

/// `strata bench kernels`: every kernel's instructions, bytes against the ideal, registers and
/// occupancy, then the software device's own speed.
#[cfg(feature = "gpu")]
pub fn kernel_bench_report(quick: bool) -> Result<String, EngineError> {
    let ops = emulator::bench_lane_ops_per_sec();
    Ok(format!(
        "{}software device speed: {:.0} million lane-operations/s on one core (target >= 50)\n",
        crate::bench::bench_kernels(quick),
        ops / 1e6
    ))
}

#[cfg(not(feature = "gpu"))]
pub fn kernel_bench_report(quick: bool) -> Result<String, EngineError> {
    let _ = quick;
    Err(EngineError::NoGpuSupport { what: "`strata bench kernels` (the gfx11 kernels)".into() })
}

/// `strata device --selftest`: every kernel against its CPU reference on `device` (`selftest`).
#[cfg(feature = "gpu")]
pub fn selftest(
    device: gpu_executor::Device,
    gpu: Option<usize>,
    report: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    crate::selftest::run_cli(device, gpu, report)
}

#[cfg(not(feature = "gpu"))]
pub fn selftest(
    device: gpu_executor::Device,
    gpu: Option<usize>,
    report: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    let _ = (device, gpu, report);
    Err(EngineError::NoGpuSupport { what: "--selftest (it runs the GPU kernels)".into() }.into())
}

/// One part of the forward pass in a device profile (values per token).
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuPart {
    pub part: String,
    /// Kernel launches per token (copies between buffers are not launches).
    pub launches: f64,
    pub instructions: f64,
    pub global_bytes: f64,
    pub ideal_bytes: f64,
}

/// The software device's counters of one pass over `prompt` (per prompt token: windows or
/// prompt chunks, as the engine runs it) and of `steps` decode steps after its first 8 tokens
/// (per decoded token), for `strata bench --device emu`. None: `model` is not on a device.
#[cfg(feature = "gpu")]
pub fn device_profile(
    model: &dyn model::loaded::LoadedModel,
    cfg: &model::loaded::SessionConfig,
    prompt: &[u32],
    steps: usize,
) -> Result<Option<(Vec<GpuPart>, Vec<GpuPart>)>, EngineError> {
    use gpu_executor::model::{GpuSession, Profile};
    use gpu_executor::qwen4exp::GpuQwen4ExpSession;
    use model::{Logits, argmax};
    /// The session's device counters: `Some` starts them, `None` takes them.
    fn profile(s: &mut dyn model::loaded::Session, p: Option<Profile>) -> Option<Profile> {
        if let Some(s) = s.downcast_mut::<GpuSession>() {
            return std::mem::replace(&mut s.profile, p);
        }
        s.downcast_mut::<GpuQwen4ExpSession>().and_then(|s| std::mem::replace(&mut s.profile, p))
    }
    let head = &prompt[..prompt.len().min(8)];
    let mut logits = Vec::new();
    let mut sess = model.new_session(cfg)?;
    if sess.downcast_ref::<GpuSession>().is_none() && sess.downcast_ref::<GpuQwen4ExpSession>().is_none() {
        return Ok(None);
    }
    profile(&mut *sess, Some(Default::default()));
    model.eval(&mut *sess, prompt, Logits::Last, &mut logits)?;
    let Some(pp) = profile(&mut *sess, None) else { return Ok(None) };
    let mut sess = model.new_session(cfg)?;
    model.eval(&mut *sess, head, Logits::Last, &mut logits)?;
    profile(&mut *sess, Some(Default::default()));
    for _ in 0..steps {
        let next = argmax(&logits);
        model.eval(&mut *sess, &[next], Logits::Last, &mut logits)?;
    }
    let tg = profile(&mut *sess, None).unwrap_or_default();
    Ok(Some((parts(&pp), parts(&tg))))
}

#[cfg(not(feature = "gpu"))]
pub fn device_profile(
    model: &dyn model::loaded::LoadedModel,
    cfg: &model::loaded::SessionConfig,
    prompt: &[u32],
    steps: usize,
) -> Result<Option<(Vec<GpuPart>, Vec<GpuPart>)>, EngineError> {
    let _ = (model, cfg, prompt, steps);
    Ok(None)
}

/// Per-token rows of a device profile, then their total.
#[cfg(feature = "gpu")]
fn parts(p: &gpu_executor::model::Profile) -> Vec<GpuPart> {
    let per = |x: u64| x as f64 / p.tokens.max(1) as f64;
    let mut parts: Vec<GpuPart> = p
        .parts
        .iter()
        .map(|(k, v)| GpuPart {
            part: k.to_string(),
            launches: per(v.launches),
            instructions: per(v.instructions),
            global_bytes: per(v.global_bytes),
            ideal_bytes: per(v.ideal_bytes),
        })
        .collect();
    let total = |f: fn(&GpuPart) -> f64, parts: &[GpuPart]| parts.iter().map(f).sum::<f64>();
    parts.push(GpuPart {
        part: "total".into(),
        launches: total(|p| p.launches, &parts),
        instructions: total(|p| p.instructions, &parts),
        global_bytes: total(|p| p.global_bytes, &parts),
        ideal_bytes: total(|p| p.ideal_bytes, &parts),
    });
    parts
}
