//! Q6_K weights x Q8_K activations in the float order of ggml's AVX2 `ggml_vec_dot_q6_K_q8_K`:
//! per super-block eight i32 lanes (lane L sums quants 4L..4L+3 of every 32-quant group, each
//! weighted by its 16-quant scale, minus 32 x the scale-weighted block sums of 16-groups 2L and
//! 2L+1), converted to f32 and accumulated by FMA with `d_a * d_w`; lanes reduced like
//! `hsum_float_8`. Scalar: the order, not the speed, is the point.

use super::common::hsum8;
use crate::acts::Acts;
use crate::tensor::QTensor;

/// # Safety
/// The [`crate::tensor::RowsFn`] contract.
pub(crate) unsafe fn rows(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    let nb = w.cols / 256;
    let mut q6 = vec![0i32; 256];
    for r in r0..r1 {
        let row = &w.data[r * rb..(r + 1) * rb];
        for c in 0..a.n {
            let act = &a.raw[c * a.raw_row..(c + 1) * a.raw_row];
            let mut acc = [0f32; 8];
            for ib in 0..nb {
                let b = &row[ib * 210..(ib + 1) * 210];
                let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
                let dw = quant::f16_to_f32(u16::from_le_bytes([b[208], b[209]]));
                for n in 0..2 {
                    for l in 0..32 {
                        let (l0, l1, h) = (ql[n * 64 + l], ql[n * 64 + l + 32], qh[n * 32 + l]);
                        q6[n * 128 + l] = ((l0 & 0xf) | ((h & 3) << 4)) as i32;
                        q6[n * 128 + l + 32] = ((l1 & 0xf) | (((h >> 2) & 3) << 4)) as i32;
                        q6[n * 128 + l + 64] = ((l0 >> 4) | (((h >> 4) & 3) << 4)) as i32;
                        q6[n * 128 + l + 96] = ((l1 >> 4) | (((h >> 6) & 3) << 4)) as i32;
                    }
                }
                let ab = &act[ib * 292..(ib + 1) * 292];
                let da = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
                let q8 = &ab[4..260];
                let bsum = |i: usize| i16::from_le_bytes([ab[260 + 2 * i], ab[261 + 2 * i]]) as i32;
                let d = da * dw;
                for lane in 0..8 {
                    let mut s = 0i32;
                    for g in 0..8 {
                        for t in 0..4 {
                            let e = g * 32 + 4 * lane + t;
                            s += (sc[e / 16] as i8 as i32) * q6[e] * (q8[e] as i8 as i32);
                        }
                    }
                    s -= 32
                        * (bsum(2 * lane) * (sc[2 * lane] as i8 as i32)
                            + bsum(2 * lane + 1) * (sc[2 * lane + 1] as i8 as i32));
                    acc[lane] = d.mul_add(s as f32, acc[lane]);
                }
            }
            // SAFETY: (c, r) is inside the output and only this task writes row r.
            unsafe { *y.add(c * w.rows + r) = hsum8(&acc) };
        }
    }
}
