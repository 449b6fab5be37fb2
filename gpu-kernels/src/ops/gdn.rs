//! Gated DeltaNet (Flash-Next's recurrent layers), the token mixer between the projections:
//! causal depthwise conv + SiLU with its rolling state, q/k L2 norms, the gated delta rule
//! (state update and readout, one token after another) and the gated RMS norm. The host
//! reference is `model::qwen4exp::gdn::mix` (engine); the order of every sum is the same, the
//! transcendental functions are `quant::fmath`'s (within 2 ulp of the CPU's libm), so results
//! agree to a few ulp (`GpuOps::gdn_*`, tests/gpu/gpu_ops_gdn.rs).
//!
//! Index math is u32; every kernel returns early for work-items past the end.
use super::quantize::quantize_wave_q8_1;
use super::unroll;
use crate::abi::{
    GDN_CHUNK_BLOCK, GDN_CHUNK_MAX, GDN_CHUNK_MAX_HEAD_DIM, GDN_CHUNK_PASS, GDN_DELTA_BLOCK, Q8_1_BYTES, WAVES_PER_WG,
    WG_SIZE,
};
use crate::arch::{Lds, barrier, fp_fence, group_id, lane_id, read_lane_f64, thread_id, wave_id};
use quant::fmath::{expf, sigmoid, silu, softplus};
use quant::util::sqrtf;

/// One work-item per conv channel `ch` of `C`: `u[t][ch] = silu(Σ_k taps[ch][k] ·
/// h[t + k][ch])` over `h = [state | m]` (`K − 1` history rows, then the `n` new rows), then
/// `state ← the last K − 1 rows of h`.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn gdn_conv_silu_f32(
    m: *const f32,
    state: *mut f32,
    taps: *const f32,
    u: *mut f32,
    n_tokens: u32,
    channels: u32,
    conv_k: u32,
    _pad: u32,
) {
    let ch = group_id() * WG_SIZE + thread_id();
    if ch >= channels || conv_k == 0 {
        return;
    }
    let hist = conv_k - 1;
    // SAFETY: ABI (abi::GdnConvArgs): m and u are [n_tokens][channels], state is
    // [conv_k - 1][channels], taps [channels][conv_k]; this item owns column `ch` of all of
    // them, and the state row j is overwritten only after every row > j was read.
    unsafe {
        let h = |r: u32| -> f32 {
            if r < hist {
                *state.add((r * channels + ch) as usize)
            } else {
                *m.add(((r - hist) * channels + ch) as usize)
            }
        };
        let tap = taps.add((ch * conv_k) as usize);
        for t in 0..n_tokens {
            let mut acc = 0f32;
            for k in 0..conv_k {
                acc += h(t + k) * *tap.add(k as usize);
            }
            *u.add((t * channels + ch) as usize) = silu(acc);
        }
        for j in 0..hist {
            let v = h(n_tokens + j);
            *state.add((j * channels + ch) as usize) = v;
        }
    }
}

/// One wave per (token, head) row of `head_dim` at `x[t * token_stride + h * head_dim]`:
/// `x ← x / sqrt(Σ x² + eps)`, the sum one f64 chain of f32-rounded squares (lane 0, as the
/// CPU's iterator sum), a correctly rounded sqrt and division.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn gdn_l2_norm_f32(
    x: *mut f32,
    n_tokens: u32,
    n_heads: u32,
    head_dim: u32,
    token_stride: u32,
    eps: f32,
    _pad: u32,
) {
    let row = group_id() * WAVES_PER_WG + wave_id();
    if row >= n_tokens * n_heads || head_dim == 0 {
        return;
    }
    let lane = lane_id();
    // SAFETY: ABI (abi::GdnL2NormArgs): x holds n_tokens rows of token_stride f32 with
    // n_heads * head_dim <= token_stride; this wave owns its row and reads it before writing.
    unsafe {
        let r = x.add(((row / n_heads) * token_stride + (row % n_heads) * head_dim) as usize);
        let mut s = 0f64;
        if lane == 0 {
            for i in 0..head_dim {
                let v = *r.add(i as usize);
                s += (v * v) as f64;
            }
        }
        let inv = 1.0 / sqrtf(read_lane_f64(s, 0) as f32 + eps);
        let mut i = lane;
        while i < head_dim {
            *r.add(i as usize) *= inv;
            i += 32;
        }
    }
}

