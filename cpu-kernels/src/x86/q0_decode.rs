//! Two consecutive 32-element blocks of the signed formats (Q8_0, Q4_0, Q5_0, IQ4_NL) decoded
//! to 64 i8 weights in one zmm (block 0 in bytes 0..32, block 1 in 32..64): shared by the pair
//! kernels (`zmm`) and the prompt GEMM tiles (`gemm_q0`). Helpers only, no kernels.
#![allow(unsafe_op_in_unsafe_fn)]

use core::arch::x86_64::*;

/// 32 bytes from `lo` and 32 from `hi` as one zmm.
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn join(lo: *const u8, hi: *const u8) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(lo.cast())), _mm256_loadu_si256(hi.cast()), 1)
}

/// The 16 nibble bytes of two blocks → 64 values (block0 low, block0 high, block1 low, high);
/// also Q4_1's unsigned quants.
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
pub(crate) unsafe fn nib_pair(q0: *const u8, q1: *const u8) -> __m512i {
    let a = _mm_loadu_si128(q0.cast());
    let b = _mm_loadu_si128(q1.cast());
    let v = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set_m128i(_mm_srli_epi16(a, 4), a)),
        _mm256_set_m128i(_mm_srli_epi16(b, 4), b),
        1,
    );
    _mm512_and_si512(v, _mm512_set1_epi8(0x0F))
}

/// Q8_0 (34-byte blocks: f16 d, 32 i8).
pub(crate) const Q8_0_BYTES: usize = 34;
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
pub(crate) unsafe fn q8_0(p: *const u8) -> __m512i {
    join(p.add(2), p.add(36))
}

/// Q4_0 (18-byte blocks: f16 d, 16 nibble bytes; w = q - 8).
pub(crate) const Q4_0_BYTES: usize = 18;
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
pub(crate) unsafe fn q4_0(p: *const u8) -> __m512i {
    _mm512_sub_epi8(nib_pair(p.add(2), p.add(20)), _mm512_set1_epi8(8))
}

/// Q5_0 (22-byte blocks: f16 d, 32 high bits, 16 nibble bytes; w = q - 16).
pub(crate) const Q5_0_BYTES: usize = 22;
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
pub(crate) unsafe fn q5_0(p: *const u8) -> __m512i {
    let hm = (core::ptr::read_unaligned(p.add(2).cast::<u32>()) as u64)
        | ((core::ptr::read_unaligned(p.add(24).cast::<u32>()) as u64) << 32);
    let n = nib_pair(p.add(6), p.add(28));
    let q = _mm512_mask_add_epi8(n, hm, n, _mm512_set1_epi8(16));
    _mm512_sub_epi8(q, _mm512_set1_epi8(16))
}

/// IQ4_NL (18-byte blocks: f16 d, 16 nibble bytes indexing the non-linear table).
pub(crate) const IQ4_NL_BYTES: usize = 18;
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
pub(crate) unsafe fn iq4_nl(p: *const u8) -> __m512i {
    let kv = _mm512_broadcast_i32x4(_mm_loadu_si128(super::tables::IQ4NL_VALUES.as_ptr().cast()));
    _mm512_shuffle_epi8(kv, nib_pair(p.add(2), p.add(20)))
}

/// Q4_1 (20-byte blocks: f16 d, f16 m, 16 nibble bytes; w = d·q + m): the unsigned nibbles.
pub(crate) const Q4_1_BYTES: usize = 20;
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
pub(crate) unsafe fn q4_1(p: *const u8) -> __m512i {
    nib_pair(p.add(4), p.add(24))
}
