//! Attention for decode / verification windows in **ordered FP32** mode: every float
//! operation happens in the order of `cpu::attention::attend_ordered` (engine), so GPU
//! and CPU results are bit-identical. One wave (workgroup of `ATTN_BLOCK`) per (token, head):
//!
//! 1. the query row (rounded to f16 for an f16 cache, as ggml's f16 matmul does) is staged in
//!    LDS; lane `l` scores cells `lo + l, lo + l + 32, ...`: `s = sum_d k[d] * q[d]` in d order
//!    (int8: times the row scale), times `kq_scale`, kept in LDS;
//! 2. `max` over the wave; `e = expf(s - max)` (`quant::fmath`, plain f32), lane sums in cell
//!    order, added by the butterfly xor 1, 2, 4, 8, 16; `inv = 1 / sum`;
//! 3. lane `l` owns dims `l*R .. l*R + R` (R = head_dim / 32, at least 1) and adds
//!    `p_j * v_j[d]` for j = 0.. in order, `p_j = e_j * inv` (f16-rounded for an f16 cache;
//!    int8: `(p_j * v_scale_j) * q`).
use super::unroll;
use crate::abi::{attn_kernels, attn_lds_bytes};
use crate::arch::{Lds, barrier, group_id, group_sum_f32, lane_id, wave_max_f32};
use crate::mem::{f32_to_f16, ld_u32x2, ld_u32x4};
use quant::f16_to_f32;
use quant::fmath::expf;

#[inline(always)]
fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// # Safety
/// Arguments per `abi::AttnArgs`; the launch has `attn_lds_bytes(HD, max_kv)` bytes of LDS.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn attn<const HD: usize, const I8: bool>(
    q: *const f32,
    k: *const u8,
    k_scale: *const f32,
    v: *const u8,
    v_scale: *const f32,
    out: *mut f32,
    pos: *const u32,
    n_tokens: u32,
    n_head: u32,
    n_head_kv: u32,
    window: u32,
    kq_scale: f32,
    max_kv: u32,
) {
    const { assert!(HD % 8 == 0 && HD <= 256) };
    let r_per_lane: usize = if HD >= 32 { HD / 32 } else { 1 };
    let th = group_id();
    if n_head == 0 || n_head_kv == 0 || th >= n_tokens * n_head || n_head % n_head_kv != 0 {
        return;
    }
    let (t, h) = (th / n_head, th % n_head);
    let kvh = h / (n_head / n_head_kv);
    let lane = lane_id();
    let lds = Lds::get();
    let hd = HD as u32;
    let esz = if I8 { 1 } else { 2 };
    // SAFETY: ABI (abi::AttnArgs): q/out = [n_tokens][n_head][HD] f32, pos = n_tokens u32, the
    // caches hold rows [cell][n_head_kv][HD] (f16 or i8, 16-byte aligned rows since HD % 8 ==
    // 0 and the buffers are 16-byte aligned) for every cell <= pos[t], int8 scales
    // [cell][n_head_kv]; LDS holds HD + max_kv f32 (checked below); this wave owns (t, h).
    unsafe {
        let p = *pos.add(t as usize);
        let lo = if window > 0 && p + 1 > window { p + 1 - window } else { 0 };
        let m = p + 1 - lo;
        if m > max_kv || attn_lds_bytes(hd, max_kv) == 0 {
            core::intrinsics::abort();
        }
        let qrow = q.add((th * hd) as usize);
        let mut i = lane;
        while i < hd {
            let x = *qrow.add(i as usize);
            lds.st32(4 * i, if I8 { x } else { round_f16(x) }.to_bits());
            i += 32;
        }
        barrier();
        let sc = 4 * hd;
        // 1. scores
        let mut mx = f32::NEG_INFINITY;
        let mut jj = lane;
        while jj < m {
            let cell = (lo + jj) * n_head_kv + kvh;
            let row = k.add((cell * hd * esz) as usize);
            let mut s = 0f32;
            let mut c = 0u32;
            while c < hd {
                let qa = lds.ld128(4 * c);
                let qb = lds.ld128(4 * c + 16);
                let qv = [qa[0], qa[1], qa[2], qa[3], qb[0], qb[1], qb[2], qb[3]].map(f32::from_bits);
                let kv: [f32; 8] = if I8 {
                    let w = ld_u32x2(row.add(c as usize));
                    core::array::from_fn(|e| ((w[e / 4] >> (8 * (e % 4))) as u8 as i8) as f32)
                } else {
                    let w = ld_u32x4(row.add(2 * c as usize));
                    core::array::from_fn(|e| f16_to_f32((w[e / 2] >> (16 * (e % 2))) as u16))
                };
                unroll::<8>(|e| s += kv[e] * qv[e]);
                c += 8;
            }
            if I8 {
                s *= *k_scale.add(cell as usize);
            }
            s *= kq_scale;
            lds.st32(sc + 4 * jj, s.to_bits());
            mx = mx.max(s);
            jj += 32;
        }
        let mx = wave_max_f32(mx);
        // 2. exponentials and their sum
        let mut sum = 0f32;
        jj = lane;
        while jj < m {
            let e = expf(f32::from_bits(lds.ld32(sc + 4 * jj)) - mx);
            lds.st32(sc + 4 * jj, e.to_bits());
            sum += e;
            jj += 32;
        }
        let inv = 1.0 / group_sum_f32(sum, 5);
        barrier();
        // 3. weighted sum of V rows
        let d0 = lane * r_per_lane as u32;
        let active = d0 < hd;
        let mut acc = [0f32; 8];
        for jj in 0..m {
            let e = f32::from_bits(lds.ld32(sc + 4 * jj));
            let mut pj = e * inv;
            if !I8 {
                pj = round_f16(pj);
            }
            let cell = (lo + jj) * n_head_kv + kvh;
            if active {
                let row = v.add(((cell * hd + d0) * esz) as usize);
                if I8 {
                    let ps = pj * *v_scale.add(cell as usize);
                    unroll::<8>(|r| {
                        if r < r_per_lane {
                            acc[r] += ps * (*(row.add(r)) as i8) as f32;
                        }
                    });
                } else {
                    unroll::<8>(|r| {
                        if r < r_per_lane {
                            acc[r] += pj * f16_to_f32(*(row.add(2 * r) as *const u16));
                        }
                    });
                }
            }
        }
        if active {
            let o = out.add((th * hd + d0) as usize);
            unroll::<8>(|r| {
                if r < r_per_lane {
                    *o.add(r) = acc[r];
                }
            });
        }
    }
}

