//! Causal (optionally sliding-window) multi-head attention over the KV cache.
//!
//! Numerics follow llama.cpp's non-flash path with an f16 cache, in its exact float order for
//! every architecture ([`attend_ggml`]): `K·q` is an f16 x f16 dot (ggml converts the f32
//! query to f16 for an f16 matrix), softmax in f32, and the probabilities are converted to f16
//! before they weight the f16 V rows. With an int8 cache the query and probabilities stay f32.
//!
//! Work is split over (token, head) pairs (groups of tokens for batches) on the evaluation's
//! thread team; per-thread scratch lives in thread-locals that only grow.

use std::cell::RefCell;

use cpu_kernels::team;

use crate::f16::round_f16;
use crate::kv_cache::KvLayer;

#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Position of the first query row.
    pub pos0: usize,
    /// Keys further back than `window - 1` positions are masked.
    pub window: Option<usize>,
    pub kq_scale: f32,
    /// The architecture needs llama.cpp's float order even where only its slow scalar
    /// definition can run (shapes the SIMD form does not take); see [`attend`].
    pub ggml_exact: bool,
}

thread_local! {
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `out[i][h] = softmax(scale * q[i][h] · K[lo..=pos]) · V[lo..=pos]` for every query row `i`
/// (position `pos0 + i`) and head `h`. The cache must already hold positions `..= pos0 + n - 1`.
pub fn attend(kv: &KvLayer, q: &[f32], out: &mut [f32], sh: Shape) {
    let hd = sh.head_dim;
    let group = sh.n_head / sh.n_head_kv;
    let f16 = kv.is_f16();
    // llama.cpp's float order in its SIMD form is also the fastest attention we have for an
    // f16 cache (its batch tiles share each K/V row load across consecutive tokens: SmolLM2
    // prompt 370 -> 485 tok/s), so every architecture takes it where it applies; the loop
    // below serves the int8 cache and the other shapes.
    if f16 && (sh.ggml_exact || ggml_simd_applies(kv, sh)) {
        return attend_ggml(kv, q, out, sh);
    }
    let work = |idx: usize, o: &mut [f32]| {
        let (i, h) = (idx / sh.n_head, idx % sh.n_head);
        let pos = sh.pos0 + i;
        let lo = match sh.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        };
        let kvh = h / group;
        let qh = &q[idx * hd..(idx + 1) * hd];
        SCRATCH.with(|cell| {
            let (scores, qr) = &mut *cell.borrow_mut();
            if qr.len() < hd {
                qr.resize(hd, 0.0);
            }
            let qr = &mut qr[..hd];
            if f16 {
                qr.iter_mut().zip(qh).for_each(|(a, b)| *a = round_f16(*b));
            } else {
                qr.copy_from_slice(qh);
            }
            let m = pos + 1 - lo;
            if scores.len() < m {
                scores.resize(m, 0.0);
            }
            let sc = &mut scores[..m];
            for (j, s) in sc.iter_mut().enumerate() {
                *s = kv.dot_k(lo + j, kvh, qr) * sh.kq_scale;
            }
            cpu_kernels::softmax(sc);
            o.fill(0.0);
            for (j, &p) in sc.iter().enumerate() {
                let p = if f16 { round_f16(p) } else { p };
                if p != 0.0 {
                    kv.axpy_v(lo + j, kvh, p, o);
                }
            }
        });
    };
    let n_items = out.len() / hd;
    if n_items <= 1 {
        out.chunks_mut(hd).enumerate().for_each(|(i, o)| work(i, o));
    } else {
        team::chunks_mut(out, hd, |i, o| work(i, o));
    }
}

