//! IQ1_M: 1.75 bits per weight. 256 weights per super-block; each 8 weights are one of the
//! 2048 points of IQ1_S's grid (values −1, 0, 1) shifted by their own `±IQ1S_DELTA`, each 16
//! weights have a 3-bit scale `s` (multiplier `d * (2s + 1)`). Pairs with Q8_K.
//!
//! Layout (56 bytes): `qs: [u8; 32]` (low 8 bits of the grid indices, one per 8 weights),
//! `qh: [u8; 16]` (per index `k`: nibble `k%2` of `qh[k/2]`, bits 0..3 the index's bits 8..11,
//! bit 3 set means a −delta shift), `scales: [u8; 8]` read as 4 little-endian u16: bits
//! `3i..3i+3` of word `w` are the scale of the 16 weights `64w + 16i..`, and the top nibbles of
//! the 4 words together are the f16 super-block scale `d` (word 0 the lowest).

use crate::block::impl_block;
use crate::half::f16_to_f32;
use crate::iq1_s::{IQ1S_DELTA, grid};
use crate::q8_k::BlockQ8K;
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ1M {
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
    pub scales: [u8; QK_K / 32],
}
impl_block!(BlockIQ1M, GgmlType::IQ1M, QK_K);

/// The 4 scale words.
#[inline(always)]
fn words(b: &BlockIQ1M) -> [u16; 4] {
    scale_words(&b.scales)
}

/// The 4 little-endian scale words of the block's 8 scale bytes.
#[inline(always)]
pub fn scale_words(s: &[u8; 8]) -> [u16; 4] {
    [0, 1, 2, 3].map(|i| u16::from_le_bytes([s[2 * i], s[2 * i + 1]]))
}

/// The super-block scale (f16 bits), spread over the top nibbles of the scale words.
#[inline(always)]
pub fn d_bits(b: &BlockIQ1M) -> u16 {
    d_bits_of(&words(b))
}

/// [`d_bits`] from the scale words.
#[inline(always)]
pub fn d_bits_of(w: &[u16; 4]) -> u16 {
    (w[0] >> 12) | ((w[1] >> 8) & 0x00f0) | ((w[2] >> 4) & 0x0f00) | (w[3] & 0xf000)
}

/// Scale multiplier `2s + 1` of the 16 weights `16h..16h+16` (h < 16).
#[inline(always)]
pub fn ls(w: &[u16; 4], h: usize) -> i32 {
    let h = h & 15;
    2 * ((w[h / 4] >> (3 * (h % 4))) & 7) as i32 + 1
}

/// Grid values and shift sign (±1) of the 8 weights `8k..8k+8` (k < 32).
#[inline(always)]
fn octet(b: &BlockIQ1M, k: usize) -> ([i8; 8], i32) {
    let k = k & 31;
    let nib = (b.qh[k / 2] >> (4 * (k % 2))) & 0xf;
    (grid(b.qs[k] as usize | (((nib & 7) as usize) << 8)), if nib & 8 != 0 { -1 } else { 1 })
}

/// `dequantize_row_iq1_m` for one block: `y = d*(2s+1) * (grid ± delta)`.
pub fn dequantize_ref(b: &BlockIQ1M, y: &mut [f32; QK_K]) {
    let d = f16_to_f32(d_bits(b));
    let w = words(b);
    for k in 0..32 {
        let dl = d * ls(&w, k / 2) as f32;
        let (v, sign) = octet(b, k);
        let delta = if sign < 0 { -IQ1S_DELTA } else { IQ1S_DELTA };
        for j in 0..8 {
            y[8 * k + j] = dl * (v[j] as f32 + delta);
        }
    }
}

/// `ggml_vec_dot_iq1_m_q8_K` (generic) for one block pair:
/// `d*da * (Σ_h (2s+1) Σ grid·a + delta * Σ_h (2s+1) Σ_octets ±Σ a)`.
pub fn vec_dot_ref(w: &BlockIQ1M, a: &BlockQ8K) -> f32 {
    let sw = words(w);
    let (mut sumi1, mut sumi2) = (0i32, 0i32);
    for h in 0..16 {
        let (mut s1, mut s2) = (0i32, 0i32);
        for k in 2 * h..2 * h + 2 {
            let (v, sign) = octet(w, k);
            let (mut dot, mut sum) = (0i32, 0i32);
            for j in 0..8 {
                let q = a.qs[8 * k + j] as i32;
                dot += v[j] as i32 * q;
                sum += q;
            }
            s1 += dot;
            s2 += sign * sum;
        }
        sumi1 += ls(&sw, h) * s1;
        sumi2 += ls(&sw, h) * s2;
    }
    f16_to_f32(d_bits(w)) * a.d() * (sumi1 as f32 + IQ1S_DELTA * sumi2 as f32)
}
