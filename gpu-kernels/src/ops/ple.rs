//! The PLE n-gram block of Flash-Next on the device, after the host has gathered the table rows
//! of the window (`e`) and the key / value projections ran: the per-stream key/query gate, the
//! gated value's norm, and the dilated causal depthwise conv over the norm's history with its
//! residual update. The host reference is `PleCpu::forward` (engine, `cpu::qwen4exp::ple`): the
//! norms, the gate's dot product and the conv sum are in its order; sigmoid and SiLU are
//! `quant::fmath`'s (within 2 ulp of libm), hence a tolerance (`GpuOps::ple_block`,
//! tests/gpu/gpu_ops_ple.rs).
//!
//! Index math is u32; every kernel returns early for work-items past the end.
use super::rms_scale_ggml;
use crate::abi::{WAVES_PER_WG, WG_SIZE};
use crate::arch::{group_id, lane_id, read_lane_f32, thread_id, wave_id};
use quant::fmath::{sigmoid, silu};
use quant::util::sqrtf;

/// One wave per (token t, stream c), `o = (t · hc + c) · E`:
/// `Kc = rms(key[o..]; γ_key[c])`, `Q = rms(r[o..]; γ_query[c])`, `s = (Σ_i Kc_i Q_i) / √E` (one
/// f32 chain in lane 0), `gate = σ(sign(s) · √max(|s|, 1e-6))`, `gv[o + i] = gate · val[t][i]`,
/// `nn[o..] = rms(gv[o..]; γ_conv[c])`.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn ple_gate_f32(
    key: *const f32,
    r: *const f32,
    val: *const f32,
    norms: *const f32,
    gv: *mut f32,
    nn: *mut f32,
    n_tokens: u32,
    hc: u32,
    e: u32,
    eps: f32,
) {
    let row = group_id() * WAVES_PER_WG + wave_id();
    if row >= n_tokens * hc || e == 0 {
        return;
    }
    let (t, c) = (row / hc, row % hc);
    let lane = lane_id();
    let hce = hc * e;
    // SAFETY: ABI (abi::PleGateArgs): key, r, gv, nn [n_tokens][hc][e]; val [n_tokens][e]; norms
    // the three `[hc][e]` gammas (key, query, conv) back to back; this wave owns row (t, c) of
    // gv and nn, and writes gv before reading it back (lane 0 recomputes the values it sums).
    unsafe {
        let o = (row * e) as usize;
        let (gk, gq, gc) =
            (norms.add((c * e) as usize), norms.add((hce + c * e) as usize), norms.add((2 * hce + c * e) as usize));
        let kx = |i: u32| *key.add(o + i as usize);
        let qx = |i: u32| *r.add(o + i as usize);
        let ks = rms_scale_ggml(kx, e, eps);
        let qs = rms_scale_ggml(qx, e, eps);
        let mut gate = 0f32;
        if lane == 0 {
            let mut s = 0f32;
            for i in 0..e {
                let kc = kx(i) * ks * *gk.add(i as usize);
                let qc = qx(i) * qs * *gq.add(i as usize);
                s += kc * qc;
            }
            let s = s * (1.0 / sqrtf(e as f32));
            let sign = if s > 0.0 {
                1.0
            } else if s < 0.0 {
                -1.0
            } else {
                0.0
            };
            gate = sigmoid(sign * sqrtf(s.abs().max(1e-6)));
        }
        let gate = read_lane_f32(gate, 0);
        let vt = val.add((t * e) as usize);
        let g = |i: u32| gate * *vt.add(i as usize);
        let ns = rms_scale_ggml(g, e, eps);
        let mut i = lane;
        while i < e {
            let x = g(i);
            *gv.add(o + i as usize) = x;
            *nn.add(o + i as usize) = x * ns * *gc.add(i as usize);
            i += 32;
        }
    }
}

/// One work-item per channel `ch` of `hc · E`: over `h = [hist | nn]` (`(Kp − 1)·N` history
/// rows, then the window's `n` rows), `acc = Σ_k w[ch][k] · h[hlen + t − (Kp − 1 − k)·N][ch]`
/// in k order, `r[t][ch] = (r[t][ch] + gv[t][ch]) + silu(acc)`, then `hist ← the last hlen rows
/// of h`.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn ple_conv_f32(
    nn: *const f32,
    gv: *const f32,
    taps: *const f32,
    hist: *mut f32,
    r: *mut f32,
    n_tokens: u32,
    channels: u32,
    kp: u32,
    dil: u32,
) {
    let ch = group_id() * WG_SIZE + thread_id();
    if ch >= channels || kp == 0 {
        return;
    }
    let hlen = (kp - 1) * dil;
    // SAFETY: ABI (abi::PleConvArgs): nn, gv, r [n_tokens][channels]; hist [hlen][channels];
    // taps [channels][kp]; this item owns column ch of all of them, and hist row j is
    // overwritten only after every row > j was read.
    unsafe {
        let h = |row: u32| -> f32 {
            if row < hlen {
                *hist.add((row * channels + ch) as usize)
            } else {
                *nn.add(((row - hlen) * channels + ch) as usize)
            }
        };
        let w = taps.add((ch * kp) as usize);
        for t in 0..n_tokens {
            let mut acc = 0f32;
            for k in 0..kp {
                acc += *w.add(k as usize) * h(hlen + t - (kp - 1 - k) * dil);
            }
            let o = (t * channels + ch) as usize;
            *r.add(o) = (*r.add(o) + *gv.add(o)) + silu(acc);
        }
        for j in 0..hlen {
            let v = h(n_tokens + j);
            *hist.add((j * channels + ch) as usize) = v;
        }
    }
}