macro_rules! define_attn {
    ($($name:ident $i8:literal $hd:literal),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub extern "gpu-kernel" fn $name(
            q: *const f32, k: *const u8, k_scale: *const f32, v: *const u8, v_scale: *const f32,
            out: *mut f32, pos: *const u32, n_tokens: u32, n_head: u32, n_head_kv: u32,
            window: u32, kq_scale: f32, max_kv: u32,
        ) {
            // SAFETY: the host launches per abi::AttnArgs (gpu-executor/src/ops.rs).
            unsafe {
                attn::<$hd, $i8>(q, k, k_scale, v, v_scale, out, pos, n_tokens, n_head, n_head_kv, window, kq_scale, max_kv)
            }
        }
    )*};
}
attn_kernels!(define_attn);

// ------------------------------------------------------------------------------------------
// Fast mode: WMMA f16 tiles, online softmax, cells split over ATTN_FAST_WAVES waves.
//
// Rows = (token, head of the kv head's group) pairs, 16 per workgroup: row r of tile rt is
// token (16 rt + r) / G, head kvh * G + (16 rt + r) % G (G = n_head / n_head_kv), so GQA heads
// share every K/V load. Per block of 16 cells a wave computes Sᵀ = K · Qᵀ (A = K rows, contiguous
// in memory; B = query rows from LDS; C lane l = row l % 16, cells 2v + l / 16), masks, updates
// the running max / sum of its row (one row per lane, the other half of the cells in lane
// l ^ 16), then Oᵀ += Vᵀ · Pᵀ (A = V gathered per dim, B = probabilities rebuilt with one
// permlanex16 per register). The waves' (max, sum, O) are combined in LDS in wave order.
// Numerics: f16 query / probabilities (as ggml's f16 path), f32 accumulation, hardware exp2:
// tolerance-checked against the CPU, not bit-identical.
use crate::abi::{ATTN_FAST_BLOCK, ATTN_FAST_WAVES, attn_fast_kernels, attn_fast_lds_bytes};
use crate::arch::{
    other_half_f32, other_half_u32, read_lane_f32, thread_id, wave_id, wave_max_u32, wave_min_u32, wmma_f32_f16,
};