/// Attention in a fixed, documented float order, the CPU reference of the GPU's ordered
/// mode (`GpuOps::attention(AttnMode::Ordered, ..)`, gpu-kernels/src/ops/attention.rs), which
/// is bit-identical to it. For query row `i` (position `pos = pos0 + i`), head `h`, kv head
/// `g = h / (n_head / n_head_kv)`, cells `lo..=pos` (`lo` from the window), `m = pos + 1 - lo`:
///
/// 1. `qr = f16(q)` for an f16 cache (as ggml's f16 matmul), `q` for int8;
///    `s_j = (sum_{d = 0..hd} K[lo+j][g][d] * qr[d], in d order)` (int8: `* k_scale`), `* kq_scale`;
/// 2. `mx = max_j s_j`; `e_j = fmath::expf(s_j - mx)`; 32 partial sums `part[l] = sum of e_j
///    for j ≡ l (mod 32)` in increasing j, then `part[l] = part[l] + part[l ^ b]` for
///    b = 1, 2, 4, 8, 16 (a GPU wave's butterfly); `inv = 1 / part[0]`;
/// 3. `p_j = e_j * inv` (f16-rounded for an f16 cache); `out[d] = sum_j p_j * V[lo+j][g][d]`
///    in increasing j from 0.0 (int8: `(p_j * v_scale) * q`).
///
/// Every step is a plain f32 `+ - * /` (no FMA) or `expf` from the no_std `quant` crate.
pub fn attend_ordered(kv: &KvLayer, q: &[f32], out: &mut [f32], sh: Shape) {
    use crate::kv_cache::RawRows;
    let hd = sh.head_dim;
    let nkv = sh.n_head_kv;
    let group = sh.n_head / nkv;
    let (kr, vr) = (kv.k_raw(), kv.v_raw());
    let f16 = matches!(kr, RawRows::F16(_));
    let elem = |r: &RawRows, cell: usize, d: usize| -> f32 {
        match r {
            RawRows::F16(v) => quant::f16_to_f32(v[cell * hd + d]),
            RawRows::Int8 { q, .. } => q[cell * hd + d] as f32,
            RawRows::F32(v) => v[cell * hd + d],
        }
    };
    let row_scale = |r: &RawRows, cell: usize| -> f32 {
        match r {
            RawRows::F16(_) | RawRows::F32(_) => 1.0,
            RawRows::Int8 { scale, .. } => scale[cell],
        }
    };
    let work = |idx: usize, o: &mut [f32]| {
        let (i, h) = (idx / sh.n_head, idx % sh.n_head);
        let pos = sh.pos0 + i;
        let lo = sh.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let g = h / group;
        let qr: Vec<f32> = q[idx * hd..(idx + 1) * hd].iter().map(|&v| if f16 { round_f16(v) } else { v }).collect();
        let m = pos + 1 - lo;
        let mut sc = vec![0f32; m];
        for (j, s) in sc.iter_mut().enumerate() {
            let cell = (lo + j) * nkv + g;
            let mut acc = 0f32;
            for (d, &qd) in qr.iter().enumerate() {
                acc += elem(&kr, cell, d) * qd;
            }
            if !f16 {
                acc *= row_scale(&kr, cell);
            }
            *s = acc * sh.kq_scale;
        }
        let mx = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut part = [0f32; 32];
        for (j, s) in sc.iter_mut().enumerate() {
            *s = quant::fmath::expf(*s - mx);
            part[j % 32] += *s;
        }
        for b in [1, 2, 4, 8, 16] {
            let prev = part;
            for l in 0..32 {
                part[l] = prev[l] + prev[l ^ b];
            }
        }
        let inv = 1.0 / part[0];
        o.fill(0.0);
        for (j, &e) in sc.iter().enumerate() {
            let cell = (lo + j) * nkv + g;
            let p = e * inv;
            if f16 {
                let p = round_f16(p);
                for (d, od) in o.iter_mut().enumerate() {
                    *od += p * elem(&vr, cell, d);
                }
            } else {
                let ps = p * row_scale(&vr, cell);
                for (d, od) in o.iter_mut().enumerate() {
                    *od += ps * elem(&vr, cell, d);
                }
            }
        }
    };
    team::chunks_mut(out, hd, |i, o| work(i, o));
}

/// llama.cpp's non-flash attention with an f16 cache, in its exact float order: `K·q` and
/// `V·p` are f16 matmuls (llamafile's tinyBLAS for batches of >= 2 tokens, `ggml_vec_dot_f16`
/// for one), over `n_kv` = the used cells padded to 256; softmax with ggml's AVX-512 `expf`
/// polynomial, sums of 16-lane chunks accumulated in f64.
fn attend_ggml(kv: &KvLayer, q: &[f32], out: &mut [f32], sh: Shape) {
    #[cfg(target_arch = "x86_64")]
    if ggml_simd_applies(kv, sh) {
        return simd::attend_ggml(kv, q, out, sh);
    }
    attend_ggml_scalar(kv, q, out, sh)
}

