//! IQ1_S: 1.5625 bits per weight. 256 weights per super-block, 8 groups of 32; each 8 weights
//! are one of 2048 points of [`IQ1S_GRID`] (values −1, 0, 1) shifted by `±IQ1S_DELTA`, each
//! group has a 3-bit scale `s` (multiplier `d * (2s + 1)`) and the sign of its shift. Pairs
//! with Q8_K.
//!
//! Layout (50 bytes): `d: f16`, `qs: [u8; 32]` (low 8 bits of the grid indices, 4 per group),
//! `qh: [u16; 8]`, one per group: bits `3l..3l+3` are bits 8..11 of index `l`, bits 12..15 the
//! scale, bit 15 set means the shift is −delta.

use crate::block::impl_block;
use crate::grids::IQ1S_GRID;
use crate::half::f16_to_f32;
use crate::q8_k::BlockQ8K;
use crate::{GgmlType, QK_K};

/// The shift added to every grid value (ggml's `IQ1S_DELTA`, also IQ1_M's).
pub const IQ1S_DELTA: f32 = 0.125;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ1S {
    /// Super-block scale (f16 bits).
    pub d: u16,
    pub qs: [u8; QK_K / 8],
    pub qh: [u16; QK_K / 32],
}
impl_block!(BlockIQ1S, GgmlType::IQ1S, QK_K);

/// The 8 values (−1..=1) of grid point `idx` (any value; 11 bits are used).
#[inline(always)]
pub fn grid(idx: usize) -> [i8; 8] {
    IQ1S_GRID[idx & 2047].to_le_bytes().map(|v| v as i8)
}

/// Grid values of the 8 weights `8l..8l+8` (l < 4) of group `g`.
#[inline(always)]
fn octet(b: &BlockIQ1S, g: usize, l: usize) -> [i8; 8] {
    let qh = b.qh[g & 7] as usize;
    grid(b.qs[(4 * g + l) & 31] as usize | (((qh >> (3 * l)) & 7) << 8))
}

/// `dequantize_row_iq1_s` for one block: `y = d*(2s+1) * (grid ± delta)`.
pub fn dequantize_ref(b: &BlockIQ1S, y: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d);
    for g in 0..8 {
        let qh = b.qh[g];
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = if qh & 0x8000 != 0 { -IQ1S_DELTA } else { IQ1S_DELTA };
        for l in 0..4 {
            let v = octet(b, g, l);
            for j in 0..8 {
                y[32 * g + 8 * l + j] = dl * (v[j] as f32 + delta);
            }
        }
    }
}

/// `ggml_vec_dot_iq1_s_q8_K` (generic) for one block pair:
/// `d*da * (Σ_g (2s+1) Σ grid·a + delta * Σ_g ±(2s+1) Σ a)`, the activation sums from bsums.
pub fn vec_dot_ref(w: &BlockIQ1S, a: &BlockQ8K) -> f32 {
    let (mut sumi, mut sumi1) = (0i32, 0i32);
    for g in 0..8 {
        let qh = w.qh[g];
        let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
        let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
        let mut lsum = 0i32;
        for l in 0..4 {
            let v = octet(w, g, l);
            for j in 0..8 {
                lsum += v[j] as i32 * a.qs[32 * g + 8 * l + j] as i32;
            }
        }
        sumi += ls * lsum;
        sumi1 += ls * delta * (a.bsums[2 * g] as i32 + a.bsums[2 * g + 1] as i32);
    }
    f16_to_f32(w.d) * a.d() * (sumi as f32 + IQ1S_DELTA * sumi1 as f32)
}
