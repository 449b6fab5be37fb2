//! IQ4_XS: 4.25 bits per weight. 256 weights per super-block in 8 groups of 32; each weight
//! is a 4-bit index into IQ4_NL's non-linear levels ([`KVALUES_IQ4NL`]), each group has a
//! 6-bit signed scale (stored with a +32 offset). Pairs with Q8_K.
//!
//! Layout (136 bytes): `d: f16`, `scales_h: u16` (2 high bits of group `g`'s scale at bits
//! `2g`), `scales_l: [u8; 4]` (4 low bits, group `g` in nibble `g%2` of byte `g/2`),
//! `qs: [u8; 128]`: group `g` is `qs[16g..16g+16]`, nibbles as in Q4_0.

use crate::block::impl_block;
use crate::half::f16_to_f32;
use crate::iq4_nl::KVALUES_IQ4NL;
use crate::q8_k::BlockQ8K;
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ4XS {
    /// Super-block scale (f16 bits).
    pub d: u16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
impl_block!(BlockIQ4XS, GgmlType::IQ4XS, QK_K);

/// Signed scale (−32..=31) of group `g` (0..8).
#[inline(always)]
pub fn scale(b: &BlockIQ4XS, g: usize) -> i32 {
    scale_of(b.scales_h, &b.scales_l, g)
}

/// [`scale`] from the block's scale fields (for kernels that read raw bytes).
#[inline(always)]
pub fn scale_of(scales_h: u16, scales_l: &[u8; 4], g: usize) -> i32 {
    let g = g & 7;
    let low = (scales_l[g / 2] >> (4 * (g % 2))) & 0xf;
    let high = ((scales_h >> (2 * g)) & 3) as u8;
    (low | (high << 4)) as i32 - 32
}

/// The level of weight `j` (0..32) of group `g`.
#[inline(always)]
fn level(b: &BlockIQ4XS, g: usize, j: usize) -> i8 {
    let q = b.qs[16 * g + j % 16];
    KVALUES_IQ4NL[((if j < 16 { q } else { q >> 4 }) & 0xf) as usize]
}

/// `dequantize_row_iq4_xs` for one block: `y = (d*sc) * K[q]`.
pub fn dequantize_ref(b: &BlockIQ4XS, y: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d);
    for g in 0..8 {
        let dl = d * scale(b, g) as f32;
        for j in 0..32 {
            y[32 * g + j] = dl * level(b, g, j) as f32;
        }
    }
}

/// `ggml_vec_dot_iq4_xs_q8_K` (generic) for one block pair: `d*da * Σ_g sc_g Σ K[q]·a`.
pub fn vec_dot_ref(w: &BlockIQ4XS, a: &BlockQ8K) -> f32 {
    let mut isum = 0i32;
    for g in 0..8 {
        let mut s = 0i32;
        for j in 0..32 {
            s += level(w, g, j) as i32 * a.qs[32 * g + j] as i32;
        }
        isum += scale(w, g) * s;
    }
    (f16_to_f32(w.d) * a.d()) * isum as f32
}
