//! What IQ2_XS and IQ2_S share: a super-block of 256 weights as 32 octets, each 8 grid
//! magnitudes with a sign byte, and 16 four-bit scales (multiplier `d * (0.5 + s) * 0.25`).
//! The two differ only in how an octet's grid index and signs are stored ([`Iq2Octets::octet`]).

use crate::QK_K;
use crate::grids::{sign_f, signed};
use crate::half::f16_to_f32;
use crate::q8_k::BlockQ8K;

pub trait Iq2Octets {
    /// Super-block scale (f16 bits).
    fn d_bits(&self) -> u16;
    /// Packed scales: group of 32 `g` has its first 16 weights in the low nibble of `[g]`,
    /// its last 16 in the high one.
    fn scales(&self) -> &[u8; QK_K / 32];
    /// Grid magnitudes and sign byte of the 8 weights `8k..8k+8` (k < 32).
    fn octet(&self, k: usize) -> ([u8; 8], u8);

    /// 4-bit scale of the 16 weights `16h..16h+16` (h < 16).
    #[inline(always)]
    fn scale(&self, h: usize) -> u8 {
        (self.scales()[(h & 15) / 2] >> (4 * (h % 2))) & 0xf
    }
}

/// `dequantize_row_iq2_xs` / `_iq2_s` for one block.
pub fn dequantize_ref<B: Iq2Octets>(b: &B, y: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d_bits());
    for k in 0..32 {
        let db = d * (0.5 + b.scale(k / 2) as f32) * 0.25;
        let (grid, signs) = b.octet(k);
        for j in 0..8 {
            y[8 * k + j] = db * grid[j] as f32 * sign_f(signs, j);
        }
    }
}

/// `ggml_vec_dot_iq2_xs_q8_K` / `_iq2_s_q8_K` (generic) for one block pair:
/// `0.125 * d*da * Σ_h (2s_h+1) Σ ±grid·a` over the 16 scale groups.
pub fn vec_dot_ref<B: Iq2Octets>(w: &B, a: &BlockQ8K) -> f32 {
    let mut bsum = 0i32;
    for h in 0..16 {
        let mut sumi = 0i32;
        for k in 2 * h..2 * h + 2 {
            let (grid, signs) = w.octet(k);
            for j in 0..8 {
                sumi += signed(signs, j, grid[j] as i32 * a.qs[8 * k + j] as i32);
            }
        }
        bsum += sumi * (2 * w.scale(h) as i32 + 1);
    }
    0.125 * ((f16_to_f32(w.d_bits()) * a.d()) * bsum as f32)
}
