//! IQ2_XS: 2.3125 bits per weight. 256 weights per super-block; each 8 magnitudes are one of
//! 512 points of [`IQ2XS_GRID`] (values 8, 25, 43) with an even-parity sign pattern
//! ([`ksigns`]); each 16 weights have a 4-bit scale `s` (multiplier `d * (0.5 + s) * 0.25`).
//! Pairs with Q8_K.
//!
//! Layout (74 bytes): `d: f16`, `qs: [u16; 32]` (one per 8 weights: grid index in bits 0..9,
//! 7 sign bits in 9..16), `scales: [u8; 8]` (group of 32 `g`: first 16 weights in the low
//! nibble of `scales[g]`, last 16 in the high one).

use crate::block::impl_block;
use crate::grids::{IQ2XS_GRID, sign_f, signed};
use crate::half::f16_to_f32;
use crate::iq3_xxs::ksigns;
use crate::q8_k::BlockQ8K;
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ2XS {
    /// Super-block scale (f16 bits).
    pub d: u16,
    pub qs: [u16; QK_K / 8],
    pub scales: [u8; QK_K / 32],
}
impl_block!(BlockIQ2XS, GgmlType::IQ2XS, QK_K);

/// 4-bit scale of the 16 weights `16h..16h+16` (h < 16).
#[inline(always)]
pub fn scale(b: &BlockIQ2XS, h: usize) -> u8 {
    (b.scales[(h & 15) / 2] >> (4 * (h % 2))) & 0xf
}

/// Grid magnitudes and sign pattern of the 8 weights `8k..8k+8` (k < 32).
#[inline(always)]
fn octet(b: &BlockIQ2XS, k: usize) -> ([u8; 8], u8) {
    let q = b.qs[k & 31];
    (IQ2XS_GRID[(q & 511) as usize].to_le_bytes(), ksigns((q >> 9) as u32))
}

/// `dequantize_row_iq2_xs` for one block.
pub fn dequantize_ref(b: &BlockIQ2XS, y: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d);
    for k in 0..32 {
        let db = d * (0.5 + scale(b, k / 2) as f32) * 0.25;
        let (grid, signs) = octet(b, k);
        for j in 0..8 {
            y[8 * k + j] = db * grid[j] as f32 * sign_f(signs, j);
        }
    }
}

/// `ggml_vec_dot_iq2_xs_q8_K` (generic) for one block pair:
/// `0.125 * d*da * Σ_h (2s_h+1) Σ ±grid·a` over the 16 scale groups.
pub fn vec_dot_ref(w: &BlockIQ2XS, a: &BlockQ8K) -> f32 {
    let mut bsum = 0i32;
    for h in 0..16 {
        let mut sumi = 0i32;
        for k in 2 * h..2 * h + 2 {
            let (grid, signs) = octet(w, k);
            for j in 0..8 {
                sumi += signed(signs, j, grid[j] as i32 * a.qs[8 * k + j] as i32);
            }
        }
        bsum += sumi * (2 * scale(w, h) as i32 + 1);
    }
    0.125 * ((f16_to_f32(w.d) * a.d()) * bsum as f32)
}
