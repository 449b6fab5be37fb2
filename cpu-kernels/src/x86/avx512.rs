//! AVX-512 path: the same kernels as `avx2` with `vpdpbusd` (VNNI) doing u8×i8→i32 in one
//! instruction and mask registers for bit expansion; vectors stay 256 bits wide (Zen 4 splits
//! 512-bit ops in two, so the win is the instruction count, not the width). IQ3_XXS has its
//! own 512-bit kernel in `iq3_512` (chosen by the dispatcher when VBMI/BITALG are present).
#![allow(unsafe_op_in_unsafe_fn)]

use crate::acts::Acts;
use crate::tensor::{QTensor, RowsFn};
use core::arch::x86_64::*;
use quant::GgmlType;

common_helpers!("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni");

/// acc + Σ₄ u·s per i32 lane.
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn dp(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, u, s)
}

/// acc + scale · Σ u·s, with the scale vector from [`scale_vec`] (i32 lanes here).
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn dps(acc: __m256i, u: __m256i, s: __m256i, sc: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_mullo_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s), sc))
}

/// Scale for bytes 0..16 (`lo`, i32 lanes 0..4) and 16..32 (`hi`) of a [`dps`] operand.
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn scale_vec(lo: i32, hi: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi32(hi), _mm_set1_epi32(lo))
}

/// Byte i = 0xFF if bit i of m is set (one `vpmovm2b`).
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn bits(m: u32) -> __m256i {
    _mm256_movm_epi8(m)
}

fam_q8!("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni");
fam_k!("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni");
fam_f!("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni");
fam_lowbit!("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni");

pub(crate) fn kernel(ty: GgmlType) -> Option<RowsFn> {
    kernel_table!(ty)
}
