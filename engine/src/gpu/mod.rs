//! Host side of the gfx11 kernels (feature `gpu`): the embedded code objects, the kernel ABI
//! (the very `abi.rs` the kernels compile, included by path so names and argument layouts exist
//! once), launch wrappers over the software RDNA3 device, and the kernel benchmark.
//!
//! - [`code_objects`]: `code_object_for("gfx1100")` → the embedded ELF.
//! - [`abi`]: kernel symbols, `#[repr(C)]` argument structs, LDS layouts, workgroup size.
//! - [`emu_kernels`]: [`emu_kernels::EmuKernels`] loads the gfx1100 object into an
//!   `emulator::Device`, packs kernargs (checked against the code object's metadata), launches
//!   with the grid math of each kernel, and returns results with `LaunchStats`.
//! - [`calibrate`]: hipBLASLt calibration tables (`strata calibrate`) and their use.
//! - [`bench`]: `bench_kernels` (instructions, bytes vs ideal, registers, occupancy).
//! - [`selftest`]: `strata device --selftest`, every kernel against a CPU reference, timed.

#[macro_use]
#[path = "../../../gpu-kernels/src/abi.rs"]
pub mod abi;
pub mod bench;
pub mod calibrate;
pub mod code_objects;
pub mod device;
pub mod emu_kernels;
pub mod model;
pub mod ops;
pub mod selftest;

pub use abi::WType;
pub use bench::bench_kernels;
pub use code_objects::code_object_for;
pub use emu_kernels::{EmuKernels, GpuKernelError};
pub use ops::{AttnMode, GluAct, GpuOps, KvFormat, RowType};
