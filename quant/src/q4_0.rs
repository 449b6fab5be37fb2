//! Q4_0: 32 weights per block, `x = d * (q - 8)` with 4-bit `q`. Pairs with Q8_0 activations.
//!
//! Layout (18 bytes): `d: f16`, `qs: [u8; 16]`; element `j` (< 16) is the low nibble of
//! `qs[j]`, element `j + 16` the high nibble.

use crate::GgmlType;
use crate::block::impl_block;
use crate::half::{f16_to_f32, f32_to_f16};
use crate::q8_0::BlockQ8_0;
use crate::util::fabsf;

/// Elements per block.
pub const QK4_0: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_0 {
    /// Scale (f16 bits).
    pub d: u16,
    pub qs: [u8; QK4_0 / 2],
}
impl_block!(BlockQ4_0, GgmlType::Q4_0, QK4_0);

/// The signed quant of element `i` (−8..=7).
#[inline(always)]
pub fn quant(b: &BlockQ4_0, i: usize) -> i32 {
    let byte = b.qs[i % 16];
    let nib = if i % 32 < 16 { byte & 0xf } else { byte >> 4 };
    nib as i32 - 8
}

/// `dequantize_row_q4_0` for one block.
pub fn dequantize_ref(b: &BlockQ4_0, y: &mut [f32; QK4_0]) {
    let d = f16_to_f32(b.d);
    for j in 0..QK4_0 / 2 {
        y[j] = ((b.qs[j] & 0xf) as i32 - 8) as f32 * d;
        y[j + 16] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// `quantize_row_q4_0_ref` for one block: `d = max / -8` where `max` is the value of largest
/// magnitude (sign kept, so it maps to −8 exactly), `q = min(15, trunc(x/d + 8.5))`.
pub fn quantize_ref(x: &[f32; QK4_0]) -> BlockQ4_0 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < fabsf(v) {
            amax = fabsf(v);
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; 16];
    for j in 0..16 {
        let x0 = x[j] * id;
        let x1 = x[j + 16] * id;
        let q0 = ((x0 + 8.5) as i8).min(15) as u8;
        let q1 = ((x1 + 8.5) as i8).min(15) as u8;
        qs[j] = q0 | (q1 << 4);
    }
    BlockQ4_0 { d: f32_to_f16(d), qs }
}

/// `ggml_vec_dot_q4_0_q8_0` (generic) for one block pair: `sumi * dw * da`.
pub fn vec_dot_ref(w: &BlockQ4_0, a: &BlockQ8_0) -> f32 {
    let (mut s0, mut s1) = (0i32, 0i32);
    for j in 0..16 {
        s0 += ((w.qs[j] & 0xf) as i32 - 8) * a.qs[j] as i32;
        s1 += ((w.qs[j] >> 4) as i32 - 8) * a.qs[j + 16] as i32;
    }
    (s0 + s1) as f32 * f16_to_f32(w.d) * f16_to_f32(a.d)
}
