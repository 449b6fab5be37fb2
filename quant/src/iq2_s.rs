//! IQ2_S: 2.5625 bits per weight. 256 weights per super-block; each 8 magnitudes are one of
//! 1024 points of [`IQ2S_GRID`] (values 8, 25, 43), every weight has its own sign bit, each 16
//! weights a 4-bit scale `s` (multiplier `d * (0.5 + s) * 0.25`). Pairs with Q8_K.
//!
//! Layout (82 bytes): `d: f16`, `qs: [u8; 64]`: `qs[0..32]` the low 8 bits of the grid indices
//! (one per 8 weights), `qs[32..64]` the sign bytes (one per 8 weights); `qh: [u8; 8]` (bits
//! `2i..2i+2` of `qh[k/4]`, i = k%4, are bits 8..10 of index `k`); `scales: [u8; 8]` as IQ2_XS.

use crate::block::impl_block;
use crate::grids::{IQ2S_GRID, sign_f, signed};
use crate::half::f16_to_f32;
use crate::q8_k::BlockQ8K;
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ2S {
    /// Super-block scale (f16 bits).
    pub d: u16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}
impl_block!(BlockIQ2S, GgmlType::IQ2S, QK_K);

/// 4-bit scale of the 16 weights `16h..16h+16` (h < 16).
#[inline(always)]
pub fn scale(b: &BlockIQ2S, h: usize) -> u8 {
    (b.scales[(h & 15) / 2] >> (4 * (h % 2))) & 0xf
}

/// Grid magnitudes and sign byte of the 8 weights `8k..8k+8` (k < 32).
#[inline(always)]
fn octet(b: &BlockIQ2S, k: usize) -> ([u8; 8], u8) {
    let k = k & 31;
    let idx = b.qs[k] as usize | ((((b.qh[k / 4] >> (2 * (k % 4))) & 3) as usize) << 8);
    (IQ2S_GRID[idx & 1023].to_le_bytes(), b.qs[32 + k])
}

/// `dequantize_row_iq2_s` for one block.
pub fn dequantize_ref(b: &BlockIQ2S, y: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d);
    for k in 0..32 {
        let db = d * (0.5 + scale(b, k / 2) as f32) * 0.25;
        let (grid, signs) = octet(b, k);
        for j in 0..8 {
            y[8 * k + j] = db * grid[j] as f32 * sign_f(signs, j);
        }
    }
}

/// `ggml_vec_dot_iq2_s_q8_K` (generic) for one block pair:
/// `0.125 * d*da * Σ_h (2s_h+1) Σ ±grid·a` over the 16 scale groups.
pub fn vec_dot_ref(w: &BlockIQ2S, a: &BlockQ8K) -> f32 {
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
