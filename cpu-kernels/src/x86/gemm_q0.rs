//! Prompt-sized products (at least [`MIN_COLS`] activation columns) for the 32-element formats
//! Q8_0 / Q4_0 / Q5_0 / IQ4_NL against Q8_0 activations and Q4_1 against Q8_1, on AVX-512.
//!
//! Why not the pair kernels (`zmm`): there each i32 lane of a `vpdpbusd` holds 4 products of one
//! block, so every `vpdpbusd` needs its own convert, scale multiply and FMA (~7 instructions per
//! 64 multiply-adds). Here a tile of 16 rows is decoded once into a scratch laid out so that
//! lane i of a zmm is row i: per block, 8 `vpdpbusd` (one per quad of 4 elements, the column's
//! 4 activation quants broadcast from memory) sum all 32 products of the block for 16 rows, then
//! one convert, multiply and FMA: ~13 instructions per 512 multiply-adds. The decode costs
//! ~16 stores per row and block and is shared by all columns.
//!
//! Scratch layout, per block: 8 quads × (16 rows × 4 u8 weights biased by +128), then the 16
//! rows' f32 scales, then (Q4_1) their f32 mins. The bias makes the weights the unsigned
//! operand; the activations' side carries `-128 · Σ x` per column and block (`Acts::corr`), the
//! start value of each block sum. Q4_1 (`w = d·q + m`) keeps its unsigned nibbles unbiased, its
//! sums start at 0, and its min term is one more FMA per block with Q8_1's `s = d_x·Σx`.
//!
//! Numerics: block sums are exact integers; per block `acc += f32(Σ) · (d_w · d_x)` in block
//! order. That is not the lane order (each 4-product lane sum rounded on its own, llama.cpp's)
//! of the default kernels, which decode and windows of < `MIN_COLS` always use, so a prompt's
//! products differ from evaluating the same tokens one by one by f32 rounding. Hence a named
//! mode (`Gemm::Tiles`, `--cpu-gemm tiles`), off by default.
#![allow(unsafe_op_in_unsafe_fn)]

use super::q0_decode as dec;
use crate::acts::Acts;
use crate::tensor::QTensor;
use core::arch::x86_64::*;

/// Fewest activation columns for which `prepare` sets `Acts::tiles` (and fills `Acts::corr`)
/// and the tiles run.
pub(crate) const MIN_COLS: usize = 16;
/// Rows per tile: one zmm of i32/f32 lanes.
const TILE_ROWS: usize = 16;
/// Columns whose accumulators stay in registers while a block's 8 weight quads are loaded.
const COLS: usize = 8;
/// Scratch bytes per block: 8 quads of 64 bytes, 16 f32 scales, 16 f32 mins (Q4_1).
const BLOCK_BYTES: usize = 8 * 64 + 2 * 64;

/// The 16-row tile at `tile` against columns `c0..c0 + NC`: one f32 zmm (16 rows) per column.
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn tile_cols<const MIN: bool, const NC: usize>(
    tile: *const u8,
    nb: usize,
    k: usize,
    a: &Acts,
    c0: usize,
) -> [__m512; NC] {
    let mut acc = [_mm512_setzero_ps(); NC];
    let (qs, d, corr, sx) = (a.qs.as_ptr(), a.d.as_ptr(), a.corr.as_ptr(), a.s.as_ptr());
    for b in 0..nb {
        let t = tile.add(b * BLOCK_BYTES);
        let mut wq = [_mm512_setzero_si512(); 8];
        for (j, q) in wq.iter_mut().enumerate() {
            *q = _mm512_loadu_si512(t.add(64 * j).cast());
        }
        let dw = _mm512_loadu_ps(t.add(512).cast());
        let mw = _mm512_loadu_ps(t.add(576).cast());
        for c in 0..NC {
            let col = c0 + c;
            let x = qs.add(col * k + b * 32);
            let mut s = if MIN { _mm512_setzero_si512() } else { _mm512_set1_epi32(*corr.add(col * nb + b)) };
            for (j, q) in wq.iter().enumerate() {
                s = _mm512_dpbusd_epi32(
                    s,
                    *q,
                    _mm512_set1_epi32(core::ptr::read_unaligned(x.add(4 * j).cast::<i32>())),
                );
            }
            acc[c] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(*d.add(col * nb + b))), acc[c]);
            if MIN {
                acc[c] = _mm512_fmadd_ps(mw, _mm512_set1_ps(*sx.add(col * nb + b)), acc[c]);
            }
        }
    }
    acc
}

