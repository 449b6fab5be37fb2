//! Gated DeltaNet (Flash-Next's recurrent layers), the token mixer between the projections:
//! causal depthwise conv + SiLU with its rolling state, q/k L2 norms, the gated delta rule
//! (state update and readout, one token after another) and the gated RMS norm. The host
//! reference is `model::qwen4exp::gdn::mix` (engine); the order of every sum is the same, the
//! transcendental functions are `quant::fmath`'s (within 2 ulp of the CPU's libm), so results
//! agree to a few ulp (`GpuOps::gdn_*`, tests/gpu_ops_gdn.rs).
//!
//! Index math is u32; every kernel returns early for work-items past the end.
use crate::abi::{GDN_DELTA_BLOCK, WAVES_PER_WG, WG_SIZE};
use crate::arch::{group_id, lane_id, read_lane_f64, thread_id, wave_id};
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

/// One wave per row of `n` (a value head of a token): `o ← rms(o) · w · σ(z)`, the RMS norm
/// in the CPU's order (one f64 chain of f32-rounded squares, `(x · scale) · w`).
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn gdn_gated_norm_f32(o: *mut f32, z: *const f32, w: *const f32, n_rows: u32, n: u32, eps: f32, _pad: u32) {
    let row = group_id() * WAVES_PER_WG + wave_id();
    if row >= n_rows || n == 0 {
        return;
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
            *p = (*p * scale) * *w.add(i as usize) * sigmoid(*zr.add(i as usize));
            i += 32;
        }
    }
}
