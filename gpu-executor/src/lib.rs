//! The GPU executor: the host side of the gfx11 kernels. Always built: the GPU settings and
//! the device enum ([`options`], part of the engine configuration) and the KFD topology reader
//! ([`kfd`], `strata device` without ROCm), and placement ([`place`]). With the feature
//! `gpu`: the shared decoder ([`model`], [`exec`], [`moe`]) and qwen4exp ([`qwen4exp`]) on
//! the device, the expert cache, and below them the embedded code objects, the kernel ABI and
//! registry (the `gpu-abi` crate the kernels compile too, so names, argument layouts and
//! launch properties exist once) and the one launch layer over the device boundary. The
//! kernels' selftest and benchmark are the `kernel-tools` crate's.
//!
//! - [`code_objects`]: `code_object_for("gfx1100")` → the embedded ELF.
//! - [`abi`] (`gpu_abi`): kernel symbols, `#[repr(C)]` argument structs, LDS layouts,
//!   workgroup size.
//! - [`registry`] (`gpu_abi::registry`): every kernel with its argument struct, block, LDS,
//!   scratch and archs.
//! - [`device`]: the `GpuApi` boundary (HIP and the software RDNA3 device).
//! - [`ops`]: [`GpuOps`], every kernel's launcher (shape checks, argument packing, grid math);
//!   [`ops_host`] adds host-slice wrappers with the software device's launch counters.
//! - [`resident`]: what a model on the device holds besides its own weights (ops, stream,
//!   allocations, the expert cache and its companions), fit, fill, save and free once.
//! - [`experts`]: expert tiering: the VRAM expert cache, the per-layer handoff to the CPU pool
//!   inside graphs, adaptive swaps on a side stream, misses read from RAM over PCIe, the ring
//!   prompt misses stream through.
//! - [`calibrate`]: hipBLASLt calibration tables (`strata calibrate`) and their use.
//! - [`test_device`]: the `test_device!` macro (one test body, one test per device).

pub mod kfd;
pub mod options;
pub mod place;

pub use options::{Device, GpuOptions};
pub use place::{Placed, Placement, place};

#[cfg(feature = "gpu")]
pub use gpu_abi as abi;
#[cfg(feature = "gpu")]
pub use gpu_abi::registry;
#[cfg(feature = "gpu")]
pub mod calibrate;
#[cfg(feature = "gpu")]
pub mod code_objects;
#[cfg(feature = "gpu")]
pub mod device;
#[cfg(feature = "gpu")]
pub mod exec;
#[cfg(feature = "gpu")]
pub mod experts;
#[cfg(feature = "gpu")]
mod linear;
#[cfg(feature = "gpu")]
pub mod loaded;
#[cfg(feature = "gpu")]
pub mod model;
#[cfg(feature = "gpu")]
pub mod moe;
#[cfg(feature = "gpu")]
pub mod ops;
#[cfg(feature = "gpu")]
pub mod ops_host;
#[cfg(feature = "gpu")]
pub mod qwen4exp;
#[cfg(feature = "gpu")]
pub mod resident;
#[cfg(feature = "gpu")]
pub mod test_device;
#[cfg(feature = "gpu")]
pub mod upload;

#[cfg(feature = "gpu")]
pub use abi::WType;
#[cfg(feature = "gpu")]
pub use code_objects::code_object_for;
#[cfg(feature = "gpu")]
pub use ops::{AttnMode, GluAct, GpuOps, KvFormat, RowType};
