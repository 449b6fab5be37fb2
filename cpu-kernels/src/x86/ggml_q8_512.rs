//! AVX-512 version of `ggml_q8` (Q8_0 / Q5_0 weights x x86-rounded Q8_0 activations), bit for
//! bit the same results: for every (row, column) the same eight f32 lanes, lane `l` of block
//! `b` = the exact integer `Σ_{t<4} w[4l+t]·a[4l+t]`, accumulated by one FMA per block with
//! `d_w·d_a`, and reduced like `hsum_float_8` at the end. Only the way the integer lane sums
//! are formed differs (integers are exact in any order):
//! * one zmm holds two weight rows (lanes 0-7 row r, 8-15 row r+1), the 32 activation quants
//!   of the block are broadcast to both halves;
//! * weights are made unsigned (`Q5_0`: the 5-bit code `q = w + 16`; `Q8_0`: `w + 128`) and are
//!   the u8 operand of `vpdpbusd` with the signed activations; the accumulator starts at
//!   `-B·Σa` over the lane's four activations (`B` = 16 or 128, precomputed per column and
//!   block in `Acts::lcorr`), so the lane sum is exactly `Σ w·a`;
//! * a tile is 2 row pairs x up to 8 columns (16 accumulators): each weight block is decoded
//!   once per 8 columns, each activation block loaded once per 4 rows.
#![allow(unsafe_op_in_unsafe_fn)]

use core::arch::x86_64::*;

use crate::acts::Acts;
use crate::tensor::QTensor;
use quant::GgmlType;

const ROWS_PER_TILE: usize = 4;
const COLS_PER_TILE: usize = 8;
const PF_DIST: usize = 16;

/// The 32 quants of one block of two rows (lanes 0-31 `b0`, 32-63 `b1`) plus the bias `B`
/// (16 for Q5_0, 128 for Q8_0), as u8.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn quants2<const Q5: bool>(b0: *const u8, b1: *const u8) -> __m512i {
    if Q5 {
        // Q5_0: d, qh (u32), 16 bytes of nibbles; element j uses bit j of qh as its 5th bit.
        let qh = (b0.add(2) as *const u32).read_unaligned() as u64
            | (((b1.add(2) as *const u32).read_unaligned() as u64) << 32);
        let x0 = _mm_loadu_si128(b0.add(6).cast());
        let x1 = _mm_loadu_si128(b1.add(6).cast());
        let y0 = _mm256_inserti128_si256(_mm256_castsi128_si256(x0), _mm_srli_epi16(x0, 4), 1);
        let y1 = _mm256_inserti128_si256(_mm256_castsi128_si256(x1), _mm_srli_epi16(x1, 4), 1);
        let nib = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(y0), y1, 1), _mm512_set1_epi8(0x0F));
        _mm512_mask_add_epi8(nib, qh, nib, _mm512_set1_epi8(16))
    } else {
        let v = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(b0.add(2).cast())),
            _mm256_loadu_si256(b1.add(2).cast()),
            1,
        );
        _mm512_xor_si512(v, _mm512_set1_epi8(-128))
    }
}

/// Both rows' f16 block scales as f32: lanes 0-7 `d(b0)`, lanes 8-15 `d(b1)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn scales2(b0: *const u8, b1: *const u8) -> __m512 {
    let h0 = _mm_set1_epi16((b0 as *const i16).read_unaligned());
    let h1 = _mm_set1_epi16((b1 as *const i16).read_unaligned());
    _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1))
}

/// `hsum_float_8` of lanes `8h..8h+8`: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
#[inline]
fn hsum_half(v: &[f32; 16], h: usize) -> f32 {
    let l = &v[8 * h..8 * h + 8];
    let r = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// One block `ib` of a tile: its decoded row pairs (`wv`, `wd`) times `C` columns from `c0`,
/// added to the accumulators. Every (row pair, column) gets one `vpdpbusd`, one `d_w·d_a`
/// multiply and one FMA, whatever the caller's loop order.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn block_columns<const P: usize, const C: usize>(
    wv: &[__m512i; P],
    wd: &[__m512; P],
    a: &Acts,
    k: usize,
    ib: usize,
    c0: usize,
    acc: &mut [[__m512; C]; P],
) {
    let nb = k / 32;
    for c in 0..C {
        let col = c0 + c;
        let av = _mm512_broadcast_i64x4(_mm256_loadu_si256(a.perm.as_ptr().add(col * k + ib * 32).cast()));
        let da = _mm512_set1_ps(*a.d.as_ptr().add(col * nb + ib));
        let corr = _mm512_broadcast_i64x4(_mm256_loadu_si256(a.lcorr.as_ptr().add((col * nb + ib) * 8).cast()));
        for p in 0..P {
            let s = _mm512_dpbusd_epi32(corr, wv[p], av);
            let d = _mm512_mul_ps(wd[p], da);
            acc[p][c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[p][c]);
        }
    }
}