/// Whether the SIMD form of [`attend_ggml`] takes this cache and shape.
fn ggml_simd_applies(kv: &KvLayer, sh: Shape) -> bool {
    #[cfg(target_arch = "x86_64")]
    return sh.head_dim.is_multiple_of(64) && sh.n_head / sh.n_head_kv <= 16 && simd::available() && kv.is_f16();
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// The scalar definition of [`attend_ggml`]'s float order (and the fallback without AVX-512).
pub(crate) fn attend_ggml_scalar(kv: &KvLayer, q: &[f32], out: &mut [f32], sh: Shape) {
    let hd = sh.head_dim;
    let batch = out.len() / hd / sh.n_head >= 2;
    team::chunks_mut(out, hd, |idx, o| {
        let (i, h) = (idx / sh.n_head, idx % sh.n_head);
        let pos = sh.pos0 + i;
        let lo = sh.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let kvh = h / (sh.n_head / sh.n_head_kv);
        let dot = if batch { tinyblas_dot } else { vec_dot_f16 };
        let qr: Vec<f32> = q[idx * hd..(idx + 1) * hd].iter().map(|&v| round_f16(v)).collect();
        let n_kv = (pos + 1).div_ceil(256) * 256;
        let mut sc = vec![f32::NEG_INFINITY; n_kv];
        let mut row = vec![0f32; hd.max(n_kv)];
        for (j, s) in sc.iter_mut().enumerate().take(pos + 1).skip(lo) {
            let Some((k, _)) = kv.rows_f16(j, kvh) else { return };
            row[..hd].iter_mut().zip(k).for_each(|(a, &b)| *a = f16_to_f32(b));
            *s = dot(&row[..hd], &qr) * sh.kq_scale;
        }
        let max = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f64;
        for c in sc.chunks_mut(16) {
            let mut e = [0f32; 16];
            for (l, v) in c.iter_mut().enumerate() {
                *v = v_expf(*v - max);
                e[l] = *v;
            }
            sum += reduce16(&e) as f64;
        }
        let inv = (1.0 / sum) as f32;
        let p: Vec<f32> = sc.iter().map(|&v| round_f16(v * inv)).collect();
        let vrows: Vec<&[u16]> = (0..=pos).filter_map(|j| kv.rows_f16(j, kvh).map(|r| r.1)).collect();
        for (t, ot) in o.iter_mut().enumerate() {
            for (j, r) in row[..n_kv].iter_mut().enumerate() {
                *r = vrows.get(j).map_or(0.0, |v| f16_to_f32(v[t]));
            }
            *ot = dot(&row[..n_kv], &p);
        }
    });
}

/// AVX-512 form of [`attend_ggml_scalar`] with the same float operations per value:
/// * `K·q`: the 16-lane (tinyBLAS) or 4x16-lane (`ggml_vec_dot_f16`) FMA accumulators are zmm
///   registers, reduced like `_mm512_reduce_add_ps`;
/// * softmax: ggml's `ggml_v_expf` on zmm (the scalar `v_expf` copies it), chunk sums in f64;
/// * `V·p`: accumulator lane `l` of output `t` (`j % 16`, or `j % 64` for the 4x16 form) is a
///   row of accumulators vectorised over `t`, so every (t, lane) gets the same FMA sequence
///   over positions `j` as in the scalar dot. Positions outside `lo..=pos` have `p = 0` there
///   and are skipped (adding `0·v` leaves an accumulator that is never -0 unchanged; cached V
///   values are finite).
#[cfg(target_arch = "x86_64")]
mod simd {
    #![allow(unsafe_op_in_unsafe_fn, clippy::needless_range_loop)]
    use super::*;
    use core::arch::x86_64::*;

    pub(super) fn available() -> bool {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("f16c") && is_x86_feature_detected!("fma")
    }

    thread_local! {
        static BUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    }

    /// f16 zeros standing in for the V rows past the last position of a block.
    static ZERO_ROW: [u16; 16] = [0; 16];

    pub(super) fn attend_ggml(kv: &KvLayer, q: &[f32], out: &mut [f32], sh: Shape) {
        let hd = sh.head_dim;
        let batch = out.len() / hd / sh.n_head >= 2;
        if batch {
            // Groups of consecutive tokens share each K/V row load (up to MAX_QV query vectors);
            // small batches use one token per item so both threads get work.
            let g = sh.n_head / sh.n_head_kv;
            let n = out.len() / (sh.n_head * hd);
            let tg = (MAX_QV / g).max(1).min(n.div_ceil(rayon::current_num_threads()).max(1));
            return team::chunks_mut(out, tg * sh.n_head * hd, |gi, o| {
                BUF.with(|cell| {
                    let buf = &mut *cell.borrow_mut();
                    // SAFETY: `available()` was checked by the caller; head_dim % 64 == 0 and
                    // at most MAX_QV query vectors per KV head (checked by the caller).
                    unsafe { group_batch(kv, q, o, gi * tg, sh, buf) }
                })
            });
        }
        let work = |(idx, o): (usize, &mut [f32])| {
            BUF.with(|cell| {
                let buf = &mut *cell.borrow_mut();
                // SAFETY: `available()` was checked by the caller; head_dim % 64 == 0.
                unsafe { item(kv, &q[idx * hd..(idx + 1) * hd], o, idx, sh, batch, buf) }
            })
        };
        if out.len() / hd <= 1 {
            out.chunks_mut(hd).enumerate().for_each(work);
        } else {
            team::chunks_mut(out, hd, |i, o| work((i, o)));
        }
    }

    /// `_mm512_reduce_add_ps` as GCC expands it.
    #[target_feature(enable = "avx512f,f16c,fma")]
    #[inline]
    unsafe fn reduce(v: __m512) -> f32 {
        let mut a = [0f32; 16];
        _mm512_storeu_ps(a.as_mut_ptr(), v);
        reduce16(&a)
    }

    /// f16-rounded copy of 16 floats.
    #[target_feature(enable = "avx512f,f16c,fma")]
    #[inline]
    unsafe fn round16(v: __m512) -> __m512 {
        _mm512_cvtph_ps(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v))
    }

    #[target_feature(enable = "avx512f,f16c,fma")]
    #[inline]
    unsafe fn load_h(p: *const u16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }

    /// `ggml_v_expf` (AVX-512).
    #[target_feature(enable = "avx512f,f16c,fma")]
    #[inline]
    unsafe fn v_expf16(x: __m512) -> __m512 {
        let c = |b: u32| _mm512_set1_ps(f32::from_bits(b));
        let r = c(0x4b40_0000);
        let z = _mm512_fmadd_ps(x, c(0x3fb8_aa3b), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(n, c(0x35bf_be8e), _mm512_fnmadd_ps(n, c(0x3f31_7200), x));
        let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm512_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm512_fmadd_ps(c(0x3f7f_fff6), b, _mm512_set1_ps(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        if d == 0 {
            return res;
        }
        let zero = _mm512_setzero_ps();
        let alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, zero), _mm512_set1_ps(f32::INFINITY), zero);
        _mm512_mask_blend_ps(d, res, alt)
    }

    /// `reduce16` of 16 vectors at once: lane `x` of the result is `reduce16(a[x])`, computed
    /// with the same additions (pairs `i, i+8`, then `i, i+4`, then `(0+2) + (1+3)`).
    #[target_feature(enable = "avx512f,f16c,fma")]
    #[inline]
    unsafe fn reduce16x16(a: &[__m512; 16]) -> __m512 {
        let l1: [__m512; 8] = core::array::from_fn(|k| {
            let (x, y) = (a[2 * k], a[2 * k + 1]);
            _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(x, y), _mm512_shuffle_f32x4::<0xEE>(x, y))
        });
        let l2: [__m512; 4] = core::array::from_fn(|k| {
            let (x, y) = (l1[2 * k], l1[2 * k + 1]);
            _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(x, y), _mm512_shuffle_f32x4::<0xDD>(x, y))
        });
        let l3: [__m512; 2] = core::array::from_fn(|k| {
            let (x, y) = (l2[2 * k], l2[2 * k + 1]);
            _mm512_add_ps(_mm512_shuffle_ps::<0x44>(x, y), _mm512_shuffle_ps::<0xEE>(x, y))
        });
        let r = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(l3[0], l3[1]), _mm512_shuffle_ps::<0xDD>(l3[0], l3[1]));
        // Lane 4r + m holds a[4m + r].
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r)
    }

    /// Query vectors (tokens x heads of one KV head) a batch work item computes at once: they
    /// share every K and V row load. 16 accumulators fit the 32 zmm registers with room for
    /// the operands.
    const MAX_QV: usize = 16;

    /// Batch (tinyBLAS order) attention of `nt` consecutive tokens starting at token `t0`, all
    /// heads. Same float operations per value as [`attend_ggml_scalar`]; only the loop order
    /// across independent accumulators changes, so a token's K/V rows are loaded once for all
    /// its query vectors:
    /// * `K·q` in 4-row x 4-query tiles over the head dimension, reduced with `reduce16x16`;
    /// * `V·p` one accumulator lane `l` (positions `j % 16 == l`) at a time for all query
    ///   vectors, the probabilities stored transposed so each FMA broadcasts one from memory.
    ///   Blocks outside a token's own range have `p = 0` (see the module note on `0·v`).
    #[target_feature(enable = "avx512f,f16c,fma")]
    unsafe fn group_batch(kv: &KvLayer, q: &[f32], o: &mut [f32], t0: usize, sh: Shape, buf: &mut Vec<f32>) {
        let (hd, nh, nkvh) = (sh.head_dim, sh.n_head, sh.n_head_kv);
        let g = nh / nkvh;
        let nt = o.len() / (nh * hd);
        let nq = nt * g;
        debug_assert!(nq <= MAX_QV);
        match nq.div_ceil(4) * 4 {
            4 => group_batch_n::<4>(kv, q, o, t0, nt, sh, buf),
            8 => group_batch_n::<8>(kv, q, o, t0, nt, sh, buf),
            12 => group_batch_n::<12>(kv, q, o, t0, nt, sh, buf),
            _ => group_batch_n::<16>(kv, q, o, t0, nt, sh, buf),
        }
    }

    #[target_feature(enable = "avx512f,f16c,fma")]
    unsafe fn group_batch_n<const NQ: usize>(
        kv: &KvLayer,
        q: &[f32],
        o: &mut [f32],
        t0: usize,
        nt: usize,
        sh: Shape,
        buf: &mut Vec<f32>,
    ) {
        let (hd, nh, nkvh) = (sh.head_dim, sh.n_head, sh.n_head_kv);
        let g = nh / nkvh;
        let nq = nt * g;
        let nc = hd / 16;
        let pos_of = |ti: usize| sh.pos0 + t0 + ti;
        let lo_of = |ti: usize| sh.window.map_or(0, |w| (pos_of(ti) + 1).saturating_sub(w));
        let hi = pos_of(nt - 1);
        let (b_lo, b_hi) = (lo_of(0) / 16, hi / 16);
        let nb = b_hi - b_lo + 1;
        // buf: rounded q (NQ * hd) | scores (NQ * nb * 16) | p transposed (nb * 16 * NQ) |
        //      tile scratch (NQ * 16 vectors of 16)
        let need = NQ * hd + 2 * NQ * nb * 16 + NQ * 256;
        if buf.len() < need {
            buf.resize(need, 0.0);
        }
        let (qr, rest) = buf.split_at_mut(NQ * hd);
        let (sc, rest) = rest.split_at_mut(NQ * nb * 16);
        let (pt, rest) = rest.split_at_mut(NQ * nb * 16);
        let tmp = rest[..NQ * 256].as_mut_ptr();
        let Some((kall, vall)) = kv.planes_f16() else { return };
        let stride = nkvh * hd;
        assert!(kall.len() >= (hi + 1) * stride && vall.len() >= (hi + 1) * stride);
        let scale = _mm512_set1_ps(sh.kq_scale);
        for kvh in 0..nkvh {
            // Query vector m = (token m / g, head kvh * g + m % g); padding vectors are zero.
            qr.fill(0.0);
            for m in 0..nq {
                let src = q.as_ptr().add((t0 + m / g) * nh * hd + (kvh * g + m % g) * hd);
                for c in 0..nc {
                    _mm512_storeu_ps(qr.as_mut_ptr().add(m * hd + 16 * c), round16(_mm512_loadu_ps(src.add(16 * c))));
                }
            }
            sc.fill(f32::NEG_INFINITY);
            let kbase = kall.as_ptr().add(kvh * hd);
            for b in 0..nb {
                let j0 = 16 * (b_lo + b);
                for rg in 0..4 {
                    // Rows past the last position repeat it (masked below).
                    let krow: [*const u16; 4] = core::array::from_fn(|r| kbase.add((j0 + 4 * rg + r).min(hi) * stride));
                    for mg in (0..NQ).step_by(4) {
                        let mut acc = [[_mm512_setzero_ps(); 4]; 4];
                        for c in 0..nc {
                            let kv4: [__m512; 4] = core::array::from_fn(|r| load_h(krow[r].add(16 * c)));
                            for mi in 0..4 {
                                let qv = _mm512_loadu_ps(qr.as_ptr().add((mg + mi) * hd + 16 * c));
                                for r in 0..4 {
                                    acc[r][mi] = _mm512_fmadd_ps(kv4[r], qv, acc[r][mi]);
                                }
                            }
                        }
                        for mi in 0..4 {
                            for r in 0..4 {
                                _mm512_storeu_ps(tmp.add(((mg + mi) * 16 + 4 * rg + r) * 16), acc[r][mi]);
                            }
                        }
                    }
                }
                for m in 0..nq {
                    let a: [__m512; 16] = core::array::from_fn(|l| _mm512_loadu_ps(tmp.add((m * 16 + l) * 16)));
                    let s = _mm512_mul_ps(reduce16x16(&a), scale);
                    let (lo, pos) = (lo_of(m / g), pos_of(m / g));
                    let valid =
                        (0..16).fold(0u16, |v, l| if (lo..=pos).contains(&(j0 + l)) { v | (1 << l) } else { v });
                    let dst = sc.as_mut_ptr().add(m * nb * 16 + 16 * b);
                    _mm512_storeu_ps(dst, _mm512_mask_blend_ps(valid, _mm512_set1_ps(f32::NEG_INFINITY), s));
                }
            }
            // Softmax per query vector over its own blocks; p lands transposed in `pt`.
            pt.fill(0.0);
            for m in 0..nq {
                let (lo, pos) = (lo_of(m / g), pos_of(m / g));
                let s = &mut sc[m * nb * 16..(m + 1) * nb * 16];
                let base = 16 * b_lo;
                let max = s[lo - base..=pos - base].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let vmax = _mm512_set1_ps(max);
                let mut sum = 0f64;
                for c in lo / 16..=pos / 16 {
                    let p = s.as_mut_ptr().add(16 * (c - b_lo));
                    let e = v_expf16(_mm512_sub_ps(_mm512_loadu_ps(p), vmax));
                    _mm512_storeu_ps(p, e);
                    sum += reduce(e) as f64;
                }
                let inv = _mm512_set1_ps((1.0 / sum) as f32);
                for c in lo / 16..=pos / 16 {
                    let p = s.as_mut_ptr().add(16 * (c - b_lo));
                    _mm512_storeu_ps(p, round16(_mm512_mul_ps(_mm512_loadu_ps(p), inv)));
                    for l in 0..16 {
                        pt[(16 * (c - b_lo) + l) * NQ + m] = *p.add(l);
                    }
                }
            }
            // V: pass (c, l) keeps the lane-l accumulators of all query vectors in registers.
            let vbase = vall.as_ptr().add(kvh * hd);
            for c in 0..nc {
                for l in 0..16 {
                    let mut acc = [_mm512_setzero_ps(); NQ];
                    for b in 0..nb {
                        let j = 16 * (b_lo + b) + l;
                        let row = if j <= hi { vbase.add(j * stride + 16 * c) } else { ZERO_ROW.as_ptr() };
                        let v = load_h(row);
                        let pr = pt.as_ptr().add((16 * b + l) * NQ);
                        for m in 0..NQ {
                            let p = *pr.add(m);
                            // A masked cell (a later token of the group, or before the window)
                            // has p = 0; llama.cpp multiplies it anyway (0 · NaN = NaN lets a
                            // NaN in a later token's V reach earlier rows). Only the exact
                            // path keeps that, for its bits; the others stay causal.
                            if p == 0.0 && !sh.ggml_exact {
                                continue;
                            }
                            acc[m] = _mm512_fmadd_ps(v, _mm512_set1_ps(p), acc[m]);
                        }
                    }
                    for m in 0..NQ {
                        _mm512_storeu_ps(tmp.add((m * 16 + l) * 16), acc[m]);
                    }
                }
                for m in 0..nq {
                    let r: [__m512; 16] = core::array::from_fn(|l| _mm512_loadu_ps(tmp.add((m * 16 + l) * 16)));
                    let t8: [__m512; 8] = core::array::from_fn(|l| _mm512_add_ps(r[l], r[l + 8]));
                    let t4: [__m512; 4] = core::array::from_fn(|l| _mm512_add_ps(t8[l], t8[l + 4]));
                    let res = _mm512_add_ps(_mm512_add_ps(t4[0], t4[2]), _mm512_add_ps(t4[1], t4[3]));
                    let dst = o.as_mut_ptr().add((m / g) * nh * hd + (kvh * g + m % g) * hd + 16 * c);
                    _mm512_storeu_ps(dst, res);
                }
            }
        }
    }

    #[target_feature(enable = "avx512f,f16c,fma")]
    unsafe fn item(kv: &KvLayer, q: &[f32], o: &mut [f32], idx: usize, sh: Shape, batch: bool, buf: &mut Vec<f32>) {
        let hd = sh.head_dim;
        let (i, h) = (idx / sh.n_head, idx % sh.n_head);
        let pos = sh.pos0 + i;
        let lo = sh.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let kvh = h / (sh.n_head / sh.n_head_kv);
        let n_kv = (pos + 1).div_ceil(256) * 256;
        let nacc = if batch { 16 } else { 64 };
        // buf: q (hd) | scores (n_kv) | V accumulators (nacc * hd)
        let need = hd + n_kv + nacc * hd;
        if buf.len() < need {
            buf.resize(need, 0.0);
        }
        let (qr, rest) = buf.split_at_mut(hd);
        let (sc, accs) = rest.split_at_mut(n_kv);
        let accs = &mut accs[..nacc * hd];
        for c in 0..hd / 16 {
            _mm512_storeu_ps(qr.as_mut_ptr().add(16 * c), round16(_mm512_loadu_ps(q.as_ptr().add(16 * c))));
        }
        sc.fill(f32::NEG_INFINITY);
        for j in lo..=pos {
            let Some((k, _)) = kv.rows_f16(j, kvh) else { return };
            let s = if batch {
                let mut acc = _mm512_setzero_ps();
                for c in 0..hd / 16 {
                    acc =
                        _mm512_fmadd_ps(load_h(k.as_ptr().add(16 * c)), _mm512_loadu_ps(qr.as_ptr().add(16 * c)), acc);
                }
                reduce(acc)
            } else {
                let mut acc = [_mm512_setzero_ps(); 4];
                for c in 0..hd / 64 {
                    for (a, acc) in acc.iter_mut().enumerate() {
                        let e = 64 * c + 16 * a;
                        *acc = _mm512_fmadd_ps(load_h(k.as_ptr().add(e)), _mm512_loadu_ps(qr.as_ptr().add(e)), *acc);
                    }
                }
                reduce(_mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3])))
            };
            sc[j] = s * sh.kq_scale;
        }
        let max = sc[lo..=pos].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let vmax = _mm512_set1_ps(max);
        let mut sum = 0f64;
        for c in lo / 16..=pos / 16 {
            let e = v_expf16(_mm512_sub_ps(_mm512_loadu_ps(sc.as_ptr().add(16 * c)), vmax));
            _mm512_storeu_ps(sc.as_mut_ptr().add(16 * c), e);
            sum += reduce(e) as f64;
        }
        let inv = _mm512_set1_ps((1.0 / sum) as f32);
        for c in lo / 16..=pos / 16 {
            let p = sc.as_mut_ptr().add(16 * c);
            _mm512_storeu_ps(p, round16(_mm512_mul_ps(_mm512_loadu_ps(p), inv)));
        }
        accs.fill(0.0);
        for j in lo..=pos {
            let Some((_, v)) = kv.rows_f16(j, kvh) else { return };
            let p = _mm512_set1_ps(sc[j]);
            let a = accs.as_mut_ptr().add((j % nacc) * hd);
            for c in 0..hd / 16 {
                let ap = a.add(16 * c);
                _mm512_storeu_ps(ap, _mm512_fmadd_ps(load_h(v.as_ptr().add(16 * c)), p, _mm512_loadu_ps(ap)));
            }
        }
        let ld = |l: usize, c: usize| _mm512_loadu_ps(accs.as_ptr().add(l * hd + 16 * c));
        for c in 0..hd / 16 {
            // Per output t: r[l] over the 16 lanes (for the 4x16 form first (a0+a2)+(a1+a3)).
            let r: [__m512; 16] = if batch {
                core::array::from_fn(|l| ld(l, c))
            } else {
                core::array::from_fn(|l| {
                    _mm512_add_ps(_mm512_add_ps(ld(l, c), ld(l + 32, c)), _mm512_add_ps(ld(l + 16, c), ld(l + 48, c)))
                })
            };
            let t8: [__m512; 8] = core::array::from_fn(|l| _mm512_add_ps(r[l], r[l + 8]));
            let t4: [__m512; 4] = core::array::from_fn(|l| _mm512_add_ps(t8[l], t8[l + 4]));
            let res = _mm512_add_ps(_mm512_add_ps(t4[0], t4[2]), _mm512_add_ps(t4[1], t4[3]));
            _mm512_storeu_ps(o.as_mut_ptr().add(16 * c), res);
        }
    }
}

