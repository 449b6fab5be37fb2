//! Q5_1: 32 weights per block, `x = d * q + m` with 5-bit `q`. Pairs with Q8_1.
//!
//! Layout (24 bytes): `d: f16`, `m: f16`, `qh: [u8; 4]`, `qs: [u8; 16]` (bits as in Q5_0).

use crate::GgmlType;
use crate::block::impl_block;
use crate::half::{f16_to_f32, f32_to_f16};
use crate::q5_0::quant5;
use crate::q8_1::BlockQ8_1;

/// Elements per block.
pub const QK5_1: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_1 {
    /// Scale (f16 bits).
    pub d: u16,
    /// Minimum (f16 bits).
    pub m: u16,
    /// High bits, little-endian u32.
    pub qh: [u8; 4],
    pub qs: [u8; QK5_1 / 2],
}
impl_block!(BlockQ5_1, GgmlType::Q5_1, QK5_1);

/// `dequantize_row_q5_1` for one block: `y = q*d + m`.
pub fn dequantize_ref(b: &BlockQ5_1, y: &mut [f32; QK5_1]) {
    let d = f16_to_f32(b.d);
    let m = f16_to_f32(b.m);
    let qh = u32::from_le_bytes(b.qh);
    for (i, o) in y.iter_mut().enumerate() {
        *o = quant5(&b.qs, qh, i) as f32 * d + m;
    }
}

/// `quantize_row_q5_1_ref` for one block: `d = (max-min)/31`, `q = trunc((x-min)/d + 0.5)`.
pub fn quantize_ref(x: &[f32; QK5_1]) -> BlockQ5_1 {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        let q0 = ((x[j] - min) * id + 0.5) as u8;
        let q1 = ((x[j + 16] - min) * id + 0.5) as u8;
        qs[j] = (q0 & 0xf) | ((q1 & 0xf) << 4);
        qh |= ((q0 as u32 >> 4) & 1) << j;
        qh |= ((q1 as u32 >> 4) & 1) << (j + 16);
    }
    BlockQ5_1 { d: f32_to_f16(d), m: f32_to_f16(min), qh: qh.to_le_bytes(), qs }
}

/// `ggml_vec_dot_q5_1_q8_1` (generic): `(dw*da)*sumi + mw*sa`.
pub fn vec_dot_ref(w: &BlockQ5_1, a: &BlockQ8_1) -> f32 {
    let qh = u32::from_le_bytes(w.qh);
    let mut s = 0i32;
    for j in 0..32 {
        s += quant5(&w.qs, qh, j) * a.qs[j] as i32;
    }
    (f16_to_f32(w.d) * f16_to_f32(a.d)) * s as f32 + f16_to_f32(w.m) * f16_to_f32(a.s)
}
