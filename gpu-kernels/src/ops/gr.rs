//! Hyper-connection residual streams ("GR", Flash-Next): the element-wise parts of reading the
//! `hc` streams into a block input and of writing the block output back; the three projections
//! between them are ordinary matmuls. Host reference: `model::qwen4exp::gr::HyperConn`
//! (`norm_streams`, `lowrank_act`, `gate_mix`, `combine`) in the same order of every sum, with
//! `quant::fmath`'s sigmoid and SiLU. Every item or wave works on one token, so a window of up
//! to 8 tokens equals the same tokens launched one by one, bit for bit.
use super::quantize::quantize_wave_q8_1;
use crate::abi::{Q8_1_BYTES, WAVES_PER_WG, WG_SIZE};
use crate::arch::{group_id, lane_id, read_lane_f64, thread_id, wave_id};
use quant::fmath::{sigmoid, silu};
use quant::util::sqrtf;

#[inline(always)]
fn gid() -> u32 {
    group_id() * WG_SIZE + thread_id()
}

/// One wave per (token, stream) row of `e`: `flat = rms(r; γ[stream])`, with
/// `rms_norm_f32`'s ggml order (one f64 chain of f32-rounded squares, `(x · scale) · γ`); with
/// `q`, also its Q8_1 blocks (each pass of the wave holds one block of 32 values).
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn gr_stream_norm_f32(
    r: *const f32,
    gamma: *const f32,
    flat: *mut f32,
    q: *mut u8,
    n_rows: u32,
    e: u32,
    hc: u32,
    eps: f32,
) {
    let row = group_id() * WAVES_PER_WG + wave_id();
    if row >= n_rows || e == 0 || hc == 0 {
        return;
    }
    if !q.is_null() && !e.is_multiple_of(32) {
        core::intrinsics::abort(); // the host never launches this (GpuOps::gr_stream_norm checks)
    }
    let lane = lane_id();
    // SAFETY: ABI (abi::GrArgs): r and flat hold n_rows rows of e f32 (token-major, stream
    // minor), gamma [hc][e]; this wave owns row `row` of flat.
    unsafe {
        let (x, y) = (r.add((row * e) as usize), flat.add((row * e) as usize));
        let g = gamma.add(((row % hc) * e) as usize);
        let mut s = 0f64;
        if lane == 0 {
            for i in 0..e {
                let v = *x.add(i as usize);
                s += (v * v) as f64;
            }
        }
        let scale = 1.0 / sqrtf((read_lane_f64(s, 0) / e as f64) as f32 + eps);
        let mut i = lane;
        while i < e {
            let v = *x.add(i as usize) * scale * *g.add(i as usize);
            *y.add(i as usize) = v;
            if !q.is_null() {
                // Block (row·e + i - lane) / 32 of the Q8_1 rows (e is a multiple of 32).
                quantize_wave_q8_1(v, q.add(((row * e + i - lane) / 32 * Q8_1_BYTES) as usize));
            }
            i += 32;
        }
    }
}

/// `lo[i] = silu(lo[i] / hc)` (times the f32 `1 / hc`, as the host), one item per value; with
/// `q`, also its Q8_1 blocks (a wave's 32 items are one block: `n` and the rows' width are
/// multiples of 32, checked by the host).
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn gr_lowrank_act_f32(
    lo: *mut f32,
    _b: u64,
    _c: u64,
    q: *mut u8,
    n: u32,
    _e: u32,
    hc: u32,
    _pad: u32,
) {
    let i = gid();
    if !q.is_null() && !n.is_multiple_of(32) {
        core::intrinsics::abort(); // the host never launches this (GpuOps::gr_lowrank_act checks)
    }
    if i >= n || hc == 0 {
        return;
    }
    let inv_hc = 1.0 / hc as f32;
    // SAFETY: ABI (abi::GrArgs): lo holds n f32, q (when set) n / 32 blocks; item i owns element
    // i, its wave block i / 32 (every lane of it is live: n is a multiple of 32).
    unsafe {
        let p = lo.add(i as usize);
        let v = silu(*p * inv_hc);
        *p = v;
        if !q.is_null() {
            quantize_wave_q8_1(v, q.add((i / 32 * Q8_1_BYTES) as usize));
        }
    }
}

/// `x[t][i] = (Σ_c flat[t][c][i] · σ(gate[t][c][i])) / hc`, streams summed in order; one item
/// per (token, i).
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn gr_gate_mix_f32(
    flat: *const f32,
    gate: *const f32,
    x: *mut f32,
    _q: u64,
    n_tokens: u32,
    e: u32,
    hc: u32,
    _pad: u32,
) {
    let g = gid();
    if g >= n_tokens * e {
        return;
    }
    let (t, i) = (g / e, g % e);
    let inv_hc = 1.0 / hc as f32;
    // SAFETY: ABI (abi::GrArgs): flat and gate are [n_tokens][hc][e], x [n_tokens][e]; item g
    // owns x[t][i].
    unsafe {
        let mut s = 0f32;
        for c in 0..hc {
            let o = ((t * hc + c) * e + i) as usize;
            s += *flat.add(o) * sigmoid(*gate.add(o));
        }
        *x.add(g as usize) = s * inv_hc;
    }
}

/// `r[t][c][i] += 2 σ(inj[t][c] / hc) · y[t][i]`, one item per residual value.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn gr_combine_f32(
    r: *mut f32,
    y: *const f32,
    inj: *const f32,
    _q: u64,
    n_tokens: u32,
    e: u32,
    hc: u32,
    _pad: u32,
) {
    let g = gid();
    if e == 0 || g >= n_tokens * hc * e {
        return;
    }
    let (tc, i) = (g / e, g % e);
    let t = tc / hc;
    let inv_hc = 1.0 / hc as f32;
    // SAFETY: ABI (abi::GrArgs): r is [n_tokens][hc][e], y [n_tokens][e], inj [n_tokens][hc];
    // item g owns r's element g.
    unsafe {
        let w = 2.0 * sigmoid(*inj.add(tc as usize) * inv_hc);
        let p = r.add(g as usize);
        *p += w * *y.add((t * e + i) as usize);
    }
}