/// One workgroup of `GDN_DELTA_BLOCK` per value head `h`; work-item `j` owns columns `j, j +
/// GDN_DELTA_BLOCK, ..` of the head's state `M [S key][S value]`. Per token: `β = σ(b)`,
/// `e = exp(softplus(a_t + dt_bias) · ssm_a)`, `δ = β (v − (eM)ᵀk)`, `M ← eM + k δᵀ`,
/// `o = Mᵀq / √S`. Two passes over M a token (read; read + write); each column is one
/// work-item's, so no barrier. Value head h reads key head `h mod Hk`; `u` is the conv
/// output `[n][C]` with q, k (already L2-normalised) then v.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn gdn_delta_rule_f32(
    u: *const f32,
    beta: *const f32,
    alpha: *const f32,
    dt_bias: *const f32,
    ssm_a: *const f32,
    state: *mut f32,
    o: *mut f32,
    n_tokens: u32,
    hk: u32,
    hv: u32,
    s: u32,
    channels: u32,
    _pad: u32,
) {
    let h = group_id();
    if h >= hv || hk == 0 || s == 0 {
        return;
    }
    let kd = hk * s;
    let vd = hv * s;
    let scale = 1.0 / sqrtf(s as f32);
    // SAFETY: ABI (abi::GdnDeltaArgs): u is [n_tokens][channels] with channels = 2 kd + vd,
    // beta/alpha [n_tokens][hv], dt_bias/ssm_a [hv], state [hv][s][s], o [n_tokens][vd]; this
    // workgroup owns head h's state and outputs, this item its columns.
    unsafe {
        let mh = state.add((h * s * s) as usize);
        let (dt, a) = (*dt_bias.add(h as usize), *ssm_a.add(h as usize));
        for t in 0..n_tokens {
            let b = sigmoid(*beta.add((t * hv + h) as usize));
            let decay = expf(softplus(*alpha.add((t * hv + h) as usize) + dt) * a);
            let row = u.add((t * channels) as usize);
            let q = row.add(((h % hk) * s) as usize);
            let k = row.add((kd + (h % hk) * s) as usize);
            let v = row.add((2 * kd + h * s) as usize);
            let mut j = thread_id();
            while j < s {
                let mut kv = 0f32;
                for i in 0..s {
                    kv += (*mh.add((i * s + j) as usize) * decay) * *k.add(i as usize);
                }
                let d = (*v.add(j as usize) - kv) * b;
                let mut acc = 0f32;
                for i in 0..s {
                    let p = mh.add((i * s + j) as usize);
                    let nm = *p * decay + *k.add(i as usize) * d;
                    *p = nm;
                    acc += nm * *q.add(i as usize);
                }
                *o.add((t * vd + h * s + j) as usize) = acc * scale;
                j += GDN_DELTA_BLOCK;
            }
        }
    }
}

/// `each64!(|i| { .. })`: the block 64 times with `i` = 0..63 as a constant, so a `[f32; 64]`
/// indexed by it stays in VGPRs. (Nested `unroll` closures are not always inlined at this
/// size; a closure left as a call indexes the array at run time and puts it in scratch.)
macro_rules! each64 {
    (|$i:ident| $body:block) => {
        each64!(@ $i $body; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63)
    };
    (@ $i:ident $body:block; $($n:literal)*) => {{
        $({
            let $i: usize = $n;
            $body
        })*
    }};
}