/// Where a tile's weights come from.
#[derive(Clone, Copy)]
enum Weights {
    /// Decoded block by block inside the tile (few columns: decode, the output head).
    Stored,
    /// Decoded once per row tile by [`decode_rows`]: `2 * nb` quant and scale vectors.
    Decoded(*const __m512i, *const __m512),
}

/// One tile: `P` row pairs (`rows[2p]`, `rows[2p+1]`; duplicates allowed for padding) x `C`
/// columns starting at `c0`. Returns the accumulators.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn tile<const Q5: bool, const P: usize, const C: usize, const PF: bool>(
    w: &QTensor,
    rb: usize,
    a: &Acts,
    rows: [usize; ROWS_PER_TILE],
    c0: usize,
    src: Weights,
) -> [[__m512; C]; P] {
    let k = w.cols;
    let nb = k / 32;
    let bs = if Q5 { 22 } else { 34 };
    let mut acc = [[_mm512_setzero_ps(); C]; P];
    let base = w.data.as_ptr();
    let rp: [*const u8; ROWS_PER_TILE] = core::array::from_fn(|i| base.add(rows[i] * rb));
    for ib in 0..nb {
        let (wv, wd): ([__m512i; P], [__m512; P]) = match src {
            Weights::Decoded(dq, ds) => (
                core::array::from_fn(|p| _mm512_load_si512(dq.add(2 * ib + p).cast())),
                core::array::from_fn(|p| _mm512_load_ps(ds.add(2 * ib + p).cast())),
            ),
            Weights::Stored => {
                let pair = |p: usize| (rp[2 * p].add(ib * bs), rp[2 * p + 1].add(ib * bs));
                if PF {
                    // Weights stream from DRAM for big matrices (the output head): fetch the
                    // tile after the next one while this one computes.
                    for p in 0..P {
                        let (b0, b1) = pair(p);
                        _mm_prefetch::<_MM_HINT_T0>(b0.wrapping_add(PF_DIST * rb).cast());
                        _mm_prefetch::<_MM_HINT_T0>(b1.wrapping_add(PF_DIST * rb).cast());
                    }
                }
                (
                    core::array::from_fn(|p| quants2::<Q5>(pair(p).0, pair(p).1)),
                    core::array::from_fn(|p| scales2(pair(p).0, pair(p).1)),
                )
            }
        };
        block_columns(&wv, &wd, a, k, ib, c0, &mut acc);
    }
    acc
}

/// Decodes the `ROWS_PER_TILE` rows of a tile ([`quants2`], [`scales2`] per block and row
/// pair) into `dq` / `ds` (`2 * nb` entries each).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_rows<const Q5: bool>(
    w: &QTensor,
    rb: usize,
    rows: [usize; ROWS_PER_TILE],
    dq: &mut [__m512i],
    ds: &mut [__m512],
) {
    let nb = w.cols / 32;
    let bs = if Q5 { 22 } else { 34 };
    let base = w.data.as_ptr();
    for ib in 0..nb {
        for p in 0..2 {
            let (b0, b1) = (base.add(rows[2 * p] * rb + ib * bs), base.add(rows[2 * p + 1] * rb + ib * bs));
            dq[2 * ib + p] = quants2::<Q5>(b0, b1);
            ds[2 * ib + p] = scales2(b0, b1);
        }
    }
}

thread_local! {
    /// Decoded weights of one row tile (grows to the largest K seen).
    static DECODED: core::cell::RefCell<(Vec<__m512i>, Vec<__m512>)> = const { core::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Batches of at least this many columns decode each row tile once per column block instead
/// of once per 8-column tile (the decode is ~1/4 of the work per block otherwise).
const PREDECODE_MIN_COLS: usize = 16;

/// Runs one tile and stores its sums ([`hsum_half`]) for the first `n_rows` rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn run_tile<const Q5: bool, const P: usize, const C: usize>(
    w: &QTensor,
    rb: usize,
    a: &Acts,
    rows: [usize; ROWS_PER_TILE],
    n_rows: usize,
    c0: usize,
    src: Weights,
    y: *mut f32,
) {
    let prefetch = matches!(src, Weights::Stored) && super::common::prefetch_on() && C == 1;
    let acc = if prefetch {
        tile::<Q5, P, C, true>(w, rb, a, rows, c0, src)
    } else {
        tile::<Q5, P, C, false>(w, rb, a, rows, c0, src)
    };
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

/// One block of one row as the u8 operand of `vpdpbusd` (the quants plus the bias `B`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn quants1<const Q5: bool>(b: *const u8) -> __m256i {
    if Q5 {
        let x = _mm_loadu_si128(b.add(6).cast());
        let nib = _mm256_and_si256(
            _mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1),
            _mm256_set1_epi8(0x0F),
        );
        let qh = (b.add(2) as *const u32).read_unaligned();
        _mm256_mask_add_epi8(nib, qh, nib, _mm256_set1_epi8(16))
    } else {
        _mm256_xor_si256(_mm256_loadu_si256(b.add(2).cast()), _mm256_set1_epi8(-128))
    }
}

