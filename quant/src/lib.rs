//! Block quantization formats of ggml/GGUF and their scalar reference code.
//!
//! This crate is the single definition of every block format used by Strata. It is `no_std`
//! with no dependencies so that the CPU backend, the GPU kernels (built for
//! `amdgcn-amd-amdhsa`) and the tests all compile the very same structs and reference
//! functions. Every faster implementation (SIMD, GPU) is checked against the `*_ref` code here,
//! and the code here is checked byte-for-byte against llama.cpp's own outputs
//! (`testdata/reference/quant-vectors`).
//!
//! Layout: one module per format (`q4_0`, `q4_k`, `iq3_xxs`, ...), each with a `#[repr(C)]`
//! block struct (size asserted at compile time) and three functions on single blocks:
//! `dequantize_ref`, `quantize_ref` and `vec_dot_ref` (weights block × activation block in
//! [`GgmlType::vec_dot_type`]); the formats added for reading files only (Q2_K, Q3_K, IQ4_XS
//! and the IQ1/IQ2/IQ3_S family) have no quantizer yet ([`GgmlType::has_quantizer`]). The row-level façade ([`dequantize_row`], [`quantize_row`],
//! [`vec_dot`]) works on raw bytes as they appear in a GGUF file and never panics on bad
//! lengths: it returns [`QuantError::BadLength`]. [`check_blocks`] checks that every block's
//! float scales are finite (what a loader runs over every weight).
#![no_std]
#![cfg_attr(target_arch = "amdgpu", feature(f16))]
// The reference code mirrors ggml's C loops index for index on purpose (easier to audit
// against the C source and to port to GPU kernels).
#![allow(clippy::needless_range_loop)]

pub mod block;
pub mod float;
pub mod fmath;
pub mod grids;
pub mod half;
pub mod iq1_m;
pub mod iq1_s;
pub mod iq2_octets;
pub mod iq2_s;
pub mod iq2_xs;
pub mod iq2_xxs;
pub mod iq3_s;
pub mod iq3_xxs;
pub mod iq4_nl;
pub mod iq4_xs;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_1;
pub mod q8_k;
pub mod util;

mod facade;
mod types;
mod validate;

pub use block::Block;
pub use facade::{dequantize_row, quantize_row, vec_dot};
pub use half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
pub use types::{ALL_TYPES, GgmlType, QuantError};
pub use validate::{BadBlock, BadScale, check_blocks};

/// Elements per super-block of the K-quants and IQ formats (ggml's `QK_K`).
pub const QK_K: usize = 256;