fn f16_to_f32(h: u16) -> f32 {
    quant::f16_to_f32(h)
}

/// `_mm512_reduce_add_ps` as GCC expands it (halves added pairwise down to one lane).
fn reduce16(a: &[f32; 16]) -> f32 {
    let mut t8 = [0f32; 8];
    for i in 0..8 {
        t8[i] = a[i] + a[i + 8];
    }
    let t4 = [t8[0] + t8[4], t8[1] + t8[5], t8[2] + t8[6], t8[3] + t8[7]];
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

/// `ggml_vec_dot_f16` on AVX-512: four 16-lane FMA accumulators over steps of 64, reduced
/// (0+2, 1+3, then 0+1) and summed across lanes; leftovers added in f64.
fn vec_dot_f16(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len();
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, al) in a.iter_mut().enumerate() {
                let k = i + j * 16 + l;
                *al = x[k].mul_add(y[k], *al);
            }
        }
    }
    let mut r = [0f32; 16];
    for l in 0..16 {
        r[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let mut s = reduce16(&r) as f64;
    for k in np..n {
        s += (x[k] * y[k]) as f64;
    }
    s as f32
}

/// llamafile tinyBLAS f16 dot on AVX-512: one 16-lane FMA accumulator, then reduced.
fn tinyblas_dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for (k, (a, b)) in x.iter().zip(y).enumerate() {
        acc[k % 16] = a.mul_add(*b, acc[k % 16]);
    }
    reduce16(&acc)
}

