//! IQ4_NL: 32 weights per block, `x = d * K[q]` with a 4-bit index into the fixed non-linear
//! table [`KVALUES_IQ4NL`]. Pairs with Q8_0.
//!
//! Layout (18 bytes): `d: f16`, `qs: [u8; 16]` (nibbles as in Q4_0).

use crate::GgmlType;
use crate::block::impl_block;
use crate::half::{f16_to_f32, f32_to_f16};
use crate::q8_0::BlockQ8_0;
use crate::util::{GROUP_MAX_EPS, fabsf};

/// Elements per block.
pub const QK4_NL: usize = 32;

/// The 16 non-linear levels (ggml's `kvalues_iq4nl`), ascending.
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ4NL {
    /// Scale (f16 bits).
    pub d: u16,
    pub qs: [u8; QK4_NL / 2],
}
impl_block!(BlockIQ4NL, GgmlType::IQ4NL, QK4_NL);

/// `dequantize_row_iq4_nl` for one block.
pub fn dequantize_ref(b: &BlockIQ4NL, y: &mut [f32; QK4_NL]) {
    let d = f16_to_f32(b.d);
    for j in 0..16 {
        y[j] = d * KVALUES_IQ4NL[(b.qs[j] & 0xf) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(b.qs[j] >> 4) as usize] as f32;
    }
}

/// Index of the level nearest to `x` (ggml's `best_index_int8`; ties go to the upper level).
#[inline]
pub fn best_index(x: f32) -> usize {
    let v = &KVALUES_IQ4NL;
    if x <= v[0] as f32 {
        return 0;
    }
    if x >= v[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (v[mu - 1] as f32) < v[mu] as f32 - x { mu - 1 } else { mu }
}

/// `quantize_row_iq4_nl_ref` for one block (ggml's `quantize_row_iq4_nl_impl` with one 32-wide
/// block, no importance weights, i.e. weights `x²`, and `ntry = 7`): start from
/// `d = -max/127`, refine by least squares, try 15 alternative scales, then requantize with
/// the chosen scale.
pub fn quantize_ref(x: &[f32; QK4_NL]) -> BlockIQ4NL {
    let mut weight = [0.0f32; QK4_NL];
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for j in 0..QK4_NL {
        weight[j] = x[j] * x[j];
        let ax = fabsf(x[j]);
        if ax > amax {
            amax = ax;
            max = x[j];
        }
    }
    let mut b = BlockIQ4NL { d: 0, qs: [0; 16] };
    if amax < GROUP_MAX_EPS {
        return b; // ggml leaves d = 0 and all indices 0
    }
    let ntry = 7i32;
    let v0 = KVALUES_IQ4NL[0] as f32;
    let fit = |id: f32| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for j in 0..QK4_NL {
            let q = KVALUES_IQ4NL[best_index(id * x[j])] as f32;
            let w = weight[j];
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let mut d = -max / v0;
    let (sumqx, sumq2) = fit(1.0 / d);
    d = sumqx / sumq2;
    let mut best = d * sumqx;
    for itry in -ntry..=ntry {
        let id = (itry as f32 + v0) / max;
        let (sumqx, sumq2) = fit(id);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    b.d = f32_to_f16(d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for j in 0..16 {
        let lo = best_index(id * x[j]) as u8;
        let hi = best_index(id * x[j + 16]) as u8;
        b.qs[j] = lo | (hi << 4);
    }
    b
}

/// `ggml_vec_dot_iq4_nl_q8_0` (generic) for one block pair: `(da*dw) * Σ K[q]·a`.
pub fn vec_dot_ref(w: &BlockIQ4NL, a: &BlockQ8_0) -> f32 {
    let (mut s1, mut s2) = (0i32, 0i32);
    for j in 0..16 {
        s1 += a.qs[j] as i32 * KVALUES_IQ4NL[(w.qs[j] & 0xf) as usize] as i32;
        s2 += a.qs[j + 16] as i32 * KVALUES_IQ4NL[(w.qs[j] >> 4) as usize] as i32;
    }
    (f16_to_f32(a.d) * f16_to_f32(w.d)) * (s1 + s2) as f32
}