/// One column (decode, the output head): one row per ymm of 8 lanes, ggml's own layout, so a
/// block costs one `vpdpbusd`, one convert, one FMA and its scale. On CPUs that split 512-bit
/// operations in two (Zen 4) that is about half the vector work of the two-rows-per-zmm tile,
/// whose scale and row-pair assembly dominate at one column. Rows run one after the other:
/// the weights are then one sequential stream, which the hardware prefetchers follow (four
/// interleaved rows measured 30% slower on the 178 MB Gemma head); out-of-order execution
/// overlaps one row's FMA chain with the next row's.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_one_col<const Q5: bool>(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    let nb = w.cols / 32;
    let bs = if Q5 { 22 } else { 34 };
    let (ap, dp, lp) = (a.perm.as_ptr(), a.d.as_ptr(), a.lcorr.as_ptr());
    for r in r0..r1 {
        let p = w.data.as_ptr().add(r * rb);
        let mut acc = _mm256_setzero_ps();
        for ib in 0..nb {
            let b = p.add(ib * bs);
            let av = _mm256_loadu_si256(ap.add(ib * 32).cast());
            let s = _mm256_dpbusd_epi32(_mm256_loadu_si256(lp.add(ib * 8).cast()), quants1::<Q5>(b), av);
            let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128((b as *const u16).read_unaligned() as i32)));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * *dp.add(ib)), _mm256_cvtepi32_ps(s), acc);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        *y.add(r) = super::common::hsum8(&lanes);
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_impl<const Q5: bool>(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    if a.n == 1 {
        return rows_one_col::<Q5>(w, rb, a, r0, r1, y);
    }
    let predecode = a.n >= PREDECODE_MIN_COLS;
    let nb = w.cols / 32;
    DECODED.with(|cell| {
        let (dq, ds) = &mut *cell.borrow_mut();
        if predecode && dq.len() < 2 * nb {
            dq.resize(2 * nb, _mm512_setzero_si512());
            ds.resize(2 * nb, _mm512_setzero_ps());
        }
        // Columns in blocks whose activations stay in L2 while the row tiles sweep over them.
        let cb = super::common::col_block(w.cols, 1).max(COLS_PER_TILE);
        let mut cs = 0;
        while cs < a.n {
            let ce = (cs + cb).min(a.n);
            let mut r = r0;
            while r < r1 {
                let m = (r1 - r).min(ROWS_PER_TILE);
                // Pad with the last row (its duplicate results are not stored).
                let rows: [usize; ROWS_PER_TILE] = core::array::from_fn(|i| r + i.min(m - 1));
                let src = if predecode {
                    decode_rows::<Q5>(w, rb, rows, dq, ds);
                    Weights::Decoded(dq.as_ptr(), ds.as_ptr())
                } else {
                    Weights::Stored
                };
                let mut c = cs;
                while c < ce {
                    let nc = if ce - c >= 8 { 8 } else { (ce - c).min(4) };
                    macro_rules! go {
                        ($p:literal) => {
                            match nc {
                                8 => run_tile::<Q5, $p, 8>(w, rb, a, rows, m, c, src, y),
                                4 => run_tile::<Q5, $p, 4>(w, rb, a, rows, m, c, src, y),
                                3 => run_tile::<Q5, $p, 3>(w, rb, a, rows, m, c, src, y),
                                2 => run_tile::<Q5, $p, 2>(w, rb, a, rows, m, c, src, y),
                                _ => run_tile::<Q5, $p, 1>(w, rb, a, rows, m, c, src, y),
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
    })
}

/// # Safety
/// The [`crate::tensor::RowsFn`] contract, AVX-512 F/BW/VL/VNNI present, and `a.perm` / `a.d`
/// filled by [`prepare`].
pub(crate) unsafe fn rows(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    if w.ty == GgmlType::Q5_0 {
        rows_impl::<true>(w, rb, a, r0, r1, y)
    } else {
        rows_impl::<false>(w, rb, a, r0, r1, y)
    }
}

/// Fills `a.perm` (the signed quants, `[n][cols]`), `a.d` (f32 block scales, `[n][cols/32]`)
/// and `a.lcorr` (per block 8 lanes of `-B·Σ` four quants, `B` = 16 for Q5_0 and 128 for Q8_0
/// weights) from the Q8_0 blocks in `a.raw`.
pub(crate) fn prepare(a: &mut Acts, wty: GgmlType) {
    let bias = if wty == GgmlType::Q5_0 { 16 } else { 128 };
    let nblocks = a.raw.len() / 34;
    a.perm.clear();
    a.perm.reserve(nblocks * 32);
    a.d.clear();
    a.d.reserve(nblocks);
    a.lcorr.clear();
    a.lcorr.reserve(nblocks * 8);
    for b in a.raw.chunks_exact(34) {
        a.d.push(quant::f16_to_f32(u16::from_le_bytes([b[0], b[1]])));
        a.perm.extend(b[2..34].iter().map(|&q| q as i8));
        a.lcorr.extend(b[2..34].chunks_exact(4).map(|l| -bias * l.iter().map(|&q| q as i8 as i32).sum::<i32>()));
    }
}
