//! Q5_0: 32 weights per block, `x = d * (q - 16)` with 5-bit `q`. Pairs with Q8_0.
//!
//! Layout (22 bytes): `d: f16`, `qh: [u8; 4]` (little-endian u32; bit `j` is the 5th bit of
//! element `j`), `qs: [u8; 16]` (low nibbles as in Q4_0).

use crate::GgmlType;
use crate::block::impl_block;
use crate::half::{f16_to_f32, f32_to_f16};
use crate::q8_0::BlockQ8_0;
use crate::util::fabsf;

/// Elements per block.
pub const QK5_0: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_0 {
    /// Scale (f16 bits).
    pub d: u16,
    /// High bits, a little-endian u32 stored as bytes (keeps the block 2-byte aligned).
    pub qh: [u8; 4],
    pub qs: [u8; QK5_0 / 2],
}
impl_block!(BlockQ5_0, GgmlType::Q5_0, QK5_0);

/// The 5-bit quant (0..=31) of element `i`, before the −16 offset.
#[inline(always)]
pub fn quant5(qs: &[u8; 16], qh: u32, i: usize) -> i32 {
    let i = i % 32;
    let lo = if i < 16 { qs[i] & 0xf } else { qs[i - 16] >> 4 };
    (lo as i32) | ((((qh >> i) & 1) as i32) << 4)
}

/// `dequantize_row_q5_0` for one block.
pub fn dequantize_ref(b: &BlockQ5_0, y: &mut [f32; QK5_0]) {
    let d = f16_to_f32(b.d);
    let qh = u32::from_le_bytes(b.qh);
    for (i, o) in y.iter_mut().enumerate() {
        *o = (quant5(&b.qs, qh, i) - 16) as f32 * d;
    }
}

/// `quantize_row_q5_0_ref` for one block: `d = max / -16`, `q = min(31, trunc(x/d + 16.5))`.
pub fn quantize_ref(x: &[f32; QK5_0]) -> BlockQ5_0 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < fabsf(v) {
            amax = fabsf(v);
            max = v;
        }
    }
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        let q0 = ((x[j] * id + 16.5) as i8).min(31) as u8;
        let q1 = ((x[j + 16] * id + 16.5) as i8).min(31) as u8;
        qs[j] = (q0 & 0xf) | ((q1 & 0xf) << 4);
        qh |= ((q0 as u32 >> 4) & 1) << j;
        qh |= ((q1 as u32 >> 4) & 1) << (j + 16);
    }
    BlockQ5_0 { d: f32_to_f16(d), qh: qh.to_le_bytes(), qs }
}

/// `ggml_vec_dot_q5_0_q8_0` (generic): `(dw*da) * sumi`.
pub fn vec_dot_ref(w: &BlockQ5_0, a: &BlockQ8_0) -> f32 {
    let qh = u32::from_le_bytes(w.qh);
    let mut s = 0i32;
    for j in 0..32 {
        s += (quant5(&w.qs, qh, j) - 16) * a.qs[j] as i32;
    }
    (f16_to_f32(w.d) * f16_to_f32(a.d)) * s as f32
}
