//! Q5_K: as Q4_K with a 5th bit per weight. Pairs with Q8_K.
//!
//! Layout (176 bytes): `d: f16`, `dmin: f16`, `scales: [u8; 12]` (as Q4_K), `qh: [u8; 32]`,
//! `qs: [u8; 128]` (low nibbles as Q4_K). The high bit of weight `64c + l` is bit `2c` of
//! `qh[l]`, of weight `64c + 32 + l` bit `2c + 1`.

use crate::block::impl_block;
use crate::half::f16_to_f32;
use crate::q4_k::{dot_k4_unpacked, get_scale_min_k4, quantize_k4_common};
use crate::q8_k::BlockQ8K;
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
impl_block!(BlockQ5K, GgmlType::Q5K, QK_K);

/// The 5-bit quants (0..=31) of a block in element order.
pub fn unpack(b: &BlockQ5K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for c in 0..4 {
        for l in 0..32 {
            let ql = b.qs[32 * c + l];
            let h = b.qh[l];
            q[64 * c + l] = (ql & 0xf) | (((h >> (2 * c)) & 1) << 4);
            q[64 * c + 32 + l] = (ql >> 4) | (((h >> (2 * c + 1)) & 1) << 4);
        }
    }
    q
}

/// `dequantize_row_q5_K` for one block.
pub fn dequantize_ref(b: &BlockQ5K, y: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d);
    let min = f16_to_f32(b.dmin);
    let q = unpack(b);
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &b.scales);
        let (dj, mj) = (d * sc as f32, min * m as f32);
        for i in 32 * j..32 * j + 32 {
            y[i] = dj * q[i] as f32 - mj;
        }
    }
}

/// `quantize_row_q5_K_ref` for one block.
pub fn quantize_ref(x: &[f32; QK_K]) -> BlockQ5K {
    let (d, dmin, scales, l) = quantize_k4_common(x, 31, -0.5, 0.1, 15);
    let mut b = BlockQ5K { d, dmin, scales, qh: [0; QK_K / 8], qs: [0; QK_K / 2] };
    for c in 0..4 {
        for j in 0..32 {
            let l1 = l[64 * c + j];
            let l2 = l[64 * c + 32 + j];
            b.qh[j] |= ((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1));
            b.qs[32 * c + j] = (l1 & 0xf) | ((l2 & 0xf) << 4);
        }
    }
    b
}

/// `ggml_vec_dot_q5_K_q8_K` (generic) for one block pair.
pub fn vec_dot_ref(w: &BlockQ5K, a: &BlockQ8K) -> f32 {
    dot_k4_unpacked(w.d, w.dmin, &w.scales, &unpack(w), a)
}
