//! Q8_1: like Q8_0 plus `s = d * sum(q)` so that formats with a min (Q4_1, Q5_1) can add
//! `m * sum(activations)` without touching the quants. Activation format of Q4_1/Q5_1.
//!
//! Layout (36 bytes): `d: f16`, `s: f16`, `qs: [i8; 32]`.

use crate::GgmlType;
use crate::block::impl_block;
use crate::half::{f16_to_f32, f32_to_f16};
use crate::util::{fabsf, roundf_i32};

/// Elements per block.
pub const QK8_1: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_1 {
    /// Scale (f16 bits).
    pub d: u16,
    /// `d * sum(qs)` (f16 bits), computed from the f32 `d`.
    pub s: u16,
    pub qs: [i8; QK8_1],
}
impl_block!(BlockQ8_1, GgmlType::Q8_1, QK8_1);

/// `y = q * d` (ggml has no dequantize for Q8_1; this is the obvious one).
pub fn dequantize_ref(b: &BlockQ8_1, y: &mut [f32; QK8_1]) {
    let d = f16_to_f32(b.d);
    for (o, &q) in y.iter_mut().zip(b.qs.iter()) {
        *o = q as f32 * d;
    }
}

/// `quantize_row_q8_1_ref` for one block: as Q8_0, plus `s = f16(sum(q) * d)`.
pub fn quantize_ref(x: &[f32; QK8_1]) -> BlockQ8_1 {
    let mut amax = 0.0f32;
    for &v in x {
        let a = fabsf(v);
        amax = if amax > a { amax } else { a };
    }
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK8_1];
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x.iter()) {
        *q = roundf_i32(v * id) as i8;
        sum += *q as i32;
    }
    BlockQ8_1 { d: f32_to_f16(d), s: f32_to_f16(sum as f32 * d), qs }
}

/// Q8_1 · Q8_1 (not a ggml kernel; provided so every type has a `vec_dot`).
pub fn vec_dot_ref(w: &BlockQ8_1, a: &BlockQ8_1) -> f32 {
    crate::q8_0::dot_qs(&w.qs, &a.qs) as f32 * (f16_to_f32(w.d) * f16_to_f32(a.d))
}