/// One lane of ggml's AVX-512 `ggml_v_expf` (range reduction by 2^n, degree-5 polynomial,
/// `scalef`); 0 / inf beyond |n| > 192.
fn v_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // log2(e)
    let n = z - r;
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let b = (-n).mul_add(f32::from_bits(0x35bf_be8e), (-n).mul_add(f32::from_bits(0x3f31_7200), x));
    let u = b * b;
    let c = |bits: u32| f32::from_bits(bits);
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
        .mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
    // scalef: exact power-of-two scaling, one rounding (matters only for subnormal results).
    ((j as f64) * 2f64.powi(n as i32)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::{KvCache, KvType, LayerCache};

    /// The SIMD ggml-order attention gives the same bits as the scalar definition: one token
    /// (`ggml_vec_dot_f16` order) and batches (tinyBLAS order), positions across several
    /// 256-cell pads, sliding windows, GQA, values with a wide range.
    #[test]
    fn attend_ggml_simd_matches_scalar_bitwise() {
        for (nkv, nh) in [(1, 4), (2, 6)] {
            simd_matches_scalar(nkv, nh);
        }
    }

    fn simd_matches_scalar(nkv: usize, nh: usize) {
        let (hd, cap) = (256, 700);
        let mut cache = KvCache::new(KvType::F16, cap, &[(nkv, hd)]);
        let LayerCache::Attention(kv) = &mut cache.layers[0];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        for p in 0..cap {
            let k: Vec<f32> = (0..nkv * hd).map(|i| rnd() * if i % 37 == 0 { 40.0 } else { 3.0 }).collect();
            let v: Vec<f32> = (0..nkv * hd).map(|_| rnd() * 5.0).collect();
            kv.write(p, &k, &v);
        }
        for (pos0, n, window) in [
            (0usize, 1usize, None),
            (5, 1, None),
            (255, 1, None),
            (256, 1, Some(512)),
            (699, 1, Some(512)),
            (0, 7, None),
            (250, 12, None),
            (600, 100, Some(512)),
            (0, 3, Some(2)),
            (3, 5, None),
            (100, 37, Some(40)),
            (17, 18, Some(20)),
        ] {
            let q: Vec<f32> = (0..n * nh * hd).map(|_| rnd() * 2.0).collect();
            let sh = Shape { n_head: nh, n_head_kv: nkv, head_dim: hd, pos0, window, kq_scale: 1.0, ggml_exact: true };
            let mut want = vec![0f32; n * nh * hd];
            attend_ggml_scalar(kv, &q, &mut want, sh);
            let mut got = vec![f32::NAN; n * nh * hd];
            attend_ggml(kv, &q, &mut got, sh);
            for i in 0..want.len() {
                assert_eq!(
                    got[i].to_bits(),
                    want[i].to_bits(),
                    "pos0 {pos0} n {n} window {window:?} [{i}]: {} vs {}",
                    got[i],
                    want[i]
                );
            }
        }
    }

    /// Sliding window and GQA head mapping against a direct computation on the stored rows.
    #[test]
    fn window_and_gqa_match_direct_softmax() {
        let (hd, nkv, nh, cap) = (8, 2, 4, 12);
        let mut cache = KvCache::new(KvType::F16, cap, &[(nkv, hd)]);
        let LayerCache::Attention(kv) = &mut cache.layers[0];
        let val = |p: usize, i: usize| ((p * 31 + i * 7) % 17) as f32 * 0.1 - 0.8;
        let mut rows_k = Vec::new();
        let mut rows_v = Vec::new();
        for p in 0..cap {
            let k: Vec<f32> = (0..nkv * hd).map(|i| crate::f16::round_f16(val(p, i))).collect();
            let v: Vec<f32> = (0..nkv * hd).map(|i| crate::f16::round_f16(val(p + 3, i) * 0.5)).collect();
            kv.write(p, &k, &v);
            rows_k.push(k);
            rows_v.push(v);
        }
        let q: Vec<f32> = (0..nh * hd).map(|i| crate::f16::round_f16((i % 5) as f32 * 0.25 - 0.5)).collect();
        for window in [None, Some(3)] {
            let pos = 9;
            let mut out = vec![0f32; nh * hd];
            attend(
                kv,
                &q,
                &mut out,
                Shape { n_head: nh, n_head_kv: nkv, head_dim: hd, pos0: pos, window, kq_scale: 0.5, ggml_exact: false },
            );
            let lo = window.map_or(0, |w| pos + 1 - w);
            for h in 0..nh {
                let g = h / (nh / nkv);
                let s: Vec<f64> = (lo..=pos)
                    .map(|j| (0..hd).map(|t| q[h * hd + t] as f64 * rows_k[j][g * hd + t] as f64).sum::<f64>() * 0.5)
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for t in 0..hd {
                    let want: f64 =
                        (lo..=pos).zip(&s).map(|(j, x)| (x - m).exp() / z * rows_v[j][g * hd + t] as f64).sum();
                    let got = out[h * hd + t] as f64;
                    assert!((got - want).abs() < 2e-3, "window {window:?} head {h} dim {t}: {got} vs {want}");
                }
            }
        }
    }

    /// An f32 cache (`--kv f32`) keeps the rows exact: `attend` and `attend_ordered` equal a
    /// direct f64 softmax attention on the unrounded rows to f32 rounding (GQA, a window).
    #[test]
    fn f32_cache_matches_direct_softmax() {
        let (hd, nkv, nh, cap) = (16, 2, 4, 20);
        let mut cache = KvCache::new(KvType::F32, cap, &[(nkv, hd)]);
        let LayerCache::Attention(kv) = &mut cache.layers[0];
        assert!(!kv.is_f16() && kv.planes_f16().is_none());
        let val = |p: usize, i: usize| ((p * 131 + i * 71) % 997) as f32 / 997.0 * 1.7 - 0.85;
        let (mut rows_k, mut rows_v) = (Vec::new(), Vec::new());
        for p in 0..cap {
            let k: Vec<f32> = (0..nkv * hd).map(|i| val(p, i) + 1e-4).collect();
            let v: Vec<f32> = (0..nkv * hd).map(|i| val(p + 5, i) * 0.5 + 1e-4).collect();
            kv.write(p, &k, &v);
            rows_k.push(k);
            rows_v.push(v);
        }
        let q: Vec<f32> = (0..nh * hd).map(|i| val(99, i) * 1.3).collect();
        for window in [None, Some(5)] {
            let pos = 17;
            let sh = Shape {
                n_head: nh,
                n_head_kv: nkv,
                head_dim: hd,
                pos0: pos,
                window,
                kq_scale: 0.25,
                ggml_exact: false,
            };
            let (mut fast, mut ordered) = (vec![0f32; nh * hd], vec![0f32; nh * hd]);
            attend(kv, &q, &mut fast, sh);
            attend_ordered(kv, &q, &mut ordered, sh);
            let lo = window.map_or(0, |w| pos + 1 - w);
            for h in 0..nh {
                let g = h / (nh / nkv);
                let s: Vec<f64> = (lo..=pos)
                    .map(|j| (0..hd).map(|t| q[h * hd + t] as f64 * rows_k[j][g * hd + t] as f64).sum::<f64>() * 0.25)
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for t in 0..hd {
                    let want: f64 =
                        (lo..=pos).zip(&s).map(|(j, x)| (x - m).exp() / z * rows_v[j][g * hd + t] as f64).sum();
                    for (what, got) in [("attend", fast[h * hd + t]), ("attend_ordered", ordered[h * hd + t])] {
                        assert!(
                            (got as f64 - want).abs() < 1e-5,
                            "{what} window {window:?} head {h} dim {t}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