/// The delta rule for head dim S = 128 (Flash-Next) with the state in registers for the whole
/// window: the state is read and written once a launch, not read twice and written once a
/// token. One workgroup of [`GDN_S128_BLOCK`] = 256 per value head; work-item `(half, j)` holds
/// rows `64·half .. 64·half + 63` of column j (64 VGPRs: a whole column spills). Each Σ over
/// the 128 rows is the two halves' sequential sums added low half first, through LDS (`[2][128]`
/// f32 partial sums, then the token's k and q); otherwise the arithmetic is
/// [`gdn_delta_rule_f32`]'s.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn gdn_delta_rule_s128_f32(
    u: *const f32,
    beta: *const f32,
    alpha: *const f32,
    dt_bias: *const f32,
    ssm_a: *const f32,
    state: *mut f32,
    o: *mut f32,
    n_tokens: u32,
    hk: u32,
    hv: u32,
    s: u32,
    channels: u32,
    _pad: u32,
) {
    const S: u32 = 128;
    let h = group_id();
    // Wave-uniform (the whole workgroup returns together: no barrier is left waiting).
    if h >= hv || hk == 0 || s != S {
        return;
    }
    let (half, j) = (thread_id() / S, thread_id() % S);
    let (kd, vd) = (hk * S, hv * S);
    let scale = 1.0 / sqrtf(S as f32);
    let lds = Lds::get();
    // Both halves' partial sums of column j, then their total (low half first).
    let exchange = |part: f32| -> f32 {
        // SAFETY: the launch has GDN_S128_LDS_BYTES of LDS, words 0..256 the partial sums;
        // (half, j) alone writes word half * 128 + j, and the barriers order the writes, the
        // reads and the next writes.
        unsafe {
            lds.st32(4 * (half * S + j), part.to_bits());
            barrier();
            let total = f32::from_bits(lds.ld32(4 * j)) + f32::from_bits(lds.ld32(4 * (S + j)));
            barrier();
            total
        }
    };
    // SAFETY: ABI (abi::GdnDeltaArgs) with s = 128; this workgroup owns head h's state and
    // outputs, work-item (half, j) its 64 rows of column j; o[t][h][j] is written by half 0.
    unsafe {
        let mh = state.add((h * S * S + half * 64 * S + j) as usize);
        let mut col = [0f32; 64];
        each64!(|i| { col[i] = *mh.add(i * S as usize) });
        let (dt, a) = (*dt_bias.add(h as usize), *ssm_a.add(h as usize));
        for t in 0..n_tokens {
            let b = sigmoid(*beta.add((t * hv + h) as usize));
            let decay = expf(softplus(*alpha.add((t * hv + h) as usize) + dt) * a);
            let row = u.add((t * channels) as usize);
            // Stage the token's k (words 256..384) and q (384..512) once a workgroup: every
            // work-item reads 64 of each, the same for the whole wave. The previous token's
            // reads are behind the last exchange's barrier.
            let src = if half == 0 { kd + (h % hk) * S + j } else { (h % hk) * S + j };
            lds.st32(4 * (2 * S + half * S + j), (*row.add(src as usize)).to_bits());
            barrier();
            let (k_off, q_off) = (4 * (2 * S + half * 64), 4 * (3 * S + half * 64));
            let k = |i: usize| f32::from_bits(lds.ld32(k_off + 4 * i as u32));
            let q = |i: usize| f32::from_bits(lds.ld32(q_off + 4 * i as u32));
            let mut kv = 0f32;
            each64!(|i| { kv += (col[i] * decay) * k(i) });
            let kv = exchange(kv);
            let d = (*row.add((2 * kd + h * S + j) as usize) - kv) * b;
            let mut acc = 0f32;
            each64!(|i| {
                // `fp_fence`: CSE of `col[i] * decay` with the first pass would keep 64 more
                // products alive.
                let nm = fp_fence(col[i]) * decay + k(i) * d;
                col[i] = nm;
                acc += nm * q(i);
            });
            let acc = exchange(acc);
            if half == 0 {
                *o.add((t * vd + h * S + j) as usize) = acc * scale;
            }
        }
        each64!(|i| { *mh.add(i * S as usize) = col[i] });
    }
}