#[inline(always)]
fn exp2(x: f32) -> f32 {
    core::intrinsics::exp2f32(x)
}

/// # Safety
/// Arguments per `abi::AttnArgs`; launch `ATTN_FAST_BLOCK` work-items and
/// `attn_fast_lds_bytes(HD)` bytes of LDS.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn attn_fast<const HD: usize, const I8: bool>(
    q: *const f32,
    k: *const u8,
    k_scale: *const f32,
    v: *const u8,
    v_scale: *const f32,
    out: *mut f32,
    pos: *const u32,
    n_tokens: u32,
    n_head: u32,
    n_head_kv: u32,
    window: u32,
    kq_scale: f32,
) {
    const { assert!(HD % 16 == 0 && HD <= 256) };
    const LOG2E: f32 = core::f32::consts::LOG2_E;
    let hd = HD as u32;
    if n_head_kv == 0 || n_head % n_head_kv != 0 {
        return;
    }
    let grp = n_head / n_head_kv;
    let nrows = n_tokens * grp;
    let n_rt = nrows.div_ceil(16);
    let g = group_id();
    if g >= n_head_kv * n_rt {
        return; // workgroup-uniform
    }
    let (kvh, rt) = (g % n_head_kv, g / n_head_kv);
    let lane = lane_id();
    let w = wave_id();
    let tid = thread_id();
    let lds = Lds::get();
    let esz = if I8 { 1u32 } else { 2 };
    let m_off = 32 * hd;
    let l_off = m_off + ATTN_FAST_WAVES * 64;
    let o_off = l_off + ATTN_FAST_WAVES * 64;
    let _ = attn_fast_lds_bytes;
    // SAFETY: ABI (abi::AttnArgs) as for the ordered kernel; LDS holds attn_fast_lds_bytes(HD):
    // the query tile at 0 (16 x HD f16), maxima and sums of every wave, the output tile (16 x HD
    // f32) at o_off. Every LDS write is followed by a workgroup barrier before other waves read.
    unsafe {
        // Query tile (f16, zeros for rows past the end).
        let mut e = tid;
        while e < 16 * hd {
            let (row, d) = (e / hd, e % hd);
            let r = rt * 16 + row;
            let x = if r < nrows {
                let (t, h) = (r / grp, kvh * grp + r % grp);
                *q.add(((t * n_head + h) * hd + d) as usize)
            } else {
                0.0
            };
            *(lds_ptr(lds, 2 * e) as *mut u16) = f32_to_f16(x);
            e += ATTN_FAST_BLOCK;
        }
        // This lane's row and its cells lo..=p.
        let row = lane & 15;
        let r = rt * 16 + row;
        let valid_row = r < nrows;
        let (lo, p) = if valid_row {
            let p = *pos.add((r / grp) as usize);
            (if window > 0 && p + 1 > window { p + 1 - window } else { 0 }, p)
        } else {
            (u32::MAX, 0)
        };
        let kstart = wave_min_u32(lo);
        let kend = wave_max_u32(if valid_row { p + 1 } else { 0 });
        barrier();
        let nb = (kend - kstart).div_ceil(16);
        let mut m = f32::NEG_INFINITY;
        let mut lsum = 0f32;
        let mut o = [[0f32; 8]; 16];
        let half = lane >> 4;
        let mut b = w;
        while b < nb {
            let key0 = kstart + 16 * b;
            // Sᵀ = K · Qᵀ over HD / 16 chunks.
            let kc = (key0 + row).min(kend - 1);
            let krow = k.add(((kc * n_head_kv + kvh) * hd * esz) as usize);
            let mut s = [0f32; 8];
            let mut c = 0u32;
            while c < hd {
                // Each half-wave loads half of the 16-dim chunk; the halves swap (permlanex16)
                // so every lane holds the whole fragment, with every byte loaded once.
                let mine: [u32; 4] = if I8 {
                    let wv = ld_u32x2(krow.add((c + 8 * half) as usize));
                    core::array::from_fn(|i| {
                        let lo8 = ((wv[i / 2] >> (16 * (i % 2))) & 0xff) as u8 as i8;
                        let hi8 = ((wv[i / 2] >> (16 * (i % 2) + 8)) & 0xff) as u8 as i8;
                        (lo8 as f16).to_bits() as u32 | ((hi8 as f16).to_bits() as u32) << 16
                    })
                } else {
                    ld_u32x4(krow.add((2 * c + 16 * half) as usize))
                };
                let a = join_halves(mine, half);
                let q0 = lds.ld128(32 * row * hd / 16 + 2 * c);
                let q1 = lds.ld128(32 * row * hd / 16 + 2 * c + 16);
                s = wmma_f32_f16(a, [q0[0], q0[1], q0[2], q0[3], q1[0], q1[1], q1[2], q1[3]], s);
                c += 16;
            }
            // int8 row scales: lane loads the scale of cell key0 + row; element v needs cell
            // 2v + half's, read from that lane (v_readlane).
            let (ksl, vsl) = if I8 {
                let cell = (kc * n_head_kv + kvh) as usize;
                (*k_scale.add(cell), *v_scale.add(cell))
            } else {
                (1.0, 1.0)
            };
            let pick = |x: f32, vi: usize| {
                let (a, b) = (read_lane_f32(x, 2 * vi as u32), read_lane_f32(x, 2 * vi as u32 + 1));
                if half == 0 { a } else { b }
            };
            // Scale, mask, block max of this row.
            let mut bmax = f32::NEG_INFINITY;
            unroll::<8>(|vi| {
                let key = key0 + 2 * vi as u32 + half;
                let mut x = s[vi] * kq_scale;
                if I8 {
                    x *= pick(ksl, vi);
                }
                s[vi] = if valid_row && key >= lo && key <= p { x } else { f32::NEG_INFINITY };
                bmax = bmax.max(s[vi]);
            });
            let bmax = bmax.max(other_half_f32(bmax));
            let m_new = m.max(bmax);
            let alpha = if m_new == f32::NEG_INFINITY { 1.0 } else { exp2((m - m_new) * LOG2E) };
            let mut psum = 0f32;
            let mut pw = [0f32; 8];
            unroll::<8>(|vi| {
                let pv = if s[vi] == f32::NEG_INFINITY { 0.0 } else { exp2((s[vi] - m_new) * LOG2E) };
                psum += pv;
                let pv = if I8 { pv * pick(vsl, vi) } else { pv };
                pw[vi] = pv;
            });
            let psum = psum + other_half_f32(psum);
            lsum = lsum * alpha + psum;
            m = m_new;
            // Pᵀ fragment: lane holds its row's 16 cells, cell 2i from half 0, 2i + 1 from half 1.
            let mut pf = [0u32; 8];
            unroll::<8>(|vi| {
                let other = other_half_f32(pw[vi]);
                let (even, odd) = if half == 0 { (pw[vi], other) } else { (other, pw[vi]) };
                pf[vi] = f32_to_f16(even) as u32 | (f32_to_f16(odd) as u32) << 16;
            });
            // Oᵀ += Vᵀ · Pᵀ per 16-dim tile: lane gathers dim 16 dt + row of the 16 cells.
            let mut vrow = [0u32; 16];
            unroll::<8>(|i| {
                vrow[2 * i] = ((key0 + 2 * i as u32).min(kend - 1) * n_head_kv + kvh) * hd;
                vrow[2 * i + 1] = ((key0 + 2 * i as u32 + 1).min(kend - 1) * n_head_kv + kvh) * hd;
            });
            for dt in 0..HD / 16 {
                let d = (16 * dt) as u32 + row;
                // Half h gathers cells 8h .. 8h + 8 (words 4h .. 4h + 4), then the halves swap.
                let mine: [u32; 4] = core::array::from_fn(|i| {
                    let (c0, c1) =
                        if half == 0 { (vrow[2 * i], vrow[2 * i + 1]) } else { (vrow[2 * i + 8], vrow[2 * i + 9]) };
                    let (c0, c1) = (c0 + d, c1 + d);
                    if I8 {
                        let x0 = *v.add(c0 as usize) as i8 as f16;
                        let x1 = *v.add(c1 as usize) as i8 as f16;
                        x0.to_bits() as u32 | (x1.to_bits() as u32) << 16
                    } else {
                        let x0 = *(v.add(2 * c0 as usize) as *const u16);
                        let x1 = *(v.add(2 * c1 as usize) as *const u16);
                        x0 as u32 | (x1 as u32) << 16
                    }
                });
                let a = join_halves(mine, half);
                let mut acc = o[dt];
                unroll::<8>(|vi| acc[vi] *= alpha);
                o[dt] = wmma_f32_f16(a, pf, acc);
            }
            b += ATTN_FAST_WAVES;
        }
        // Combine the waves: maxima and sums first.
        if lane < 16 {
            lds.st32(m_off + 4 * (w * 16 + lane), m.to_bits());
            lds.st32(l_off + 4 * (w * 16 + lane), lsum.to_bits());
        }
        barrier();
        let mut mm = f32::NEG_INFINITY;
        for ww in 0..ATTN_FAST_WAVES {
            mm = mm.max(f32::from_bits(lds.ld32(m_off + 4 * (ww * 16 + row))));
        }
        let my_scale = if m == f32::NEG_INFINITY { 0.0 } else { exp2((m - mm) * LOG2E) };
        for ww in 0..ATTN_FAST_WAVES {
            if w == ww {
                for dt in 0..HD / 16 {
                    unroll::<8>(|vi| {
                        let d = (16 * dt + 2 * vi) as u32 + half;
                        let off = o_off + 4 * (row * hd + d);
                        let x = o[dt][vi] * my_scale;
                        let x = if ww == 0 { x } else { f32::from_bits(lds.ld32(off)) + x };
                        lds.st32(off, x.to_bits());
                    });
                }
            }
            barrier();
        }
        // Output rows: O / L.
        let mut e = tid;
        while e < 16 * hd {
            let (rr, d) = (e / hd, e % hd);
            let r = rt * 16 + rr;
            if r < nrows {
                let mut mm = f32::NEG_INFINITY;
                for ww in 0..ATTN_FAST_WAVES {
                    mm = mm.max(f32::from_bits(lds.ld32(m_off + 4 * (ww * 16 + rr))));
                }
                let mut l = 0f32;
                for ww in 0..ATTN_FAST_WAVES {
                    let mw = f32::from_bits(lds.ld32(m_off + 4 * (ww * 16 + rr)));
                    if mw != f32::NEG_INFINITY {
                        l += f32::from_bits(lds.ld32(l_off + 4 * (ww * 16 + rr))) * exp2((mw - mm) * LOG2E);
                    }
                }
                let (t, h) = (r / grp, kvh * grp + r % grp);
                *out.add(((t * n_head + h) * hd + d) as usize) = f32::from_bits(lds.ld32(o_off + 4 * e)) / l;
            }
            e += ATTN_FAST_BLOCK;
        }
    }
}

