//! A software RDNA3 (gfx11, wave32) device that executes AMDGPU code objects.
//!
//! The device stands in for the HIP runtime at its lowest boundary: [`Device::load_module`]
//! takes the very ELF code object a GPU would get, [`Device::malloc`]/`memcpy_*` manage device
//! memory and [`Device::launch`] runs a kernel grid. Instructions are decoded once per module
//! ([`decode`]) into a compact program indexed by PC and executed 32 lanes at a time
//! ([`exec`]). Every memory access is bounds-checked. See docs/emulator.md.
// Lane loops index several per-lane arrays by the lane number, and lane-mask tests are written
// `mask >> lane & 1` throughout: both read better than the iterator/parenthesised forms.
#![allow(clippy::needless_range_loop, clippy::precedence, clippy::precedence_bits)]

#[cfg(test)]
mod coverage;
#[allow(dead_code)]
mod decode;
mod device;
mod disasm;
mod error;
#[allow(dead_code)]
mod exec;
#[allow(dead_code)]
mod float;
#[allow(dead_code)]
mod loader;
mod memory;
mod optable;

pub use device::{Device, DevicePtr, Function, KernArg, KernelInfo, LaunchOptions, LaunchStats, Module, RACE_SEED_ENV};
pub use disasm::disassemble;
pub use error::{DataRace, EmuError, RaceAccess};
pub use exec::bench_lane_ops_per_sec;
