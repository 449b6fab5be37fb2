//! IQ3_XXS: 3.06 bits per weight. 256 weights per super-block, 8 groups of 32; each group of
//! 4 magnitudes is one of 256 points of a fixed grid ([`IQ3XXS_GRID`], values 4..62), signs
//! come in 8-bit patterns with even parity (7 stored bits, see [`ksigns`]), and each group of
//! 32 has a 4-bit scale. Pairs with Q8_K.
//!
//! Layout (98 bytes): `d: f16`, `qs: [u8; 96]`: `qs[0..64]` are grid indices (8 per group of
//! 32, one per 4 weights), `qs[64..96]` are 8 little-endian u32 "scales and signs", one per
//! group: bits `7l..7l+7` (l < 4) are the sign pattern of weights `8l..8l+8` of the group,
//! bits 28..32 the scale `ls`; the group multiplier is `d * (0.5 + ls) * 0.5`.

use crate::block::impl_block;
use crate::half::{f16_to_f32, f32_to_f16};
use crate::q8_k::BlockQ8K;
use crate::util::{fabsf, nearest_int};
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ3XXS {
    /// Super-block scale (f16 bits).
    pub d: u16,
    pub qs: [u8; 3 * QK_K / 8],
}
impl_block!(BlockIQ3XXS, GgmlType::IQ3XXS, QK_K);

/// ggml's `iq3xxs_grid`: 256 points of 4 magnitudes, one per byte (little-endian).
/// Data table required for byte compatibility with GGUF files.
pub static IQ3XXS_GRID: [u32; 256] = [
    0x04040404, 0x04040414, 0x04040424, 0x04040c0c, 0x04040c1c, 0x04040c3e, 0x04041404, 0x04041414, 0x04041c0c,
    0x04042414, 0x04043e1c, 0x04043e2c, 0x040c040c, 0x040c041c, 0x040c0c04, 0x040c0c14, 0x040c140c, 0x040c142c,
    0x040c1c04, 0x040c1c14, 0x040c240c, 0x040c2c24, 0x040c3e04, 0x04140404, 0x04140414, 0x04140424, 0x04140c0c,
    0x04141404, 0x04141414, 0x04141c0c, 0x04141c1c, 0x04141c3e, 0x04142c0c, 0x04142c3e, 0x04143e2c, 0x041c040c,
    0x041c043e, 0x041c0c04, 0x041c0c14, 0x041c142c, 0x041c3e04, 0x04240c1c, 0x04241c3e, 0x04242424, 0x04242c3e,
    0x04243e1c, 0x04243e2c, 0x042c040c, 0x042c043e, 0x042c1c14, 0x042c2c14, 0x04341c2c, 0x04343424, 0x043e0c04,
    0x043e0c24, 0x043e0c34, 0x043e241c, 0x043e340c, 0x0c04040c, 0x0c04041c, 0x0c040c04, 0x0c040c14, 0x0c04140c,
    0x0c04141c, 0x0c041c04, 0x0c041c14, 0x0c041c24, 0x0c04243e, 0x0c042c04, 0x0c0c0404, 0x0c0c0414, 0x0c0c0c0c,
    0x0c0c1404, 0x0c0c1414, 0x0c14040c, 0x0c14041c, 0x0c140c04, 0x0c140c14, 0x0c14140c, 0x0c141c04, 0x0c143e14,
    0x0c1c0404, 0x0c1c0414, 0x0c1c1404, 0x0c1c1c0c, 0x0c1c2434, 0x0c1c3434, 0x0c24040c, 0x0c24042c, 0x0c242c04,
    0x0c2c1404, 0x0c2c1424, 0x0c2c2434, 0x0c2c3e0c, 0x0c34042c, 0x0c3e1414, 0x0c3e2404, 0x14040404, 0x14040414,
    0x14040c0c, 0x14040c1c, 0x14041404, 0x14041414, 0x14041434, 0x14041c0c, 0x14042414, 0x140c040c, 0x140c041c,
    0x140c042c, 0x140c0c04, 0x140c0c14, 0x140c140c, 0x140c1c04, 0x140c341c, 0x140c343e, 0x140c3e04, 0x14140404,
    0x14140414, 0x14140c0c, 0x14140c3e, 0x14141404, 0x14141414, 0x14141c3e, 0x14142404, 0x14142c2c, 0x141c040c,
    0x141c0c04, 0x141c0c24, 0x141c3e04, 0x141c3e24, 0x14241c2c, 0x14242c1c, 0x142c041c, 0x142c143e, 0x142c240c,
    0x142c3e24, 0x143e040c, 0x143e041c, 0x143e0c34, 0x143e242c, 0x1c04040c, 0x1c040c04, 0x1c040c14, 0x1c04140c,
    0x1c04141c, 0x1c042c04, 0x1c04342c, 0x1c043e14, 0x1c0c0404, 0x1c0c0414, 0x1c0c1404, 0x1c0c1c0c, 0x1c0c2424,
    0x1c0c2434, 0x1c14040c, 0x1c14041c, 0x1c140c04, 0x1c14142c, 0x1c142c14, 0x1c143e14, 0x1c1c0c0c, 0x1c1c1c1c,
    0x1c241c04, 0x1c24243e, 0x1c243e14, 0x1c2c0404, 0x1c2c0434, 0x1c2c1414, 0x1c2c2c2c, 0x1c340c24, 0x1c341c34,
    0x1c34341c, 0x1c3e1c1c, 0x1c3e3404, 0x24040424, 0x24040c3e, 0x24041c2c, 0x24041c3e, 0x24042c1c, 0x24042c3e,
    0x240c3e24, 0x24141404, 0x24141c3e, 0x24142404, 0x24143404, 0x24143434, 0x241c043e, 0x241c242c, 0x24240424,
    0x24242c0c, 0x24243424, 0x242c142c, 0x242c241c, 0x242c3e04, 0x243e042c, 0x243e0c04, 0x243e0c14, 0x243e1c04,
    0x2c040c14, 0x2c04240c, 0x2c043e04, 0x2c0c0404, 0x2c0c0434, 0x2c0c1434, 0x2c0c2c2c, 0x2c140c24, 0x2c141c14,
    0x2c143e14, 0x2c1c0414, 0x2c1c2c1c, 0x2c240c04, 0x2c24141c, 0x2c24143e, 0x2c243e14, 0x2c2c0414, 0x2c2c1c0c,
    0x2c342c04, 0x2c3e1424, 0x2c3e2414, 0x34041424, 0x34042424, 0x34042434, 0x34043424, 0x340c140c, 0x340c340c,
    0x34140c3e, 0x34143424, 0x341c1c04, 0x341c1c34, 0x34242424, 0x342c042c, 0x342c2c14, 0x34341c1c, 0x343e041c,
    0x343e140c, 0x3e04041c, 0x3e04042c, 0x3e04043e, 0x3e040c04, 0x3e041c14, 0x3e042c14, 0x3e0c1434, 0x3e0c2404,
    0x3e140c14, 0x3e14242c, 0x3e142c14, 0x3e1c0404, 0x3e1c0c2c, 0x3e1c1c1c, 0x3e1c3404, 0x3e24140c, 0x3e24240c,
    0x3e2c0404, 0x3e2c0414, 0x3e2c1424, 0x3e341c04,
];

