//! The row tiles of `gemm_q0` for fewer than `gemm_q0::MIN_COLS` columns (decode and
//! speculative windows) of Q4_1 weights, transposed in registers instead of through a scratch.
//!
//! Why: the pair kernels (`zmm`) pay a convert, two scale multiplies, an FMA and four lane
//! permutes per 64 weights of one row, which keeps a thread at ~15 GB/s on Q4_1: decode of a
//! small model is bound by instructions, not memory. A 16-row tile pays them once per block for
//! 16 rows. `gemm_q0` builds its tiles in a scratch (16 stores per row and block), which only
//! pays off over 16+ columns; here the tile is built in registers: per block, 16 row loads of
//! the 16 quant bytes (4 zmm of four rows each), a 4x4 dword transpose inside each 128-bit lane
//! (8 unpacks) leaves lane i of zmm q holding bytes 4q..4q+3 of row i, i.e. the low nibbles are
//! weights 4q..4q+3 and the high nibbles weights 16+4q..16+4q+3 of that row: the quads
//! `gemm_q0` feeds to `vpdpbusd`. The 16 (d, m) pairs come in with one gather.
//!
//! Numerics: the very operations of `gemm_q0::tile_cols` (exact integer block sums, then per
//! block `acc = f32(Σ)·(d_w·d_x) + acc`, `acc = m_w·s_x + acc`), so under `Gemm::Tiles` a token's
//! products have the same bits whether it is decoded alone or inside a prompt.
#![allow(unsafe_op_in_unsafe_fn)]

use crate::acts::Acts;
use crate::tensor::QTensor;
use core::arch::x86_64::*;
use quant::GgmlType;

/// Rows per tile: one zmm of i32/f32 lanes.
const TILE_ROWS: usize = 16;
/// Q4_1 block: f16 d, f16 m, 16 bytes of nibbles (32 weights).
const BLOCK_BYTES: usize = 20;
/// Columns whose accumulators stay in registers beside the decoded block.
const COLS: usize = 8;

/// Whether `ty` has tiles for fewer than `gemm_q0::MIN_COLS` columns (so `Gemm::Tiles` changes its
/// decode products too).
pub(crate) fn has(ty: GgmlType) -> bool {
    ty == GgmlType::Q4_1
}

