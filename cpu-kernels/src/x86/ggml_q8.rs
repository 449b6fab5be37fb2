//! Q8_0 / Q5_0 weights x Q8_0 activations in the exact float order of ggml's x86 kernels
//! (`ggml_vec_dot_q8_0_q8_0` / `ggml_vec_dot_q5_0_q8_0` for one column and llamafile's
//! `tinyBLAS_Q0_AVX` for batches, which share it): per block, eight i32 lanes each summing the
//! products of four consecutive quants, converted to f32 and accumulated with one FMA per lane by
//! `d_w * d_a`; the eight lanes are reduced at the end as `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
//! Models such as Gemma 3 are so sensitive to the last bit of their activations (a one-ulp
//! difference flips a later Q8 rounding) that matching llama.cpp's logits requires this order.

use core::arch::x86_64::*;

use crate::acts::Acts;
use crate::tensor::QTensor;
use quant::GgmlType;

/// f16 -> f32 with F16C (exact, like the software conversion).
#[inline(always)]
fn f16c(h: u16) -> f32 {
    // SAFETY: callers run inside `rows`, whose contract requires AVX2 (which implies F16C on
    // every CPU `has_avx2` accepts: it checks f16c explicitly).
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32))) }
}

/// Decodes one weight block to 32 signed quants and its scale.
#[inline(always)]
fn decode(ty: GgmlType, b: &[u8], q: &mut [i8; 32]) -> f32 {
    let d = f16c(u16::from_le_bytes([b[0], b[1]]));
    match ty {
        GgmlType::Q8_0 => {
            for (o, &v) in q.iter_mut().zip(&b[2..34]) {
                *o = v as i8;
            }
        }
        _ => {
            // Q5_0: d, qh (u32), 16 bytes of nibbles; element j uses bit j of qh as its 5th bit.
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for j in 0..16 {
                let lo = (b[6 + j] & 0x0f) as u32 | (((qh >> j) & 1) << 4);
                let hi = (b[6 + j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
                q[j] = lo as i8 - 16;
                q[j + 16] = hi as i8 - 16;
            }
        }
    }
    d
}

/// # Safety
/// The [`crate::tensor::RowsFn`] contract, plus AVX2 and FMA present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rows(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    let nb = w.cols / 32;
    let bs = w.ty.type_size();
    let mut wq = vec![0i8; w.cols];
    let mut wd = vec![0f32; nb];
    let ones = _mm256_set1_epi16(1);
    // Activation scales as f32 once per call (f16 -> f32 is exact).
    let ad: Vec<f32> = (0..a.n)
        .flat_map(|c| {
            let act = &a.raw[c * a.raw_row..(c + 1) * a.raw_row];
            (0..nb).map(move |ib| f16c(u16::from_le_bytes([act[ib * 34], act[ib * 34 + 1]])))
        })
        .collect();
    for r in r0..r1 {
        let row = &w.data[r * rb..(r + 1) * rb];
        for ib in 0..nb {
            let mut q = [0i8; 32];
            wd[ib] = decode(w.ty, &row[ib * bs..(ib + 1) * bs], &mut q);
            wq[ib * 32..ib * 32 + 32].copy_from_slice(&q);
        }
        for c in 0..a.n {
            let act = &a.raw[c * a.raw_row..(c + 1) * a.raw_row];
            let mut acc = _mm256_setzero_ps();
            for ib in 0..nb {
                let ab = &act[ib * 34..ib * 34 + 34];
                let da = ad[c * nb + ib];
                let d = _mm256_set1_ps(wd[ib] * da);
                // SAFETY: wq holds nb * 32 bytes and ab 34; unaligned loads.
                let (x, yv) = unsafe {
                    (_mm256_loadu_si256(wq.as_ptr().add(ib * 32).cast()), _mm256_loadu_si256(ab.as_ptr().add(2).cast()))
                };
                let ax = _mm256_sign_epi8(x, x);
                let sy = _mm256_sign_epi8(yv, x);
                let p16 = _mm256_maddubs_epi16(ax, sy);
                let p32 = _mm256_madd_epi16(p16, ones);
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p32), acc);
            }
            let hi = _mm256_extractf128_ps(acc, 1);
            let mut res = _mm_add_ps(hi, _mm256_castps256_ps128(acc));
            res = _mm_add_ps(res, _mm_movehl_ps(res, res));
            res = _mm_add_ss(res, _mm_movehdup_ps(res));
            // SAFETY: (c, r) is inside the n x rows output and only this task writes row r.
            unsafe { *y.add(c * w.rows + r) = _mm_cvtss_f32(res) };
        }
    }
}

/// Scalar version of [`rows`] (the same lanes, products and f32 operations, without SIMD):
/// the reference the SIMD kernels are tested against, and the path for CPUs without AVX2.
///
/// # Safety
/// The [`crate::tensor::RowsFn`] contract.
pub(crate) unsafe fn rows_scalar(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    let nb = w.cols / 32;
    let bs = w.ty.type_size();
    let mut wq = vec![0i8; w.cols];
    let mut wd = vec![0f32; nb];
    for r in r0..r1 {
        let row = &w.data[r * rb..(r + 1) * rb];
        for ib in 0..nb {
            let mut q = [0i8; 32];
            wd[ib] = quant::f16_to_f32(u16::from_le_bytes([row[ib * bs], row[ib * bs + 1]]));
            decode_q(w.ty, &row[ib * bs..(ib + 1) * bs], &mut q);
            wq[ib * 32..ib * 32 + 32].copy_from_slice(&q);
        }
        for c in 0..a.n {
            let act = &a.raw[c * a.raw_row..(c + 1) * a.raw_row];
            let mut acc = [0f32; 8];
            for ib in 0..nb {
                let ab = &act[ib * 34..ib * 34 + 34];
                let da = quant::f16_to_f32(u16::from_le_bytes([ab[0], ab[1]]));
                let d = wd[ib] * da;
                for (l, al) in acc.iter_mut().enumerate() {
                    let s: i32 = (0..4).map(|t| wq[ib * 32 + 4 * l + t] as i32 * ab[2 + 4 * l + t] as i8 as i32).sum();
                    *al = d.mul_add(s as f32, *al);
                }
            }
            // SAFETY: (c, r) is inside the n x rows output and only this task writes row r.
            unsafe { *y.add(c * w.rows + r) = super::common::hsum8(&acc) };
        }
    }
}

/// The 32 signed quants of a Q8_0 / Q5_0 block (without the f16 conversion).
fn decode_q(ty: GgmlType, b: &[u8], q: &mut [i8; 32]) {
    match ty {
        GgmlType::Q8_0 => q.iter_mut().zip(&b[2..34]).for_each(|(o, &v)| *o = v as i8),
        _ => {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for j in 0..16 {
                let lo = (b[6 + j] & 0x0f) as u32 | (((qh >> j) & 1) << 4);
                let hi = (b[6 + j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
                q[j] = lo as i8 - 16;
                q[j + 16] = hi as i8 - 16;
            }
        }
    }
}
