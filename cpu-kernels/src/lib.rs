//! CPU compute for Strata.
//!
//! * Quantized matrix-vector ([`matvec`]) and matrix-matrix ([`matmul`]) products of GGUF weight
//!   matrices with f32 activations. Activations are first quantized to the weight type's
//!   `vec_dot_type` with `quant`'s reference quantizer (so results match `quant::vec_dot`
//!   through the same integer math), then a kernel picked at run time computes the dots:
//!   [`Path::Avx512`] (AVX-512 VL/BW + VNNI `vpdpbusd`, and VBMI/BITALG for IQ3_XXS),
//!   [`Path::Avx2`] (AVX2 + FMA + F16C, `vpmaddubsw`), or [`Path::Portable`] (the `quant` scalar
//!   reference, row by row). Rows are split into chunks over rayon; `matmul` tiles
//!   rows × 4 activation columns so each decoded weight block serves four columns.
//! * [`get_row`], [`rms_norm`], [`rope_neox`], [`rope_norm`], [`softmax`], [`silu`],
//!   [`gelu_tanh`], [`swiglu`], [`geglu`] (ggml semantics).
//!
//! Attention is not here: the engine's one implementation (ggml order, exact batch tiles and the
//! ordered mode) lives with the KV cache it reads, in `cpu-executor/src/attention.rs`.
//!
//! `matvec`/`matmul`/`get_row` have `try_*` variants returning [`KernelError`] on bad shapes;
//! the short names panic with that error's message (shapes are engine invariants).
//! `*_with(Path, ..)` variants force one implementation (tests and benchmarks).

// SIMD kernels index fixed-size register arrays by column/lane on purpose, and the kernel
// entry points take their shapes as plain arguments.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

// Module layers (each imports only from the layers above it; `scripts/module-cycles.py
// cpu-kernels` checks there is no cycle):
// * plain types: `tensor` (QTensor, KernelError, Path, best_path, RowsFn), `acts` (the Acts
//   struct), `team` (the spinning thread team of an evaluation), and CPU feature detection `x86::cpu`, `float`;
// * kernels: `portable`, `ops`, the x86 kernel files (`x86::*`, over the shared helpers
//   `x86::common` / `x86::tables` / the `fam_*` macro templates), the SIMD activation
//   quantizers `x86::quantize`;
// * dispatchers: `x86` (mod.rs: kernel per type and ISA), `prepare` (activation quantization
//   and layout for a path), `matmul` (entry points);
// * this file: the public API, re-exported.
mod acts;
pub(crate) mod float;
mod matmul;
mod ops;
mod portable;
mod prepare;
pub mod team;
mod tensor;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use matmul::{
    ActsFor, PreparedActs, get_row, matmul, matmul_ggml, matvec, prepare_acts, prepare_acts_as, prepare_acts_with,
    try_get_row, try_matmul, try_matmul_gemm, try_matmul_ggml, try_matmul_ggml_multi, try_matmul_ggml_with,
    try_matmul_multi, try_matmul_multi_gemm, try_matmul_prepared, try_matmul_with, try_matvec, try_matvec_with,
};
pub use ops::{
    geglu, geglu_ggml, gelu_f16_table, gelu_tanh, rms_norm, rms_norm_ggml, rms_norm_inplace, rope_cs_ggml, rope_neox,
    rope_neox_ggml, rope_neox_ggml_cs, rope_norm, silu, softcap, softmax, swiglu,
};
pub use prepare::quantize_q8_0_x86;
pub use quant::GgmlType;
pub use tensor::{Gemm, KernelError, Path, QTensor, SUPPORTED_TYPES, best_path, cpu_features};
