//! Q3_K: 3.4375 bits per weight. 256 weights per super-block in 16 sub-blocks of 16;
//! `x = d * sc_j * q` with 3-bit signed `q` (−4..=3) and 6-bit signed sub-block scales
//! (stored with a +32 offset). Pairs with Q8_K.
//!
//! Layout (110 bytes): `hmask: [u8; 32]`, `qs: [u8; 64]`, `scales: [u8; 12]`, `d: f16`. Weight
//! `128h + 32s + l` takes its low 2 bits from bits `2s..2s+2` of `qs[32h + l]`; a *clear* bit
//! `4h + s` of `hmask[l]` subtracts 4. Scales: see [`scales`].

use crate::block::impl_block;
use crate::half::f16_to_f32;
use crate::q8_k::BlockQ8K;
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    /// Super-block scale (f16 bits).
    pub d: u16,
}
impl_block!(BlockQ3K, GgmlType::Q3K, QK_K);

/// The 16 signed sub-block scales (−32..=31). Low 4 bits of scale `k`: the low nibble of
/// `scales[k]` (k < 8) or the high nibble of `scales[k − 8]`; its top 2 bits: bits
/// `2(k/4)..2(k/4)+2` of `scales[8 + k%4]`.
pub fn scales(b: &BlockQ3K) -> [i8; 16] {
    unpack_scales(&b.scales)
}

/// [`scales`] from the block's 12 scale bytes (for kernels that read raw bytes).
#[inline]
pub fn unpack_scales(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (k, o) in out.iter_mut().enumerate() {
        let low = if k < 8 { s[k] & 0xf } else { s[k - 8] >> 4 };
        let high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// The signed quants (−4..=3) in element order.
pub fn unpack(b: &BlockQ3K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (i, o) in q.iter_mut().enumerate() {
        let (h, s, l) = (i / 128, (i % 128) / 32, i % 32);
        let low = ((b.qs[32 * h + l] >> (2 * s)) & 3) as i8;
        let high = (b.hmask[l] >> (4 * h + s)) & 1;
        *o = if high != 0 { low } else { low - 4 };
    }
    q
}

/// `dequantize_row_q3_K` for one block: `y = (d*sc) * q`.
pub fn dequantize_ref(b: &BlockQ3K, y: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d);
    let (sc, q) = (scales(b), unpack(b));
    for j in 0..16 {
        let dl = d * sc[j] as f32;
        for i in 16 * j..16 * j + 16 {
            y[i] = dl * q[i] as f32;
        }
    }
}

/// `ggml_vec_dot_q3_K_q8_K` (generic) for one block pair: `d*da * Σ_j sc_j Σ q·a`.
pub fn vec_dot_ref(w: &BlockQ3K, a: &BlockQ8K) -> f32 {
    let (sc, q) = (scales(w), unpack(w));
    let mut isum = 0i32;
    for j in 0..16 {
        let mut s = 0i32;
        for i in 16 * j..16 * j + 16 {
            s += q[i] as i32 * a.qs[i] as i32;
        }
        isum += sc[j] as i32 * s;
    }
    (f16_to_f32(w.d) * a.d()) * isum as f32
}
