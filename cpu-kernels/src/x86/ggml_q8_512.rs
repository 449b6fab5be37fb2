//! AVX-512 version of `ggml_q8` (Q8_0 / Q5_0 weights x x86-rounded Q8_0 activations), bit for
//! bit the same results: for every (row, column) the same eight f32 lanes, lane `l` of block
//! `b` = the exact integer `Σ_{t<4} w[4l+t]·a[4l+t]`, accumulated by one FMA per block with
//! `d_w·d_a`, and reduced like `hsum_float_8` at the end. Only the way the integer lane sums
//! are formed differs (integers are exact in any order):
//! * one zmm holds two weight rows (lanes 0-7 row r, 8-15 row r+1), the 32 activation quants
//!   of the block are broadcast to both halves;
//! * activations are stored biased to u8 (`a + 128`, `Acts::perm`) so `vpdpbusd` multiplies
//!   them with the signed weights; the accumulator starts at `-128·Σw` per lane (itself a
//!   `vpdpbusd` of ones with the weights), so the lane sum is exactly `Σ w·a`;
//! * a tile is 2 row pairs x up to 4 columns (8 accumulators): each weight block is decoded
//!   once per 4 columns, each activation block loaded once per 4 rows.
#![allow(unsafe_op_in_unsafe_fn)]

use core::arch::x86_64::*;

use crate::acts::Acts;
use crate::QTensor;
use quant::GgmlType;

const ROWS_PER_TILE: usize = 4;
const COLS_PER_TILE: usize = 4;

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn h2f(p: *const u8) -> f32 {
    let h = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// The 32 signed quants of one weight block.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn quants<const Q5: bool>(b: *const u8) -> __m256i {
    if Q5 {
        // Q5_0: d, qh (u32), 16 bytes of nibbles; element j uses bit j of qh as its 5th bit.
        let qh = (b.add(2) as *const u32).read_unaligned();
        let x = _mm_loadu_si128(b.add(6).cast());
        let nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), _mm256_set1_epi8(0x0F));
        // (nib | bit << 4) - 16 == nib - 16 where the bit is clear.
        _mm256_mask_sub_epi8(nib, !qh, nib, _mm256_set1_epi8(16))
    } else {
        _mm256_loadu_si256(b.add(2).cast())
    }
}

