//! Strata's gfx11 (RDNA3) kernels: `no_std` Rust compiled for `amdgcn-amd-amdhsa`, one code
//! object per arch (gfx1100, gfx1101, gfx1102), built and embedded by `gpu-executor/build.rs`.
//!
//! - [`abi`]: kernel names, argument layouts, LDS layouts: the `gpu-abi` crate, shared with
//!   the host.
//! - [`arch`]: every raw intrinsic (dot4, DPP, permlanex16, barrier, LDS) with safe wrappers.
//! - [`mem`]: unaligned global-memory loads/stores (ggml blocks are 2-byte aligned).
//! - [`ops`]: one file per op family: activation quantization, MMVQ, dequantization.
#![no_std]
#![feature(
    abi_gpu_kernel,
    stdarch_amdgpu,
    link_llvm_intrinsics,
    abi_unadjusted,
    core_intrinsics,
    f16,
    repr_simd,
    simd_ffi
)]
#![allow(internal_features)]
// Kernel entry points take raw device pointers by design (see the gpu-abi crate).
#![allow(clippy::missing_safety_doc)]

// The ABI crate, also for its kernel-list macros (`abi::mmvq_kernels!`, ...) the ops
// instantiate their kernels from.
pub use gpu_abi as abi;
pub mod arch;
pub mod mem;
pub mod ops;
