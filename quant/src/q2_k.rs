//! Q2_K: 2.625 bits per weight. 256 weights per super-block in 16 sub-blocks of 16;
//! `x = d*sc_j * q - dmin*m_j` with 2-bit `q` and 4-bit sub-block scales and mins. Pairs with
//! Q8_K.
//!
//! Layout (84 bytes): `scales: [u8; 16]` (scale in the low nibble, min in the high one),
//! `qs: [u8; 64]`, `d: f16`, `dmin: f16`. For half `h` (128 weights), weight `128h + 32s + l`
//! is bits `2s..2s+2` of `qs[32h + l]`.

use crate::block::impl_block;
use crate::half::f16_to_f32;
use crate::q8_k::BlockQ8K;
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    /// Super-block scale of the sub-block scales (f16 bits).
    pub d: u16,
    /// Super-block scale of the sub-block mins (f16 bits).
    pub dmin: u16,
}
impl_block!(BlockQ2K, GgmlType::Q2K, QK_K);

/// The 2-bit quants (0..=3) in element order.
pub fn unpack(b: &BlockQ2K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for (i, o) in q.iter_mut().enumerate() {
        let (h, s, l) = (i / 128, (i % 128) / 32, i % 32);
        *o = (b.qs[32 * h + l] >> (2 * s)) & 3;
    }
    q
}

/// `dequantize_row_q2_K` for one block: `y = (d*sc) * q - dmin*m`.
pub fn dequantize_ref(b: &BlockQ2K, y: &mut [f32; QK_K]) {
    let (d, min) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
    let q = unpack(b);
    for j in 0..16 {
        let dl = d * (b.scales[j] & 0xf) as f32;
        let ml = min * (b.scales[j] >> 4) as f32;
        for i in 16 * j..16 * j + 16 {
            y[i] = dl * q[i] as f32 - ml;
        }
    }
}

/// `ggml_vec_dot_q2_K_q8_K` (generic) for one block pair:
/// `d*da * Σ_j sc_j Σ q·a − dmin*da * Σ_j m_j·bsums_j` (the min term from the Q8_K bsums).
pub fn vec_dot_ref(w: &BlockQ2K, a: &BlockQ8K) -> f32 {
    let q = unpack(w);
    let (mut isum, mut summs) = (0i32, 0i32);
    for j in 0..16 {
        let mut s = 0i32;
        for i in 16 * j..16 * j + 16 {
            s += q[i] as i32 * a.qs[i] as i32;
        }
        isum += (w.scales[j] & 0xf) as i32 * s;
        summs += (w.scales[j] >> 4) as i32 * a.bsums[j] as i32;
    }
    let dall = a.d() * f16_to_f32(w.d);
    let dmin = a.d() * f16_to_f32(w.dmin);
    dall * isum as f32 - dmin * summs as f32
}
