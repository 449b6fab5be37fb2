//! Q6_K: 256 weights per super-block in 16 sub-blocks of 16; `x = d * sc_j * (q - 32)` with
//! 6-bit `q` and signed 8-bit sub-block scales. Pairs with Q8_K.
//!
//! Layout (210 bytes): `ql: [u8; 128]` (low 4 bits), `qh: [u8; 64]` (high 2 bits),
//! `scales: [i8; 16]`, `d: f16`. Per half `h` (128 weights), with `ql`/`qh` offset by
//! 64h/32h: weight `l` (< 32) = low nibble of `ql[l]` | bits 0-1 of `qh[l]`; `l+32` = low
//! nibble of `ql[l+32]` | bits 2-3; `l+64` = high nibble of `ql[l]` | bits 4-5; `l+96` = high
//! nibble of `ql[l+32]` | bits 6-7.

use crate::block::impl_block;
use crate::half::{f16_to_f32, f32_to_f16};
use crate::q8_k::BlockQ8K;
use crate::util::{GROUP_MAX_EPS, fabsf, make_qx_quants_rmse1, nearest_int};
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    /// Super-block scale (f16 bits).
    pub d: u16,
}
impl_block!(BlockQ6K, GgmlType::Q6K, QK_K);

/// The signed quants (−32..=31) in element order.
pub fn unpack(b: &BlockQ6K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for h in 0..2 {
        let (ql, qh) = (&b.ql[64 * h..64 * h + 64], &b.qh[32 * h..32 * h + 32]);
        let y = &mut q[128 * h..128 * h + 128];
        for l in 0..32 {
            y[l] = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i8 - 32;
            y[l + 32] = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            y[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            y[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    q
}

/// `dequantize_row_q6_K` for one block: `y = (d * sc) * q`.
pub fn dequantize_ref(b: &BlockQ6K, y: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d);
    let q = unpack(b);
    for (i, o) in y.iter_mut().enumerate() {
        *o = d * b.scales[i / 16] as f32 * q[i] as f32;
    }
}

/// `quantize_row_q6_K_ref` for one block.
pub fn quantize_ref(x: &[f32; QK_K]) -> BlockQ6K {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        let s = make_qx_quants_rmse1(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = s;
        if fabsf(s) > max_abs_scale {
            max_abs_scale = fabsf(s);
            max_scale = s;
        }
    }
    let mut b = BlockQ6K { ql: [0; QK_K / 2], qh: [0; QK_K / 4], scales: [0; 16], d: 0 };
    if max_abs_scale < GROUP_MAX_EPS {
        return b;
    }
    let iscale = -128.0 / max_scale;
    b.d = f32_to_f16(1.0 / iscale);
    for ib in 0..16 {
        b.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
    }
    for j in 0..16 {
        let d = f16_to_f32(b.d) * b.scales[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
            l[16 * j + ii] = (q + 32) as u8;
        }
    }
    for h in 0..2 {
        let lh = &l[128 * h..128 * h + 128];
        for i in 0..32 {
            let (q1, q2, q3, q4) = (lh[i], lh[i + 32], lh[i + 64], lh[i + 96]);
            b.ql[64 * h + i] = (q1 & 0xf) | ((q3 & 0xf) << 4);
            b.ql[64 * h + i + 32] = (q2 & 0xf) | ((q4 & 0xf) << 4);
            b.qh[32 * h + i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    b
}

/// `ggml_vec_dot_q6_K_q8_K` (generic) for one block pair: `d*da * Σ_j sc_j Σ q·a`.
pub fn vec_dot_ref(w: &BlockQ6K, a: &BlockQ8K) -> f32 {
    let q = unpack(w);
    let mut isum = 0i32;
    for j in 0..16 {
        let mut s = 0i32;
        for i in 16 * j..16 * j + 16 {
            s += q[i] as i32 * a.qs[i] as i32;
        }
        isum += w.scales[j] as i32 * s;
    }
    (f16_to_f32(w.d) * a.d()) * isum as f32
}
