//! Q4_K weights x Q8_K activations in the float order of ggml's x86 repacked Q4_K kernels
//! (`ggml_gemv_q4_K_8x8_q8_K` / `ggml_gemm_q4_K_8x8_q8_K`, used by llama.cpp for every Q4_K
//! matrix with a multiple of 8 rows on AVX2 CPUs): per super-block the exact integer sums
//! `Σ scale_s · (q4 · q8)_s` and `Σ min_s · bsum_s`, each converted to f32 and accumulated by
//! FMA with `d_w · d_a` and `dmin_w · d_a` into two accumulators, subtracted at the end.

use crate::acts::Acts;
use crate::tensor::QTensor;

#[inline]
fn scale_min(j: usize, q: &[u8]) -> (i32, i32) {
    if j < 4 {
        ((q[j] & 63) as i32, (q[j + 4] & 63) as i32)
    } else {
        (((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)) as i32, ((q[j + 4] >> 4) | ((q[j] >> 6) << 4)) as i32)
    }
}

/// # Safety
/// The [`crate::tensor::RowsFn`] contract.
pub(crate) unsafe fn rows(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    let nb = w.cols / 256;
    let mut q4 = [0i32; 256];
    for r in r0..r1 {
        let row = &w.data[r * rb..(r + 1) * rb];
        for c in 0..a.n {
            let act = &a.raw[c * a.raw_row..(c + 1) * a.raw_row];
            let (mut acc, mut accm) = (0f32, 0f32);
            let gemm = c < a.n - a.n % 4;
            for ib in 0..nb {
                let b = &row[ib * 144..(ib + 1) * 144];
                let dw = quant::f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                let dmin = quant::f16_to_f32(u16::from_le_bytes([b[2], b[3]]));
                let (sc, qs) = (&b[4..16], &b[16..144]);
                for j in 0..4 {
                    for l in 0..32 {
                        q4[64 * j + l] = (qs[32 * j + l] & 0xF) as i32;
                        q4[64 * j + 32 + l] = (qs[32 * j + l] >> 4) as i32;
                    }
                }
                let ab = &act[ib * 292..(ib + 1) * 292];
                let da = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
                let q8 = &ab[4..260];
                let bsum = |i: usize| i16::from_le_bytes([ab[260 + 2 * i], ab[261 + 2 * i]]) as i32;
                let (mut iacc, mut imin) = (0i32, 0i32);
                for s in 0..8 {
                    let (scv, mv) = scale_min(s, sc);
                    let dot: i32 = (0..32).map(|t| q4[32 * s + t] * (q8[32 * s + t] as i8 as i32)).sum();
                    iacc += scv * dot;
                    imin += mv * (bsum(2 * s) + bsum(2 * s + 1));
                    if gemm && s % 2 == 1 {
                        // The 4-row GEMM kernel applies the scales after every pair of sub-blocks.
                        acc = (iacc as f32).mul_add(dw * da, acc);
                        accm = (imin as f32).mul_add(dmin * da, accm);
                        iacc = 0;
                        imin = 0;
                    }
                }
                if !gemm {
                    acc = (iacc as f32).mul_add(dw * da, acc);
                    accm = (imin as f32).mul_add(dmin * da, accm);
                }
            }
            // SAFETY: (c, r) is inside the output and only this task writes row r.
            unsafe { *y.add(c * w.rows + r) = acc - accm };
        }
    }
}
