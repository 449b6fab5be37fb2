//! x86-64 SIMD kernels.
//!
//! Two paths are generated from the same per-type kernel bodies (macros in `fam_*.rs`), each
//! compiled with its own `#[target_feature]` set and its own small primitive layer:
//! * `avx2`:   `dp` = `vpmaddubsw` + `vpmaddwd` (u8×i8 → i32 in three instructions).
//! * `avx512`: `dp` = `vpdpbusd` (AVX-512 VNNI on 256-bit vectors via AVX-512 VL), mask
//!   registers for bit expansion; IQ3_XXS gets a dedicated 512-bit kernel (`iq3_512`).
//!
//! Every kernel computes one weight row against NC (1..4) activation columns so a decoded
//! weight block is reused across columns; `rows_driver!` walks row ranges × column blocks.
//! Kernel functions are `unsafe fn` with raw pointers into validated buffers: their safety
//! contract is the one of [`crate::tensor::RowsFn`] plus "the target features are present",
//! which the dispatch below checks with `is_x86_feature_detected!` (`cpu`).
//!
//! This file is the dispatcher: it picks a kernel per weight type and path and is the only x86
//! module that names kernel files. The kernel files import only the shared helpers (`cpu`,
//! `common`, `tables`, the `fam_*` macro templates) and the crate's plain types, never each
//! other or this file.

use crate::tensor::RowsFn;
use cpu::{has_avx512, has_avx512_zmm};
use quant::GgmlType;
use std::sync::OnceLock;

/// VBMI (vpermi2b, vpmultishiftqb) + BITALG (vpopcntb, vpshufbitqmb) for the IQ3_XXS kernel.
pub(crate) fn has_avx512_iq3() -> bool {
    static F: OnceLock<bool> = OnceLock::new();
    *F.get_or_init(|| {
        has_avx512()
            && is_x86_feature_detected!("avx512vbmi")
            && is_x86_feature_detected!("avx512bitalg")
            && tables::iq3xxs_codes().is_some()
    })
}

// Shared helpers (no kernels).
pub(crate) mod common;
pub(crate) mod cpu;
pub(crate) mod tables;
// Macro templates of the kernel families, instantiated per path by `avx2` / `avx512`.
#[macro_use]
mod fam_common;
#[macro_use]
mod fam_q8;
#[macro_use]
mod fam_k;
#[macro_use]
mod fam_f;
#[macro_use]
mod fam_lowbit;
mod avx2;
mod avx512;
pub(crate) mod gemm_q0;
mod iq3_512;
mod q0_decode;
mod zmm;
// The row tiles for decode-sized products (Q4_1), built in registers.
mod gemm_k;
pub(crate) mod gemv_tiles;
mod ggml_k_simd;
mod ggml_q4k;
mod ggml_q6k;
mod ggml_q8;
pub(crate) mod ggml_q8_512;
// SIMD activation quantizers (called by `crate::prepare`).
pub(crate) mod quantize;

pub(crate) fn avx2_kernel(ty: GgmlType) -> Option<RowsFn> {
    avx2::kernel(ty)
}

pub(crate) fn avx512_kernel(ty: GgmlType) -> Option<RowsFn> {
    if ty == GgmlType::IQ3XXS && has_avx512_iq3() && iq3_512::READY {
        return Some(iq3_512::rows_iq3_xxs);
    }
    let z: Option<RowsFn> = match ty {
        GgmlType::Q4K => Some(zmm_rows_q4_k),
        GgmlType::Q6K => Some(zmm_rows_q6_k),
        GgmlType::Q8_0 => Some(zmm_rows_q8_0),
        GgmlType::Q4_0 => Some(zmm_rows_q4_0),
        GgmlType::Q5_0 => Some(zmm_rows_q5_0),
        GgmlType::IQ4NL => Some(zmm_rows_iq4_nl),
        GgmlType::Q4_1 => Some(zmm_rows_q4_1),
        _ => None,
    };
    if z.is_some() && has_avx512_zmm() {
        return z;
    }
    avx512::kernel(ty)
}

