//! Q4_1: 32 weights per block, `x = d * q + m` with 4-bit `q`. Pairs with Q8_1 activations
//! (whose `s` supplies `sum(activations)` for the `m` term).
//!
//! Layout (20 bytes): `d: f16`, `m: f16`, `qs: [u8; 16]` (nibbles as in Q4_0).

use crate::GgmlType;
use crate::block::impl_block;
use crate::half::{f16_to_f32, f32_to_f16};
use crate::q8_1::BlockQ8_1;

/// Elements per block.
pub const QK4_1: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_1 {
    /// Scale (f16 bits).
    pub d: u16,
    /// Minimum (f16 bits).
    pub m: u16,
    pub qs: [u8; QK4_1 / 2],
}
impl_block!(BlockQ4_1, GgmlType::Q4_1, QK4_1);

/// `dequantize_row_q4_1` for one block: `y = q*d + m`.
pub fn dequantize_ref(b: &BlockQ4_1, y: &mut [f32; QK4_1]) {
    let d = f16_to_f32(b.d);
    let m = f16_to_f32(b.m);
    for j in 0..16 {
        y[j] = (b.qs[j] & 0xf) as f32 * d + m;
        y[j + 16] = (b.qs[j] >> 4) as f32 * d + m;
    }
}

/// `quantize_row_q4_1_ref` for one block: `d = (max-min)/15`, `m = min`,
/// `q = min(15, trunc((x-min)/d + 0.5))`.
pub fn quantize_ref(x: &[f32; QK4_1]) -> BlockQ4_1 {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; 16];
    for j in 0..16 {
        let x0 = (x[j] - min) * id;
        let x1 = (x[j + 16] - min) * id;
        let q0 = ((x0 + 0.5) as i8).min(15) as u8;
        let q1 = ((x1 + 0.5) as i8).min(15) as u8;
        qs[j] = q0 | (q1 << 4);
    }
    BlockQ4_1 { d: f32_to_f16(d), m: f32_to_f16(min), qs }
}

/// `ggml_vec_dot_q4_1_q8_1` (generic): `(dw*da)*sumi + mw*sa`.
pub fn vec_dot_ref(w: &BlockQ4_1, a: &BlockQ8_1) -> f32 {
    let (mut s0, mut s1) = (0i32, 0i32);
    for j in 0..16 {
        s0 += (w.qs[j] & 0xf) as i32 * a.qs[j] as i32;
        s1 += (w.qs[j] >> 4) as i32 * a.qs[j + 16] as i32;
    }
    (f16_to_f32(w.d) * f16_to_f32(a.d)) * (s0 + s1) as f32 + f16_to_f32(w.m) * f16_to_f32(a.s)
}
