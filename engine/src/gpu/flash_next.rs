//! Flash-Next (qwen4exp) on a gfx11 device: the program of `model::qwen4exp::program` over
//! this device's operations. The kernels between the projections exist (`GpuOps::gdn_mix`,
//! `gdn_prefill`, `qsa_mix`, `ple_block`, `gr_*`, the router and shared-expert kernels), but
//! the executor that uploads the weights and runs the program over them does not yet (issue
//! 15), so each operation reports [`EngineError::NotOnBackend`] instead of falling back to the
//! CPU silently. [`check`] walks the program at load, so `--device emu|hip` fails before anything
//! is uploaded and names the first operation that is missing; as kernels land, their
//! operations move from here into a real executor (as `gpu::exec` is for the shared decoder).

use crate::model::qwen4exp::program::{self, FlashNextOps, Site};
use crate::model::qwen4exp::{Qwen4Exp};
use crate::error::EngineError;

/// The device's Flash-Next operations as they stand: every one missing.
struct DeviceOps {
    backend: &'static str,
}

impl DeviceOps {
    fn missing(&self, op: &'static str, layer: usize) -> Result<(), EngineError> {
        Err(EngineError::NotOnBackend { backend: self.backend, op, layer })
    }
}

impl FlashNextOps for DeviceOps {
    fn embed(&mut self) -> Result<(), EngineError> {
        // `get_rows` exists, but R's hc streams live on the device only once GR does.
        self.missing("embed (hyper-connection streams)", 0)
    }
    fn ple(&mut self, layer: usize) -> Result<(), EngineError> {
        self.missing("ple", layer)
    }
    fn hc_mix(&mut self, layer: usize, site: Site) -> Result<(), EngineError> {
        self.missing(if site == Site::Mixer { "hc_mix (GR read, mixer)" } else { "hc_mix (GR read, ffn)" }, layer)
    }
    fn gdn(&mut self, layer: usize) -> Result<(), EngineError> {
        self.missing("gdn", layer)
    }
    fn attention(&mut self, layer: usize) -> Result<(), EngineError> {
        self.missing("attention (QSA)", layer)
    }
    fn hc_combine(&mut self, layer: usize, _site: Site) -> Result<(), EngineError> {
        self.missing("hc_combine (GR write)", layer)
    }
    fn moe(&mut self, layer: usize) -> Result<(), EngineError> {
        self.missing("moe (routed + shared expert)", layer)
    }
    fn head(&mut self) -> Result<(), EngineError> {
        self.missing("head (hc mixer + output)", 0)
    }
}

/// Whether `m` runs on the device `backend` (`emu` or `hip`): the first operation of its
/// program that has no kernel, as an error.
pub fn check(m: &Qwen4Exp, backend: &'static str) -> Result<(), EngineError> {
    program::forward(&mut DeviceOps { backend }, m)
}