/// One wave per row of `n` (a value head of a token): `o ← rms(o) · w · σ(z)`, the RMS norm
/// in the CPU's order (one f64 chain of f32-rounded squares, `(x · scale) · w`).
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn gdn_gated_norm_f32(
    o: *mut f32,
    z: *const f32,
    w: *const f32,
    q: *mut u8,
    n_rows: u32,
    n: u32,
    eps: f32,
    _pad: u32,
) {
    let row = group_id() * WAVES_PER_WG + wave_id();
    if row >= n_rows || n == 0 {
        return;
    }
    if !q.is_null() && !n.is_multiple_of(32) {
        core::intrinsics::abort(); // the host never launches this (GpuOps::gdn_* check)
    }
    let lane = lane_id();
    // SAFETY: ABI (abi::GdnGatedNormArgs): o and z hold n_rows rows of n f32, w holds n; this
    // wave owns row `row` of o and reads it before writing.
    unsafe {
        let (r, zr) = (o.add((row * n) as usize), z.add((row * n) as usize));
        let mut sum = 0f64;
        if lane == 0 {
            for i in 0..n {
                let v = *r.add(i as usize);
                sum += (v * v) as f64;
            }
        }
        let mean = (read_lane_f64(sum, 0) / n as f64) as f32;
        let scale = 1.0 / sqrtf(mean + eps);
        let mut i = lane;
        while i < n {
            let p = r.add(i as usize);
            let v = (*p * scale) * *w.add(i as usize) * sigmoid(*zr.add(i as usize));
            *p = v;
            if !q.is_null() {
                // Block (row·n + i - lane) / 32 of the Q8_1 rows (n is a multiple of 32).
                quantize_wave_q8_1(v, q.add(((row * n + i - lane) / 32 * Q8_1_BYTES) as usize));
            }
            i += 32;
        }
    }
}