/// The zmm pair kernels need an even number of 32-element blocks per row; odd rows (K = 32·odd)
/// go to the 256-bit kernel of the same path. Prompt-sized products (activations prepared with
/// `Acts::tiles`, n ≥ `gemm_q0::MIN_COLS`) run the 16-row GEMM tiles.
macro_rules! pair_rows {
    ($name:ident, $pair:path, $fallback:path, $tiles:path) => {
        /// # Safety
        /// The [`RowsFn`] contract, AVX-512 with DQ present (`has_avx512_zmm`).
        unsafe fn $name(
            w: &crate::tensor::QTensor,
            rb: usize,
            a: &crate::acts::Acts,
            r0: usize,
            r1: usize,
            y: *mut f32,
        ) {
            // SAFETY: all three kernels have this function's contract (prepare fills what the
            // tiles read when it sets `a.tiles`).
            unsafe {
                if (w.cols / 32) % 2 != 0 {
                    $fallback(w, rb, a, r0, r1, y)
                } else if a.tiles {
                    $tiles(w, rb, a, r0, r1, y)
                } else {
                    $pair(w, rb, a, r0, r1, y)
                }
            }
        }
    };
}
pair_rows!(zmm_rows_q8_0, zmm::pair_rows_q8_0, avx512::rows_q8_0, gemm_q0::rows_q8_0);
pair_rows!(zmm_rows_q4_0, zmm::pair_rows_q4_0, avx512::rows_q4_0, gemm_q0::rows_q4_0);
pair_rows!(zmm_rows_q5_0, zmm::pair_rows_q5_0, avx512::rows_q5_0, gemm_q0::rows_q5_0);
pair_rows!(zmm_rows_iq4_nl, zmm::pair_rows_iq4_nl, avx512::rows_iq4_nl, gemm_q0::rows_iq4_nl);
pair_rows!(zmm_rows_q4_1, zmm::pair_rows_q4_1, avx512::rows_q4_1, q4_1_tiles);

/// Q4_1's row tiles for any column count: `gemm_q0`'s scratch tiles for prompts, the same tiles
/// built in registers (`gemv_tiles`) for fewer columns.
///
/// # Safety
/// The [`RowsFn`] contract, AVX-512 with DQ present, `a` prepared with `Acts::tiles`.
unsafe fn q4_1_tiles(w: &crate::tensor::QTensor, rb: usize, a: &crate::acts::Acts, r0: usize, r1: usize, y: *mut f32) {
    // SAFETY: both kernels have this function's contract.
    unsafe {
        if a.n < gemm_q0::MIN_COLS {
            gemv_tiles::rows_q4_1(w, rb, a, r0, r1, y)
        } else {
            gemm_q0::rows_q4_1(w, rb, a, r0, r1, y)
        }
    }
}

/// The zmm K-quant kernels, or their prompt tiles for activations prepared with `Acts::tiles`.
macro_rules! tiles_or {
    ($name:ident, $zmm:path, $tiles:path) => {
        /// # Safety
        /// The [`RowsFn`] contract, AVX-512 with DQ present (`has_avx512_zmm`).
        unsafe fn $name(
            w: &crate::tensor::QTensor,
            rb: usize,
            a: &crate::acts::Acts,
            r0: usize,
            r1: usize,
            y: *mut f32,
        ) {
            // SAFETY: both kernels have this function's contract (prepare fills what they read).
            unsafe { if a.tiles { $tiles(w, rb, a, r0, r1, y) } else { $zmm(w, rb, a, r0, r1, y) } }
        }
    };
}
tiles_or!(zmm_rows_q4_k, zmm::rows_q4_k, gemm_k::rows_q4_k);
tiles_or!(zmm_rows_q6_k, zmm::rows_q6_k, gemm_k::rows_q6_k);

/// Kernels that reproduce the float summation order of llama.cpp's x86 kernels bit for bit
/// (see `ggml_q8`, `ggml_q4k`, `ggml_q6k`); None for types without one. Every path computes
/// identical results: `Portable` runs the scalar kernels that define the order, `Avx2` the
/// 256-bit ones (Q8_0/Q5_0 `ggml_q8`, Q4_K/Q6_K `ggml_k_simd`), `Avx512` the tiled 512-bit
/// Q8_0/Q5_0 kernel (`ggml_q8_512`, needs `Acts::perm`/`d`, see `ggml_q8_512::prepare`).
pub(crate) fn ggml_kernel(path: crate::tensor::Path, ty: GgmlType) -> Option<RowsFn> {
    use crate::tensor::Path;
    if !path.available() {
        return None;
    }
    let q8 = matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0);
    match path {
        Path::Portable if q8 => Some(ggml_q8::rows_scalar),
        Path::Avx2 if q8 => Some(ggml_q8::rows),
        Path::Avx512 if q8 => Some(ggml_q8_512::rows),
        Path::Portable => match ty {
            GgmlType::Q4K => Some(ggml_q4k::rows),
            GgmlType::Q6K => Some(ggml_q6k::rows),
            _ => None,
        },
        Path::Avx2 | Path::Avx512 => match ty {
            GgmlType::Q4K => Some(ggml_k_simd::rows_q4k),
            GgmlType::Q6K => Some(ggml_k_simd::rows_q6k),
            _ => None,
        },
    }
}
