//! Host side of the gfx11 kernels (feature `gpu`): the embedded code objects, the kernel ABI
//! and registry (the very `abi.rs` and `registry.rs` the kernel build reads, included by path
//! so names, argument layouts and launch properties exist once), the one launch layer over the
//! device boundary, and the kernel benchmark.
//!
//! - [`code_objects`]: `code_object_for("gfx1100")` → the embedded ELF.
//! - [`abi`]: kernel symbols, `#[repr(C)]` argument structs, LDS layouts, workgroup size.
//! - [`registry`]: every kernel with its argument struct, block, LDS, scratch and archs.
//! - [`device`]: the `GpuApi` boundary (HIP and the software RDNA3 device).
//! - [`ops`]: [`GpuOps`], every kernel's launcher (shape checks, argument packing, grid math);
//!   [`ops_host`] adds host-slice wrappers with the software device's launch counters.
//! - [`calibrate`]: hipBLASLt calibration tables (`strata calibrate`) and their use.
//! - [`bench`]: `bench_kernels` (instructions, bytes vs ideal, registers, occupancy).
//! - [`selftest`]: `strata device --selftest`, every kernel against a CPU reference, timed.
//! - [`test_device`]: the `test_device!` macro (one test body, one test per device).

#[macro_use]
#[path = "../../../gpu-kernels/src/abi.rs"]
pub mod abi;
#[path = "../../../gpu-kernels/src/registry.rs"]
pub mod registry;
pub mod bench;
pub mod calibrate;
pub mod code_objects;
pub mod device;
pub mod exec;
pub mod expert_cache;
pub mod expert_handoff;
pub mod flash_next;
mod linear;
pub mod model;
pub mod moe;
pub mod ops;
pub mod ops_host;
pub mod selftest;
pub mod test_device;
pub mod upload;

pub use abi::WType;
pub use bench::bench_kernels;
pub use code_objects::code_object_for;
pub use ops::{AttnMode, GluAct, GpuOps, KvFormat, RowType};
