//! Q8_0: 32 weights per block, `x = d * q` with an f16 scale and signed 8-bit quants.
//! Also the activation format paired with Q4_0, Q5_0, Q8_0 and IQ4_NL.
//!
//! Layout (34 bytes): `d: f16`, `qs: [i8; 32]`.

use crate::GgmlType;
use crate::block::impl_block;
use crate::half::{f16_to_f32, f32_to_f16};
use crate::util::{fabsf, roundf_i32};

/// Elements per block.
pub const QK8_0: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_0 {
    /// Scale (f16 bits).
    pub d: u16,
    pub qs: [i8; QK8_0],
}
impl_block!(BlockQ8_0, GgmlType::Q8_0, QK8_0);

/// Dequantize one element (what a GPU thread computes).
#[inline(always)]
pub fn dequant_one(b: &BlockQ8_0, i: usize) -> f32 {
    b.qs[i % QK8_0] as f32 * f16_to_f32(b.d)
}

/// `dequantize_row_q8_0` for one block: `y = q * d`.
pub fn dequantize_ref(b: &BlockQ8_0, y: &mut [f32; QK8_0]) {
    let d = f16_to_f32(b.d);
    for (o, &q) in y.iter_mut().zip(b.qs.iter()) {
        *o = q as f32 * d;
    }
}

/// `quantize_row_q8_0_ref` for one block: `d = amax/127`, `q = roundf(x/d)` (half away from
/// zero). The scale used for rounding is the f32 `d`, not its f16 rounding, as in ggml.
pub fn quantize_ref(x: &[f32; QK8_0]) -> BlockQ8_0 {
    let mut amax = 0.0f32;
    for &v in x {
        let a = fabsf(v);
        amax = if amax > a { amax } else { a };
    }
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK8_0];
    for (q, &v) in qs.iter_mut().zip(x.iter()) {
        *q = roundf_i32(v * id) as i8;
    }
    BlockQ8_0 { d: f32_to_f16(d), qs }
}

/// Integer dot of the quants (exact).
#[inline]
pub fn dot_qs(a: &[i8; QK8_0], b: &[i8; QK8_0]) -> i32 {
    let mut s = 0i32;
    for j in 0..QK8_0 {
        s += a[j] as i32 * b[j] as i32;
    }
    s
}

/// `ggml_vec_dot_q8_0_q8_0` (generic) for one block pair: `sumi * (dw * da)`.
pub fn vec_dot_ref(w: &BlockQ8_0, a: &BlockQ8_0) -> f32 {
    dot_qs(&w.qs, &a.qs) as f32 * (f16_to_f32(w.d) * f16_to_f32(a.d))
}
