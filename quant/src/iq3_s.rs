//! IQ3_S: 3.4375 bits per weight. 256 weights per super-block, 8 groups of 32; each 4
//! magnitudes are one of 512 points of [`IQ3S_GRID`] (odd values 1..15), every weight has its
//! own sign bit, each group a 4-bit scale `s` (multiplier `d * (1 + 2s)`). Pairs with Q8_K.
//!
//! Layout (110 bytes): `d: f16`, `qs: [u8; 64]` (low 8 bits of the grid indices, 8 per group),
//! `qh: [u8; 8]` (bit `i` of `qh[g]` is bit 8 of index `8g + i`), `signs: [u8; 32]` (one bit
//! per weight, byte `4g + l` for weights `8l..8l+8` of group `g`), `scales: [u8; 4]` (group `g`
//! in nibble `g%2` of byte `g/2`).

use crate::block::impl_block;
use crate::grids::{IQ3S_GRID, sign_f, signed};
use crate::half::f16_to_f32;
use crate::q8_k::BlockQ8K;
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ3S {
    /// Super-block scale (f16 bits).
    pub d: u16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub signs: [u8; QK_K / 8],
    pub scales: [u8; QK_K / 64],
}
impl_block!(BlockIQ3S, GgmlType::IQ3S, QK_K);

/// 4-bit scale of group `g` (0..8).
#[inline(always)]
fn scale(b: &BlockIQ3S, g: usize) -> u8 {
    (b.scales[(g & 7) / 2] >> (4 * (g % 2))) & 0xf
}

/// The 4 magnitudes of grid index `k` (0..64) of the block.
#[inline(always)]
pub fn grid(b: &BlockIQ3S, k: usize) -> [u8; 4] {
    let k = k & 63;
    let idx = b.qs[k] as usize | ((((b.qh[k / 8] >> (k % 8)) & 1) as usize) << 8);
    IQ3S_GRID[idx & 511].to_le_bytes()
}

/// `dequantize_row_iq3_s` for one block: `y = d*(1+2s) * grid * sign`.
pub fn dequantize_ref(b: &BlockIQ3S, y: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d);
    for g in 0..8 {
        let db = d * (1 + 2 * scale(b, g) as u32) as f32;
        for l in 0..4 {
            let (g1, g2) = (grid(b, 8 * g + 2 * l), grid(b, 8 * g + 2 * l + 1));
            let signs = b.signs[4 * g + l];
            let o = 32 * g + 8 * l;
            for j in 0..4 {
                y[o + j] = db * g1[j] as f32 * sign_f(signs, j);
                y[o + j + 4] = db * g2[j] as f32 * sign_f(signs, j + 4);
            }
        }
    }
}

/// `ggml_vec_dot_iq3_s_q8_K` (generic) for one block pair: `d*da * Σ_g (1+2s_g) Σ ±grid·a`.
pub fn vec_dot_ref(w: &BlockIQ3S, a: &BlockQ8K) -> f32 {
    let mut bsum = 0i32;
    for g in 0..8 {
        let mut sumi = 0i32;
        for l in 0..4 {
            let (g1, g2) = (grid(w, 8 * g + 2 * l), grid(w, 8 * g + 2 * l + 1));
            let signs = w.signs[4 * g + l];
            let o = 32 * g + 8 * l;
            for j in 0..4 {
                sumi += signed(signs, j, g1[j] as i32 * a.qs[o + j] as i32);
                sumi += signed(signs, j + 4, g2[j] as i32 * a.qs[o + j + 4] as i32);
            }
        }
        bsum += sumi * (1 + 2 * scale(w, g) as i32);
    }
    (f16_to_f32(w.d) * a.d()) * bsum as f32
}