/// The 8-word fragment from this half's 4 words and the other half's: words 0..4 come from
/// half 0, 4..8 from half 1 (4 `v_permlanex16_b32`).
#[inline(always)]
fn join_halves(mine: [u32; 4], half: u32) -> [u32; 8] {
    let other = mine.map(other_half_u32);
    let (lo, hi) = if half == 0 { (mine, other) } else { (other, mine) };
    [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
}

/// Generic pointer to LDS byte `off` (for 2-byte stores).
#[inline(always)]
fn lds_ptr(lds: Lds, off: u32) -> *mut u8 {
    lds.ptr(off)
}

macro_rules! define_attn_fast {
    ($($name:ident $i8:literal $hd:literal),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub extern "gpu-kernel" fn $name(
            q: *const f32, k: *const u8, k_scale: *const f32, v: *const u8, v_scale: *const f32,
            out: *mut f32, pos: *const u32, n_tokens: u32, n_head: u32, n_head_kv: u32,
            window: u32, kq_scale: f32, _max_kv: u32,
        ) {
            // SAFETY: the host launches per abi::AttnArgs with ATTN_FAST_BLOCK work-items and
            // attn_fast_lds_bytes(head_dim) bytes of LDS (gpu-executor/src/ops.rs).
            unsafe { attn_fast::<$hd, $i8>(q, k, k_scale, v, v_scale, out, pos, n_tokens, n_head, n_head_kv, window, kq_scale) }
        }
    )*};
}
attn_fast_kernels!(define_attn_fast);
