//! Attention for decode / verification windows in **ordered FP32** mode: every float
//! operation happens in the order of `model::attention::attend_ordered` (engine), so GPU
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
use crate::abi::attn_lds_bytes;
use crate::arch::{barrier, group_id, group_sum_f32, lane_id, wave_max_f32, Lds};
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
            // SAFETY: the host launches per abi::AttnArgs (engine/src/gpu/ops.rs).
            unsafe {
                attn::<$hd, $i8>(q, k, k_scale, v, v_scale, out, pos, n_tokens, n_head, n_head_kv, window, kq_scale, max_kv)
            }
        }
    )*};
}
attn_kernels!(define_attn);