/// One 16-row tile (rows `rowp`, duplicated past the matrix's end) against columns
/// `c0..c0 + NC`; `gidx` holds each row's byte offset from `rowp[0]` for the scale gather.
/// `next` (the following tile, contiguous) is prefetched a block's share at a time.
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn tile_q4_1<const NC: usize>(
    rowp: &[*const u8; TILE_ROWS],
    gidx: __m512i,
    nb: usize,
    k: usize,
    a: &Acts,
    c0: usize,
    next: Option<*const u8>,
) -> [__m512; NC] {
    let m4 = _mm512_set1_epi8(0x0F);
    let (qs, d, sx) = (a.qs.as_ptr(), a.d.as_ptr(), a.s.as_ptr());
    let mut acc = [_mm512_setzero_ps(); NC];
    for b in 0..nb {
        let o = b * BLOCK_BYTES;
        if let Some(next) = next {
            // The next tile is nb blocks of 16 rows x 20 bytes: one block's share of its bytes.
            let p = next.add(b * TILE_ROWS * BLOCK_BYTES);
            for l in 0..(TILE_ROWS * BLOCK_BYTES).div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(p.add(64 * l).cast());
            }
        }
        let ld = |i: usize| _mm_loadu_si128(rowp[i].add(o + 4).cast());
        // quad_rows[j], 128-bit lane L: the 16 quant bytes of row 4L + j.
        let quad_rows: [__m512i; 4] = core::array::from_fn(|j| {
            let v = _mm512_castsi128_si512(ld(j));
            let v = _mm512_inserti32x4::<1>(v, ld(4 + j));
            let v = _mm512_inserti32x4::<2>(v, ld(8 + j));
            _mm512_inserti32x4::<3>(v, ld(12 + j))
        });
        let t0 = _mm512_unpacklo_epi32(quad_rows[0], quad_rows[1]);
        let t1 = _mm512_unpackhi_epi32(quad_rows[0], quad_rows[1]);
        let t2 = _mm512_unpacklo_epi32(quad_rows[2], quad_rows[3]);
        let t3 = _mm512_unpackhi_epi32(quad_rows[2], quad_rows[3]);
        // Lane i of bytes[q]: bytes 4q..4q+3 of row i.
        let bytes = [
            _mm512_unpacklo_epi64(t0, t2),
            _mm512_unpackhi_epi64(t0, t2),
            _mm512_unpacklo_epi64(t1, t3),
            _mm512_unpackhi_epi64(t1, t3),
        ];
        // wq[j]: weights 4j..4j+3 of each row (j < 4 low nibbles, j >= 4 high nibbles).
        let mut wq = [_mm512_setzero_si512(); 8];
        for q in 0..4 {
            wq[q] = _mm512_and_si512(bytes[q], m4);
            wq[4 + q] = _mm512_and_si512(_mm512_srli_epi16(bytes[q], 4), m4);
        }
        let dm = _mm512_i32gather_epi32::<1>(gidx, rowp[0].add(o).cast());
        let dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
        let mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
        for c in 0..NC {
            let col = c0 + c;
            let x = qs.add(col * k + b * 32);
            let mut s = _mm512_setzero_si512();
            for (j, q) in wq.iter().enumerate() {
                s = _mm512_dpbusd_epi32(
                    s,
                    *q,
                    _mm512_set1_epi32(core::ptr::read_unaligned(x.add(4 * j).cast::<i32>())),
                );
            }
            acc[c] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(*d.add(col * nb + b))), acc[c]);
            acc[c] = _mm512_fmadd_ps(mw, _mm512_set1_ps(*sx.add(col * nb + b)), acc[c]);
        }
    }
    acc
}

/// The [`crate::tensor::RowsFn`] body for Q4_1 against Q8_1 activations, any column count
/// (meant for fewer than `gemm_q0::MIN_COLS`): rows in tiles of 16, each tile's blocks decoded in
/// registers once per 8 columns.
///
/// # Safety
/// The [`crate::tensor::RowsFn`] contract and AVX-512 with DQ present.
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
pub(crate) unsafe fn rows_q4_1(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    let (k, rows, n) = (w.cols, w.rows, a.n);
    let nb = k / 32;
    let prefetch = super::common::prefetch_on();
    let mut r = r0;
    while r < r1 {
        let rn = (r1 - r).min(TILE_ROWS);
        let base = w.data.as_ptr().add(r * rb);
        // Rows past the end repeat the last one (loads stay in bounds; their lanes are not stored).
        let row_of = |i: usize| i.min(rn - 1);
        let rowp: [*const u8; TILE_ROWS] = core::array::from_fn(|i| base.add(row_of(i) * rb));
        let offs: [i32; TILE_ROWS] = core::array::from_fn(|i| (row_of(i) * rb) as i32);
        let gidx = _mm512_loadu_si512(offs.as_ptr().cast());
        let next = (prefetch && r + 2 * TILE_ROWS <= rows).then(|| base.add(TILE_ROWS * rb));
        let mask: __mmask16 = if rn == TILE_ROWS { 0xFFFF } else { (1u16 << rn) - 1 };
        let mut c = 0;
        while c + COLS <= n {
            for (i, v) in tile_q4_1::<COLS>(&rowp, gidx, nb, k, a, c, next).iter().enumerate() {
                _mm512_mask_storeu_ps(y.add((c + i) * rows + r), mask, *v);
            }
            c += COLS;
        }
        while c < n {
            _mm512_mask_storeu_ps(y.add(c * rows + r), mask, tile_q4_1::<1>(&rowp, gidx, nb, k, a, c, next)[0]);
            c += 1;
        }
        r += rn;
    }
}