/// Rows `r..r + rn` (rn ≤ 16) decoded into `scratch` (`nb` blocks, see the module doc); the
/// rows past `rn` get zero weights and scales. `decode` gives two blocks as 64 i8 (Q4_1, `MIN`:
/// as 64 unsigned nibbles, stored unbiased, with the f16 min after the scale).
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn decode_tile<const MIN: bool>(
    w: &QTensor,
    rb: usize,
    bsz: usize,
    r: usize,
    rn: usize,
    scratch: &mut [u8],
    decode: unsafe fn(*const u8) -> __m512i,
) {
    let nb = w.cols / 32;
    let s = scratch.as_mut_ptr();
    let mut tmp = [0u8; 64];
    for i in 0..TILE_ROWS {
        if i >= rn {
            for b in 0..nb {
                let t = s.add(b * BLOCK_BYTES);
                let zero = if MIN { 0 } else { 0x8080_8080 };
                for j in 0..8 {
                    core::ptr::write_unaligned(t.add(64 * j + 4 * i).cast::<u32>(), zero);
                }
                core::ptr::write_unaligned(t.add(512 + 4 * i).cast::<f32>(), 0.0);
                core::ptr::write_unaligned(t.add(576 + 4 * i).cast::<f32>(), 0.0);
            }
            continue;
        }
        let p = w.data.as_ptr().add((r + i) * rb);
        for bp in 0..nb / 2 {
            let q = decode(p.add(2 * bp * bsz));
            let q = if MIN { q } else { _mm512_xor_si512(q, _mm512_set1_epi8(-128)) };
            _mm512_storeu_si512(tmp.as_mut_ptr().cast(), q);
            for h in 0..2 {
                let b = 2 * bp + h;
                let t = s.add(b * BLOCK_BYTES);
                for j in 0..8 {
                    let quad = core::ptr::read_unaligned(tmp.as_ptr().add(32 * h + 4 * j).cast::<u32>());
                    core::ptr::write_unaligned(t.add(64 * j + 4 * i).cast::<u32>(), quad);
                }
                let h2f = |o: usize| {
                    let h = core::ptr::read_unaligned(p.add(b * bsz + o).cast::<u16>());
                    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
                };
                core::ptr::write_unaligned(t.add(512 + 4 * i).cast::<f32>(), h2f(0));
                if MIN {
                    core::ptr::write_unaligned(t.add(576 + 4 * i).cast::<f32>(), h2f(2));
                }
            }
        }
    }
}

/// The [`crate::tensor::RowsFn`] body: rows in tiles of 16, each decoded once and run against
/// every column.
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn rows<const MIN: bool>(
    w: &QTensor,
    rb: usize,
    a: &Acts,
    r0: usize,
    r1: usize,
    y: *mut f32,
    bsz: usize,
    decode: unsafe fn(*const u8) -> __m512i,
) {
    let (k, rows, n) = (w.cols, w.rows, a.n);
    let nb = k / 32;
    let mut scratch = vec![0u8; nb * BLOCK_BYTES];
    let mut r = r0;
    while r < r1 {
        let rn = (r1 - r).min(TILE_ROWS);
        decode_tile::<MIN>(w, rb, bsz, r, rn, &mut scratch, decode);
        let mask: __mmask16 = if rn == TILE_ROWS { 0xFFFF } else { (1u16 << rn) - 1 };
        let t = scratch.as_ptr();
        let mut c = 0;
        while c + COLS <= n {
            for (i, v) in tile_cols::<MIN, COLS>(t, nb, k, a, c).iter().enumerate() {
                _mm512_mask_storeu_ps(y.add((c + i) * rows + r), mask, *v);
            }
            c += COLS;
        }
        while c < n {
            _mm512_mask_storeu_ps(y.add(c * rows + r), mask, tile_cols::<MIN, 1>(t, nb, k, a, c)[0]);
            c += 1;
        }
        r += rn;
    }
}

macro_rules! gemm_rows {
    ($name:ident, min: $min:literal, $bsz:expr, $decode:path) => {
        /// # Safety
        /// The [`crate::tensor::RowsFn`] contract, AVX-512 with DQ present, an even number of
        /// blocks per row, and `a.corr` filled (`prepare`, n ≥ [`MIN_COLS`]).
        #[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
        pub(crate) unsafe fn $name(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
            rows::<$min>(w, rb, a, r0, r1, y, $bsz, $decode)
        }
    };
}

gemm_rows!(rows_q8_0, min: false, dec::Q8_0_BYTES, dec::q8_0);
gemm_rows!(rows_q4_0, min: false, dec::Q4_0_BYTES, dec::q4_0);
gemm_rows!(rows_q5_0, min: false, dec::Q5_0_BYTES, dec::q5_0);
gemm_rows!(rows_iq4_nl, min: false, dec::IQ4_NL_BYTES, dec::iq4_nl);
gemm_rows!(rows_q4_1, min: true, dec::Q4_1_BYTES, dec::q4_1);