/// ggml's `ksigns_iq2xs[i]`: the 7 stored sign bits `i` plus an 8th bit that makes the
/// number of set bits (negative weights) even.
#[inline(always)]
pub const fn ksigns(i: u32) -> u8 {
    let i = i & 127;
    (i | ((i.count_ones() & 1) << 7)) as u8
}

/// The 8 magnitudes of grid entry `idx` as bytes.
#[inline(always)]
pub fn grid(idx: u8) -> [u8; 4] {
    IQ3XXS_GRID[idx as usize].to_le_bytes()
}

/// Scale-and-signs word of group `ib32` (0..8).
#[inline(always)]
pub fn scales_and_signs(b: &BlockIQ3XXS, ib32: usize) -> u32 {
    let o = 64 + 4 * (ib32 & 7);
    u32::from_le_bytes([b.qs[o], b.qs[o + 1], b.qs[o + 2], b.qs[o + 3]])
}

/// `dequantize_row_iq3_xxs` for one block.
pub fn dequantize_ref(b: &BlockIQ3XXS, y: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d);
    for ib32 in 0..8 {
        let aux = scales_and_signs(b, ib32);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let signs = ksigns(aux >> (7 * l));
            let g1 = grid(b.qs[8 * ib32 + 2 * l]);
            let g2 = grid(b.qs[8 * ib32 + 2 * l + 1]);
            let o = 32 * ib32 + 8 * l;
            for j in 0..4 {
                let s1 = if signs & (1 << j) != 0 { -1.0 } else { 1.0 };
                let s2 = if signs & (1 << (j + 4)) != 0 { -1.0 } else { 1.0 };
                y[o + j] = db * g1[j] as f32 * s1;
                y[o + j + 4] = db * g2[j] as f32 * s2;
            }
        }
    }
}

/// Nearest grid point (least squares) to the 4 targets `t` at multiplier `s`; returns
/// `(index, squared error)`. Targets may be negative (a weight whose sign had to be flipped
/// to keep the parity even).
fn nearest_grid(t: &[f32; 4], s: f32) -> (u8, f32) {
    let mut best = (0u8, f32::INFINITY);
    for (k, &g) in IQ3XXS_GRID.iter().enumerate() {
        let gb = g.to_le_bytes();
        let mut e = 0.0f32;
        for j in 0..4 {
            let diff = t[j] - s * gb[j] as f32;
            e += diff * diff;
        }
        if e < best.1 {
            best = (k as u8, e);
        }
    }
    best
}

/// Fit the 32 targets of one group at multiplier `s`: grid indices and total squared error.
fn fit_group(t: &[f32; 32], s: f32) -> ([u8; 8], f32) {
    let mut idx = [0u8; 8];
    let mut err = 0.0f32;
    for k in 0..8 {
        let q = [t[4 * k], t[4 * k + 1], t[4 * k + 2], t[4 * k + 3]];
        let (i, e) = nearest_grid(&q, s);
        idx[k] = i;
        err += e;
    }
    (idx, err)
}

