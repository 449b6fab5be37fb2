//! IQ2_XXS: 2.0625 bits per weight. 256 weights per super-block, 8 groups of 32; each 8
//! magnitudes are one of 256 points of [`IQ2XXS_GRID`] (values 8, 25, 43), signs come in
//! even-parity patterns of 8 ([`ksigns`], 7 stored bits), each group has a 4-bit scale `ls`
//! (multiplier `d * (0.5 + ls) * 0.25`). Pairs with Q8_K.
//!
//! Layout (66 bytes): `d: f16`, `qs: [u16; 32]`, read per group as two little-endian u32:
//! the first holds 4 grid indices (one byte each), the second 4×7 sign bits and `ls` in bits
//! 28..32.

use crate::block::impl_block;
use crate::grids::{IQ2XXS_GRID, sign_f, signed};
use crate::half::f16_to_f32;
use crate::iq3_xxs::ksigns;
use crate::q8_k::BlockQ8K;
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ2XXS {
    /// Super-block scale (f16 bits).
    pub d: u16,
    pub qs: [u16; QK_K / 8],
}
impl_block!(BlockIQ2XXS, GgmlType::IQ2XXS, QK_K);

/// The two words of group `g` (0..8): (grid indices, signs and scale).
#[inline(always)]
fn words(b: &BlockIQ2XXS, g: usize) -> (u32, u32) {
    let q = &b.qs[4 * (g & 7)..4 * (g & 7) + 4];
    (q[0] as u32 | (q[1] as u32) << 16, q[2] as u32 | (q[3] as u32) << 16)
}

/// `dequantize_row_iq2_xxs` for one block.
pub fn dequantize_ref(b: &BlockIQ2XXS, y: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d);
    for g in 0..8 {
        let (idx, aux) = words(b, g);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for l in 0..4 {
            let grid = IQ2XXS_GRID[((idx >> (8 * l)) & 0xff) as usize].to_le_bytes();
            let signs = ksigns(aux >> (7 * l));
            for j in 0..8 {
                y[32 * g + 8 * l + j] = db * grid[j] as f32 * sign_f(signs, j);
            }
        }
    }
}

/// `ggml_vec_dot_iq2_xxs_q8_K` (generic) for one block pair:
/// `0.125 * d*da * Σ_g (2ls+1) Σ ±grid·a`.
pub fn vec_dot_ref(w: &BlockIQ2XXS, a: &BlockQ8K) -> f32 {
    let mut bsum = 0i32;
    for g in 0..8 {
        let (idx, aux) = words(w, g);
        let mut sumi = 0i32;
        for l in 0..4 {
            let grid = IQ2XXS_GRID[((idx >> (8 * l)) & 0xff) as usize].to_le_bytes();
            let signs = ksigns(aux >> (7 * l));
            for j in 0..8 {
                sumi += signed(signs, j, grid[j] as i32 * a.qs[32 * g + 8 * l + j] as i32);
            }
        }
        bsum += sumi * (2 * (aux >> 28) as i32 + 1);
    }
    0.125 * ((f16_to_f32(w.d) * a.d()) * bsum as f32)
}