/// `hsum_float_8` of lanes `8h..8h+8`: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
#[inline]
fn hsum_half(v: &[f32; 16], h: usize) -> f32 {
    let l = &v[8 * h..8 * h + 8];
    let r = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// One tile: `P` row pairs (`rows[2p]`, `rows[2p+1]`; duplicates allowed for padding) x `C`
/// columns starting at `c0`. Returns the accumulators.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn tile<const Q5: bool, const P: usize, const C: usize>(
    w: &QTensor,
    rb: usize,
    a: &Acts,
    rows: [usize; ROWS_PER_TILE],
    c0: usize,
) -> [[__m512; C]; P] {
    let k = w.cols;
    let nb = k / 32;
    let bs = if Q5 { 22 } else { 34 };
    let ones = _mm512_set1_epi8(1);
    let zero = _mm512_setzero_si512();
    let mut acc = [[_mm512_setzero_ps(); C]; P];
    let base = w.data.as_ptr();
    let mut rp = [base; ROWS_PER_TILE];
    for (i, &r) in rows.iter().enumerate().take(2 * P) {
        rp[i] = base.add(r * rb);
    }
    let act = a.perm.as_ptr();
    let ad = a.d.as_ptr();
    for ib in 0..nb {
        let mut wv = [zero; P];
        let mut corr = [zero; P];
        let mut wd = [_mm512_setzero_ps(); P];
        for p in 0..P {
            let (b0, b1) = (rp[2 * p].add(ib * bs), rp[2 * p + 1].add(ib * bs));
            let v = _mm512_inserti64x4(_mm512_castsi256_si512(quants::<Q5>(b0)), quants::<Q5>(b1), 1);
            wv[p] = v;
            let sw = _mm512_dpbusd_epi32(zero, ones, v);
            corr[p] = _mm512_sub_epi32(zero, _mm512_slli_epi32(sw, 7));
            wd[p] = _mm512_mask_mov_ps(_mm512_set1_ps(h2f(b0)), 0xFF00, _mm512_set1_ps(h2f(b1)));
        }
        for c in 0..C {
            let col = c0 + c;
            let av = _mm512_broadcast_i64x4(_mm256_loadu_si256(act.add(col * k + ib * 32).cast()));
            let da = _mm512_set1_ps(*ad.add(col * nb + ib));
            for p in 0..P {
                let s = _mm512_dpbusd_epi32(corr[p], av, wv[p]);
                let d = _mm512_mul_ps(wd[p], da);
                acc[p][c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[p][c]);
            }
        }
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn run_tile<const Q5: bool, const P: usize, const C: usize>(
    w: &QTensor,
    rb: usize,
    a: &Acts,
    rows: [usize; ROWS_PER_TILE],
    n_rows: usize,
    c0: usize,
    y: *mut f32,
) {
    let acc = tile::<Q5, P, C>(w, rb, a, rows, c0);
    let mut lanes = [0f32; 16];
    for p in 0..P {
        for c in 0..C {
            _mm512_storeu_ps(lanes.as_mut_ptr(), acc[p][c]);
            for h in 0..2 {
                let i = 2 * p + h;
                if i < n_rows {
                    *y.add((c0 + c) * w.rows + rows[i]) = hsum_half(&lanes, h);
                }
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_impl<const Q5: bool>(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    // Columns in blocks whose activations stay in L2 while the row tiles sweep over them.
    let cb = super::col_block(w.cols, 1).max(COLS_PER_TILE);
    let mut cs = 0;
    while cs < a.n {
        let ce = (cs + cb).min(a.n);
        let mut r = r0;
        while r < r1 {
            let m = (r1 - r).min(ROWS_PER_TILE);
            // Pad with the last row (its duplicate results are not stored).
            let rows: [usize; ROWS_PER_TILE] = core::array::from_fn(|i| r + i.min(m - 1));
            let mut c = cs;
            while c < ce {
                let nc = (ce - c).min(COLS_PER_TILE);
                macro_rules! go {
                    ($p:literal) => {
                        match nc {
                            4 => run_tile::<Q5, $p, 4>(w, rb, a, rows, m, c, y),
                            3 => run_tile::<Q5, $p, 3>(w, rb, a, rows, m, c, y),
                            2 => run_tile::<Q5, $p, 2>(w, rb, a, rows, m, c, y),
                            _ => run_tile::<Q5, $p, 1>(w, rb, a, rows, m, c, y),
                        }
                    };
                }
                if m > 2 {
                    go!(2)
                } else {
                    go!(1)
                }
                c += nc;
            }
            r += m;
        }
        cs = ce;
    }
}

/// # Safety
/// The [`crate::matmul::RowsFn`] contract, AVX-512 F/BW/VL/VNNI present, and `a.perm` / `a.d`
/// filled by [`prepare`].
pub(crate) unsafe fn rows(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    if w.ty == GgmlType::Q5_0 {
        rows_impl::<true>(w, rb, a, r0, r1, y)
    } else {
        rows_impl::<false>(w, rb, a, r0, r1, y)
    }
}

/// Fills `a.perm` (quants + 128 as u8, column-major `[n][cols]`) and `a.d` (f32 block scales,
/// `[n][cols/32]`) from the Q8_0 blocks in `a.raw`.
pub(crate) fn prepare(a: &mut Acts) {
    let nblocks = a.raw.len() / 34;
    a.perm.clear();
    a.perm.reserve(nblocks * 32);
    a.d.clear();
    a.d.reserve(nblocks);
    for b in a.raw.chunks_exact(34) {
        a.d.push(quant::f16_to_f32(u16::from_le_bytes([b[0], b[1]])));
        a.perm.extend(b[2..34].iter().map(|&q| (q ^ 0x80) as i8));
    }
}