/// Reference quantizer for IQ3_XXS. **Not** llama.cpp's `quantize_row_iq3_xxs_ref` (that one
/// is an importance-weighted search over grid neighbourhoods needing large init tables); this
/// is a simpler, deterministic quantizer that produces valid blocks of the same format:
///
/// 1. signs: per 8 weights, negative ones are flagged; if their count is odd, the sign of the
///    smallest-magnitude weight is flipped (its target magnitude becomes negative, which the
///    grid fit then treats as "as small as possible");
/// 2. per group of 32: a scan of 24 trial multipliers around `max|x|/62`, each fitted with the
///    nearest grid point (least squares) per 4 weights, best one kept;
/// 3. `d = max_group_multiplier / 7.75` (f16), 4-bit group scales
///    `ls = round((4*s/d - 1)/2)`, and a final grid fit at the exact stored multiplier.
pub fn quantize_ref(x: &[f32; QK_K]) -> BlockIQ3XXS {
    let mut b = BlockIQ3XXS { d: 0, qs: [0; 3 * QK_K / 8] };
    let mut targets = [[0.0f32; 32]; 8];
    let mut sign_bits = [[0u8; 4]; 8];
    let mut group_s = [0.0f32; 8];
    for g in 0..8 {
        let xs = &x[32 * g..32 * g + 32];
        for l in 0..4 {
            let mut bits = 0u8;
            let mut min_k = 0usize;
            for j in 0..8 {
                let v = xs[8 * l + j];
                targets[g][8 * l + j] = fabsf(v);
                if v < 0.0 {
                    bits |= 1 << j;
                }
                if fabsf(v) < fabsf(xs[8 * l + min_k]) {
                    min_k = j;
                }
            }
            if bits.count_ones() & 1 == 1 {
                bits ^= 1 << min_k;
                targets[g][8 * l + min_k] = -targets[g][8 * l + min_k];
            }
            sign_bits[g][l] = bits;
        }
        let amax = targets[g].iter().fold(0.0f32, |m, &v| if v > m { v } else { m });
        if amax == 0.0 {
            continue;
        }
        let mut best = (f32::INFINITY, 0.0f32);
        for k in 0..24 {
            // multipliers from amax/62 * 0.6 to amax/62 * 1.5
            let s = amax / 62.0 * (0.6 + 0.04 * k as f32);
            let (_, e) = fit_group(&targets[g], s);
            if e < best.0 {
                best = (e, s);
            }
        }
        group_s[g] = best.1;
    }
    let max_s = group_s.iter().fold(0.0f32, |m, &v| if v > m { v } else { m });
    if max_s == 0.0 {
        return b;
    }
    b.d = f32_to_f16(max_s / 7.75);
    let d = f16_to_f32(b.d);
    if d == 0.0 {
        b.d = 0;
        return b;
    }
    for g in 0..8 {
        let ls = nearest_int((4.0 * group_s[g] / d - 1.0) * 0.5).clamp(0, 15) as u32;
        let db = d * (0.5 + ls as f32) * 0.5;
        let (idx, _) = fit_group(&targets[g], db);
        b.qs[8 * g..8 * g + 8].copy_from_slice(&idx);
        let mut aux = ls << 28;
        for l in 0..4 {
            aux |= ((sign_bits[g][l] & 127) as u32) << (7 * l);
        }
        b.qs[64 + 4 * g..64 + 4 * g + 4].copy_from_slice(&aux.to_le_bytes());
    }
    b
}

/// `ggml_vec_dot_iq3_xxs_q8_K` (generic) for one block pair:
/// `0.25 * d*da * Σ_groups (2*ls+1) * Σ ±grid·a` (integer inside the block).
pub fn vec_dot_ref(w: &BlockIQ3XXS, a: &BlockQ8K) -> f32 {
    let mut bsum = 0i32;
    for ib32 in 0..8 {
        let aux = scales_and_signs(w, ib32);
        let ls = 2 * (aux >> 28) as i32 + 1;
        let mut sumi = 0i32;
        for l in 0..4 {
            let signs = ksigns(aux >> (7 * l));
            let g1 = grid(w.qs[8 * ib32 + 2 * l]);
            let g2 = grid(w.qs[8 * ib32 + 2 * l + 1]);
            let o = 32 * ib32 + 8 * l;
            for j in 0..4 {
                let p1 = g1[j] as i32 * a.qs[o + j] as i32;
                let p2 = g2[j] as i32 * a.qs[o + j + 4] as i32;
                sumi += if signs & (1 << j) != 0 { -p1 } else { p1 };
                sumi += if signs & (1 << (j + 4)) != 0 { -p2 } else { p2 };
            }
        }
        bsum += sumi * ls;
    }
    0.25 * ((f16_to_f32(w.d) * a.d()) * bsum as f32)
}