/// The chunked (prefill) form of the delta rule, `Gdn::mix`'s `GdnMode::Chunked`: with `G_t`
/// the in-chunk cumulative sum of `g = softplus(α + dt_bias)·ssm_a`, each chunk of up to
/// `chunk` tokens solves `δ_t = β_t (v_t − e^{G_t} M₀ᵀk_t) − Σ_{i<t} β_t e^{G_t−G_i} (k_t·k_i) δ_i`
/// by forward substitution, then `o_t = (e^{G_t} M₀ᵀq_t + Σ_{i≤t} e^{G_t−G_i} (q_t·k_i) δ_i) / √S`
/// and `M ← e^{G_L} M₀ + Σ_i e^{G_L−G_i} k_i δ_iᵀ`: the state is read and written once a chunk
/// instead of once a token, and the pairwise dots are shared by every column. One workgroup of
/// [`GDN_CHUNK_BLOCK`] per value head: the chunk's `G`, `β` and the `k·k`, `q·k` triangles live
/// in LDS ([`GDN_CHUNK_LDS_BYTES`]); work-item `j` owns state columns `j, j + 128, ..` and their
/// `M₀ᵀk_t` (then `δ_t` in its place) and `M₀ᵀq_t` in the global scratch
/// `delta [Hv][2·chunk][S]`. The column is read [`GDN_CHUNK_PASS`] tokens a pass for `M₀ᵀk` and
/// `M₀ᵀq` (accumulators in registers) and rewritten once per as many `δ_i` at the end, instead
/// of once a token each; those tokens' k and q rows are staged in LDS once for the workgroup
/// (head dims up to [`GDN_CHUNK_MAX_HEAD_DIM`]). Every sum is in the CPU's order.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn gdn_delta_chunked_f32(
    u: *const f32,
    beta: *const f32,
    alpha: *const f32,
    dt_bias: *const f32,
    ssm_a: *const f32,
    state: *mut f32,
    o: *mut f32,
    delta: *mut f32,
    n_tokens: u32,
    hk: u32,
    hv: u32,
    s: u32,
    channels: u32,
    chunk: u32,
) {
    const CH: u32 = GDN_CHUNK_MAX;
    const GC: u32 = 0;
    const BT: u32 = 4 * CH;
    const KK: u32 = 8 * CH;
    const QK: u32 = 8 * CH + 4 * CH * CH;
    const PASS: usize = GDN_CHUNK_PASS as usize;
    // PASS rows of k, then PASS of q, of up to GDN_CHUNK_MAX_HEAD_DIM values.
    const KQ: u32 = 8 * CH + 8 * CH * CH;
    let h = group_id();
    // Wave-uniform: the whole workgroup returns together.
    if h >= hv || hk == 0 || s == 0 || s > GDN_CHUNK_MAX_HEAD_DIM || chunk == 0 || chunk > CH {
        return;
    }
    let tid = thread_id();
    let (kd, vd) = (hk * s, hv * s);
    let scale = 1.0 / sqrtf(s as f32);
    let lds = Lds::get();
    // SAFETY: ABI (abi::GdnChunkArgs): u is [n_tokens][channels] with channels = 2 kd + vd (q
    // and k L2-normalised), beta/alpha [n_tokens][hv], dt_bias/ssm_a [hv], state [hv][s][s], o
    // [n_tokens][vd], delta [hv][chunk][s]; the launch has GDN_CHUNK_LDS_BYTES of LDS. This
    // workgroup owns head h's state, outputs and scratch, this item its columns; LDS entries are
    // written between barriers by one item and read after the next barrier.
    unsafe {
        let mh = state.add((h * s * s) as usize);
        let dl = delta.add((h * 2 * chunk * s) as usize);
        let (dt, a) = (*dt_bias.add(h as usize), *ssm_a.add(h as usize));
        let hki = h % hk;
        let qrow = |t: u32| u.add((t * channels + hki * s) as usize);
        let krow = |t: u32| u.add((t * channels + kd + hki * s) as usize);
        let vrow = |t: u32| u.add((t * channels + 2 * kd + h * s) as usize);
        let ldf = |off: u32| f32::from_bits(lds.ld32(off));
        let dot = |x: *const f32, y: *const f32| {
            let mut acc = 0f32;
            for i in 0..s {
                acc += *x.add(i as usize) * *y.add(i as usize);
            }
            acc
        };
        let mut c0 = 0;
        while c0 < n_tokens {
            let l = chunk.min(n_tokens - c0);
            if tid < l {
                let t = c0 + tid;
                let g = softplus(*alpha.add((t * hv + h) as usize) + dt) * a;
                lds.st32(GC + 4 * tid, g.to_bits());
                lds.st32(BT + 4 * tid, sigmoid(*beta.add((t * hv + h) as usize)).to_bits());
            }
            barrier();
            if tid == 0 {
                let mut acc = 0f32;
                for t in 0..l {
                    acc += ldf(GC + 4 * t);
                    lds.st32(GC + 4 * t, acc.to_bits());
                }
            }
            // The chunk's k·k (i < t) and q·k (i <= t) triangles.
            let mut p = tid;
            while p < l * l {
                let (t, i) = (p / l, p % l);
                if i <= t {
                    let ki = krow(c0 + i);
                    if i < t {
                        lds.st32(KK + 4 * p, dot(krow(c0 + t), ki).to_bits());
                    }
                    lds.st32(QK + 4 * p, dot(qrow(c0 + t), ki).to_bits());
                }
                p += GDN_CHUNK_BLOCK;
            }
            barrier();
            let gl = ldf(GC + 4 * (l - 1));
            // Rows of PASS tokens staged in LDS for every column: k (and q) of tokens t0.. .
            let stage = |t0: u32, with_q: bool| {
                barrier(); // the previous pass's readers are done
                let mut p = tid;
                while p < PASS as u32 * s {
                    let (u, i) = (p / s, p % s);
                    if t0 + u < l {
                        lds.st32(KQ + 4 * p, (*krow(c0 + t0 + u).add(i as usize)).to_bits());
                        if with_q {
                            lds.st32(KQ + 4 * (PASS as u32 * s + p), (*qrow(c0 + t0 + u).add(i as usize)).to_bits());
                        }
                    }
                    p += GDN_CHUNK_BLOCK;
                }
                barrier();
            };
            let kst = |u: usize, i: u32| ldf(KQ + 4 * (u as u32 * s + i));
            let qst = |u: usize, i: u32| ldf(KQ + 4 * ((PASS as u32 + u as u32) * s + i));
            // Column blocks in lockstep (every item takes the barriers), item j live if j < s.
            for jb in 0..s.div_ceil(GDN_CHUNK_BLOCK) {
                let j = jb * GDN_CHUNK_BLOCK + tid;
                let live = j < s;
                let col = |i: u32| mh.add((i * s + j) as usize);
                // M₀ᵀk_t, then δ_t in its place; M₀ᵀq_t.
                let d_at = |t: u32| dl.add((t * s + j) as usize);
                let mq_at = |t: u32| dl.add(((chunk + t) * s + j) as usize);
                // M₀ᵀk_t and M₀ᵀq_t, PASS tokens per read of the column (each sum over i in order).
                let mut t0 = 0;
                while t0 < l {
                    stage(t0, true);
                    if live {
                        let (mut ak, mut aq) = ([0f32; PASS], [0f32; PASS]);
                        for i in 0..s {
                            let m = *col(i);
                            unroll::<PASS>(|u| {
                                if t0 + (u as u32) < l {
                                    ak[u] += m * kst(u, i);
                                    aq[u] += m * qst(u, i);
                                }
                            });
                        }
                        unroll::<PASS>(|u| {
                            let t = t0 + u as u32;
                            if t < l {
                                *d_at(t) = ak[u];
                                *mq_at(t) = aq[u];
                            }
                        });
                    }
                    t0 += PASS as u32;
                }
                if live {
                    // Forward substitution for δ.
                    for t in 0..l {
                        let (gt, bt) = (ldf(GC + 4 * t), ldf(BT + 4 * t));
                        let mk = *d_at(t);
                        let mut d = bt * (*vrow(c0 + t).add(j as usize) - expf(gt) * mk);
                        for i in 0..t {
                            let aa = bt * expf(gt - ldf(GC + 4 * i)) * ldf(KK + 4 * (t * l + i));
                            d -= aa * *d_at(i);
                        }
                        *d_at(t) = d;
                    }
                    // Outputs.
                    for t in 0..l {
                        let gt = ldf(GC + 4 * t);
                        let mut ov = expf(gt) * *mq_at(t);
                        for i in 0..=t {
                            let aa = expf(gt - ldf(GC + 4 * i)) * ldf(QK + 4 * (t * l + i));
                            ov += aa * *d_at(i);
                        }
                        *o.add(((c0 + t) * vd + h * s + j) as usize) = ov * scale;
                    }
                }
                // Chunk-end state: each element scaled by e^{G_L}, then k_i δ_i added in order of
                // i, PASS of them per rewrite of the column.
                let el = expf(gl);
                let mut i0 = 0;
                while i0 < l {
                    stage(i0, false);
                    if live {
                        let (mut w, mut di) = ([0f32; PASS], [0f32; PASS]);
                        unroll::<PASS>(|u| {
                            let i = i0 + u as u32;
                            if i < l {
                                w[u] = expf(gl - ldf(GC + 4 * i));
                                di[u] = *d_at(i);
                            }
                        });
                        for x in 0..s {
                            let p = col(x);
                            let mut m = if i0 == 0 { *p * el } else { *p };
                            unroll::<PASS>(|u| {
                                if i0 + (u as u32) < l {
                                    m += (w[u] * kst(u, x)) * di[u];
                                }
                            });
                            *p = m;
                        }
                    }
                    i0 += PASS as u32;
                }
            }
            barrier();
            c0 += l;
        }
    }
}
