//! Element-wise and row kernels of the forward pass: RMS norm, RoPE, GLU, residual add,
//! scale, softmax, KV-cache stores, MoE router and combine. Each states which host reference it
//! equals bit for bit (or, for the ones built on [`quant::fmath`], which tolerance applies) in
//! the matching `GpuOps` method (gpu-executor/src/ops.rs).
//!
//! Index math is u32; every kernel returns early for work-items past the end (wave-uniform
//! where a wave owns a row). Row kernels use one wave per row and no LDS.
use super::unroll;
use crate::abi::{MOE_MAX_EXPERTS, MOE_MAX_K, ROPE_HEADS, WAVES_PER_WG, WG_SIZE};
use crate::arch::{
    Lds, barrier, fma, group_id, group_sum_f32, lane_id, read_lane, read_lane_f32, read_lane_f64, roundf, thread_id,
    wave_id, wave_max_f32, wave_max_u32, wave_min_u32,
};
use crate::mem::f32_to_f16;
use quant::fmath::{expf, gelu_tanh, sigmoid, silu};
use quant::util::sqrtf;

#[inline(always)]
fn gid() -> u32 {
    group_id() * WG_SIZE + thread_id()
}
/// `f(0) .. f(15)` as straight-line code (the router's 16 logits a lane stay in VGPRs).
#[inline(always)]
fn each16(mut f: impl FnMut(usize)) {
    unroll::<2>(|h| unroll::<8>(|r| f(8 * h + r)));
}
#[inline(always)]
fn wave_row() -> u32 {
    group_id() * WAVES_PER_WG + wave_id()
}

/// One wave per row. `ggml == 0`: cpu_kernels::rms_norm (8 f64 partial sums of exact
/// squares over stride-8 lanes, summed 0..7, then the remainder); `ggml != 0`:
/// cpu_kernels::rms_norm_ggml (one chain of f32-rounded squares in f64). Then
/// `scale = 1 / sqrtf((sum / n) as f32 + eps)` (correctly rounded sqrt and division) and
/// `y = (x * scale) * w`: bit-identical to the CPU. `y` may equal `x`.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn rms_norm_f32(
    x: *const f32,
    w: *const f32,
    y: *mut f32,
    n: u32,
    n_rows: u32,
    eps: f32,
    ggml: u32,
) {
    let row = wave_row();
    if row >= n_rows || n == 0 {
        return;
    }
    let lane = lane_id();
    // SAFETY: ABI (abi::RmsNormArgs): x and y hold n_rows rows of n f32, w holds n f32; this
    // wave owns row `row`; every element is read before this lane writes it (y may alias x).
    unsafe {
        let xr = x.add((row * n) as usize);
        let yr = y.add((row * n) as usize);
        let sum = if ggml != 0 {
            let mut s = 0f64;
            if lane == 0 {
                for i in 0..n {
                    let v = *xr.add(i as usize);
                    s += (v * v) as f64;
                }
            }
            read_lane_f64(s, 0)
        } else {
            let nc = n / 8;
            let mut p = 0f64;
            if lane < 8 {
                for c in 0..nc {
                    let v = *xr.add((8 * c + lane) as usize) as f64;
                    p += v * v;
                }
            }
            let mut s = read_lane_f64(p, 0);
            for l in 1..8 {
                s += read_lane_f64(p, l);
            }
            for i in nc * 8..n {
                let v = *xr.add(i as usize) as f64;
                s += v * v;
            }
            s
        };
        let scale = 1.0 / sqrtf((sum / n as f64) as f32 + eps);
        let mut i = lane;
        while i < n {
            *yr.add(i as usize) = *xr.add(i as usize) * scale * *w.add(i as usize);
            i += 32;
        }
    }
}

/// One work-item per (token, group of `ROPE_HEADS` heads, pair). NEOX pairs (i, i + rd/2),
/// normal pairs (2i, 2i+1); `a*c - b*s`, `a*s + b*c` (cpu_kernels::rope_neox / rope_norm) or
/// with `fma` `fma(a, c, -(b*s))`, `fma(a, s, b*c)` (rope_neox_ggml). Angles from the host table.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn rope_f32(
    x: *mut f32,
    pos: *const u32,
    table: *const f32,
    n_tokens: u32,
    n_heads: u32,
    head_dim: u32,
    rope_dim: u32,
    neox: u32,
    use_fma: u32,
) {
    let half = rope_dim / 2;
    let chunks = n_heads.div_ceil(ROPE_HEADS);
    let g = gid();
    if half == 0 || chunks == 0 || g >= n_tokens * chunks * half {
        return;
    }
    let i = g % half;
    let rest = g / half;
    let (hc, t) = (rest % chunks, rest / chunks);
    // SAFETY: ABI (abi::RopeArgs): x = [n_tokens][n_heads][head_dim] f32, pos = n_tokens u32,
    // table = [n_pos][half] (cos, sin) with pos[t] < n_pos; pair i of heads hc*8.. of token t
    // is this item's alone.
    unsafe {
        let p = *pos.add(t as usize);
        let cs = table.add((2 * (p * half + i)) as usize);
        let (c, s) = (*cs, *cs.add(1));
        let (ia, ib) = if neox != 0 { (i, i + half) } else { (2 * i, 2 * i + 1) };
        let h1 = (hc * ROPE_HEADS + ROPE_HEADS).min(n_heads);
        let mut h = hc * ROPE_HEADS;
        while h < h1 {
            let base = x.add(((t * n_heads + h) * head_dim) as usize);
            let (a, b) = (*base.add(ia as usize), *base.add(ib as usize));
            let (na, nb) =
                if use_fma != 0 { (fma(a, c, -(b * s)), fma(a, s, b * c)) } else { (a * c - b * s, a * s + b * c) };
            *base.add(ia as usize) = na;
            *base.add(ib as usize) = nb;
            h += 1;
        }
    }
}

/// `out = act(gate) * up`, act 0 = SiLU, 1 = GELU-tanh, both from `quant::fmath`.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn glu_f32(gate: *const f32, up: *const f32, out: *mut f32, n: u32, act: u32) {
    let i = gid();
    if i >= n {
        return;
    }
    // SAFETY: ABI (abi::GluArgs): three buffers of n f32; element i is this item's.
    unsafe {
        let g = *gate.add(i as usize);
        let a = if act == 0 { silu(g) } else { gelu_tanh(g) };
        *out.add(i as usize) = a * *up.add(i as usize);
    }
}

/// `x[r*n+i] += b[r*b_stride+i]`.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn add_rows_f32(x: *mut f32, b: *const f32, n: u32, n_rows: u32, b_stride: u32, _pad: u32) {
    let g = gid();
    if n == 0 || g >= n * n_rows {
        return;
    }
    let (r, i) = (g / n, g % n);
    // SAFETY: ABI (abi::AddRowsArgs): x = n_rows * n f32, b holds row r at r*b_stride + n.
    unsafe { *x.add(g as usize) += *b.add((r * b_stride + i) as usize) }
}

/// `x[i] *= factor`.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn scale_f32(x: *mut f32, n: u32, factor: f32) {
    let i = gid();
    if i < n {
        // SAFETY: ABI (abi::ScaleArgs): x holds n f32.
        unsafe { *x.add(i as usize) *= factor }
    }
}

/// `y[i] = f16(x[i])`, round to nearest even (the activations of the f16 GEMM prefill path),
/// bit-identical to `quant::f32_to_f16`.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn convert_f32_f16(x: *const f32, y: *mut u16, n: u32, _pad: u32) {
    let i = gid();
    if i < n {
        // SAFETY: ABI (abi::ConvertArgs): x holds n f32, y holds n u16.
        unsafe { *y.add(i as usize) = f32_to_f16(*x.add(i as usize)) }
    }
}

/// `y[i] = bf16(x[i])`, round to nearest even, NaN kept quiet (the activations of the bf16
/// GEMM path), bit-identical to `quant::f32_to_bf16`.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn convert_f32_bf16(x: *const f32, y: *mut u16, n: u32, _pad: u32) {
    let i = gid();
    if i < n {
        // SAFETY: ABI (abi::ConvertArgs): x holds n f32, y holds n u16.
        unsafe { *y.add(i as usize) = quant::f32_to_bf16(*x.add(i as usize)) }
    }
}

/// Softmax of each row in place, one wave per row: max, `expf(x - max)`, lane sums (stride
/// 32) added by a butterfly, times `1 / sum`. An all -inf row becomes zeros (as the CPU).
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn softmax_f32(x: *mut f32, n: u32, n_rows: u32) {
    let row = wave_row();
    if row >= n_rows {
        return;
    }
    let lane = lane_id();
    // SAFETY: ABI (abi::SoftmaxArgs): x = n_rows rows of n f32; this wave owns row `row`,
    // each lane reads and writes its own elements (stride 32).
    unsafe {
        let xr = x.add((row * n) as usize);
        let mut mx = f32::NEG_INFINITY;
        let mut i = lane;
        while i < n {
            mx = mx.max(*xr.add(i as usize));
            i += 32;
        }
        let mx = wave_max_f32(mx);
        let mut sum = 0f32;
        i = lane;
        while i < n {
            let e = if mx == f32::NEG_INFINITY { 0.0 } else { expf(*xr.add(i as usize) - mx) };
            *xr.add(i as usize) = e;
            sum += e;
            i += 32;
        }
        let total = group_sum_f32(sum, 5);
        let inv = if mx == f32::NEG_INFINITY { 0.0 } else { 1.0 / total };
        i = lane;
        while i < n {
            *xr.add(i as usize) *= inv;
            i += 32;
        }
    }
}

/// Each row's greedy token and its probability (abi::LogitsTopArgs), one wave per row: the
/// largest logit (the lowest index among equal ones, as the host's `argmax`) and
/// `p = 1 / Σ expf(l - max)`; `out[2 row]` = the token, `out[2 row + 1]` = `p`'s bits. What a
/// draft step needs without reading the vocabulary of logits back.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn logits_top_f32(logits: *const f32, out: *mut u32, n_vocab: u32, n_rows: u32) {
    let row = wave_row();
    if row >= n_rows || n_vocab == 0 {
        return;
    }
    let lane = lane_id();
    // SAFETY: ABI (abi::LogitsTopArgs): logits = n_rows rows of n_vocab f32, out = 2 n_rows
    // u32; this wave owns row `row` and lane 0 writes its two words.
    unsafe {
        let lr = logits.add(row as usize * n_vocab as usize);
        // Per lane: its first largest value (indices rise, so a tie keeps the lower one).
        let (mut best, mut at) = (f32::NEG_INFINITY, u32::MAX);
        let mut i = lane;
        while i < n_vocab {
            let v = *lr.add(i as usize);
            if at == u32::MAX || v > best {
                (best, at) = (v, i);
            }
            i += 32;
        }
        let mx = wave_max_f32(best);
        let token = wave_min_u32(if at != u32::MAX && best == mx { at } else { u32::MAX });
        let mut sum = 0f32;
        i = lane;
        while i < n_vocab {
            sum += if mx == f32::NEG_INFINITY { 1.0 } else { expf(*lr.add(i as usize) - mx) };
            i += 32;
        }
        let total = group_sum_f32(sum, 5);
        if lane == 0 {
            *out.add(2 * row as usize) = token;
            *out.add(2 * row as usize + 1) = (1.0 / total).to_bits();
        }
    }
}

/// Loads this lane's values of one (token, kv head) row: element `lane + 32 r` in `v[r]`.
///
/// # Safety
/// `src` holds `hd` f32.
#[inline(always)]
unsafe fn load_row8(src: *const f32, hd: u32) -> [f32; 8] {
    let lane = lane_id();
    let mut v = [0f32; 8];
    unroll::<8>(|r| {
        let i = lane + 32 * r as u32;
        if i < hd {
            // SAFETY: caller contract, i < hd.
            v[r] = unsafe { *src.add(i as usize) };
        }
    });
    v
}

/// f16 KV store: one wave per (token, kv head), `cache[pos[t]][h][..]` = RNE f16 of the row.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn kv_store_f16(
    src: *const f32,
    cache: *mut u16,
    _scale: *mut f32,
    pos: *const u32,
    n_tokens: u32,
    n_head_kv: u32,
    head_dim: u32,
    _pad: u32,
) {
    let th = wave_row();
    if th >= n_tokens * n_head_kv || head_dim > 256 {
        return;
    }
    let (t, h) = (th / n_head_kv, th % n_head_kv);
    let lane = lane_id();
    // SAFETY: ABI (abi::KvStoreArgs): src = [n_tokens][n_head_kv*head_dim], cache rows of
    // n_head_kv*head_dim f16 with pos[t] < capacity; (t, h) is this wave's, lanes own elements.
    unsafe {
        let v = load_row8(src.add((th * head_dim) as usize), head_dim);
        let p = *pos.add(t as usize);
        let dst = cache.add(((p * n_head_kv + h) * head_dim) as usize);
        unroll::<8>(|r| {
            let i = lane + 32 * r as u32;
            if i < head_dim {
                *dst.add(i as usize) = f32_to_f16(v[r]);
            }
        });
    }
}

/// int8 KV store (kv_cache.rs `Store::write`): `d = amax / 127`, `id = 1/d` (0 if d == 0),
/// `q = clamp(roundf(x * id), -127, 127)`, scale `[pos][h] = d`.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn kv_store_i8(
    src: *const f32,
    cache: *mut i8,
    scale: *mut f32,
    pos: *const u32,
    n_tokens: u32,
    n_head_kv: u32,
    head_dim: u32,
    _pad: u32,
) {
    let th = wave_row();
    if th >= n_tokens * n_head_kv || head_dim > 256 {
        return;
    }
    let (t, h) = (th / n_head_kv, th % n_head_kv);
    let lane = lane_id();
    // SAFETY: as kv_store_f16; scale holds [capacity][n_head_kv] f32.
    unsafe {
        let v = load_row8(src.add((th * head_dim) as usize), head_dim);
        let mut amax = 0u32;
        unroll::<8>(|r| amax = amax.max(v[r].to_bits() & 0x7fff_ffff));
        let amax = f32::from_bits(wave_max_u32(amax));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let p = *pos.add(t as usize);
        let dst = cache.add(((p * n_head_kv + h) * head_dim) as usize);
        unroll::<8>(|r| {
            let i = lane + 32 * r as u32;
            if i < head_dim {
                *dst.add(i as usize) = roundf(v[r] * id).clamp(-127.0, 127.0) as i8;
            }
        });
        if lane == 0 {
            *scale.add((p * n_head_kv + h) as usize) = d;
        }
    }
}

/// MoE router, one wave per token: softmax (`expf`, lane sums + butterfly, times 1/sum),
/// top-k by probability with ties to the lower expert, optional renormalisation by the sum
/// of the selected weights (added in rank order, clamped at 6.103515625e-5) as model/moe.rs.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn moe_router(
    logits: *const f32,
    ids: *mut u32,
    w: *mut f32,
    n_tokens: u32,
    n_expert: u32,
    k: u32,
    renorm: u32,
) {
    let t = wave_row();
    if t >= n_tokens || n_expert > MOE_MAX_EXPERTS || k > MOE_MAX_K || k > n_expert {
        return;
    }
    let lane = lane_id();
    // SAFETY: ABI (abi::MoeRouterArgs): logits = [n_tokens][n_expert], ids/w = [n_tokens][k];
    // this wave owns token t; lane j < k writes entry j.
    unsafe {
        let row = logits.add((t * n_expert) as usize);
        let mut v = [f32::NEG_INFINITY; 16];
        each16(|r| {
            let e = lane + 32 * r as u32;
            if e < n_expert {
                v[r] = *row.add(e as usize);
            }
        });
        let mut mx = f32::NEG_INFINITY;
        each16(|r| mx = mx.max(v[r]));
        let mx = wave_max_f32(mx);
        let mut sum = 0f32;
        each16(|r| {
            let e = lane + 32 * r as u32;
            v[r] = if e < n_expert { expf(v[r] - mx) } else { 0.0 };
            sum += v[r];
        });
        let inv = 1.0 / group_sum_f32(sum, 5);
        // key = probability bits + 1 (probabilities are >= 0, so bits order like values);
        // 0 = not available.
        let mut key = [0u32; 16];
        each16(|r| {
            let e = lane + 32 * r as u32;
            if e < n_expert {
                key[r] = (v[r] * inv).to_bits() + 1;
            }
        });
        let mut my_w = 0f32;
        let mut my_id = 0u32;
        for j in 0..k {
            let mut best = 0u32;
            each16(|r| best = best.max(key[r]));
            let kmax = wave_max_u32(best);
            let mut cand = u32::MAX;
            each16(|r| {
                if key[r] == kmax && cand == u32::MAX {
                    cand = lane + 32 * r as u32;
                }
            });
            let id = wave_min_u32(cand);
            each16(|r| {
                if lane + 32 * r as u32 == id {
                    key[r] = 0;
                }
            });
            if lane == j {
                my_w = f32::from_bits(kmax - 1);
                my_id = id;
            }
        }
        if renorm != 0 {
            let mut s = 0f32;
            for j in 0..k {
                s += read_lane_f32(my_w, j);
            }
            let s = s.max(6.103_515_6e-5);
            my_w /= s;
        }
        if lane < k {
            *ids.add((t * k + lane) as usize) = my_id;
            *w.add((t * k + lane) as usize) = my_w;
        }
    }
    let _ = read_lane;
}

/// The sigmoid-gated shared expert (Flash-Next): `out[t][i] += σ(gate[t]) · sh[t][i]`,
/// `σ` with `quant::fmath::expf` (the CPU's `qwen4exp::moe` uses libm). One item per value.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn moe_shared_add_f32(out: *mut f32, sh: *const f32, gate: *const f32, d: u32, n_tokens: u32) {
    let g = gid();
    if d == 0 || g >= d * n_tokens {
        return;
    }
    // SAFETY: ABI (abi::MoeSharedArgs): out and sh are [n_tokens][d], gate [n_tokens]; item g
    // owns out's element g.
    unsafe {
        let w = sigmoid(*gate.add((g / d) as usize));
        *out.add(g as usize) += w * *sh.add(g as usize);
    }
}

/// The expert cache's view of a routing choice (abi::MoeSlotMapArgs): each slot's cache slot
/// (or `MOE_SLOT_MISS`) and the row `moe_combine` reads it from. One item per slot.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn moe_slot_map(
    ids: *const u32,
    table: *const u32,
    slots: *mut u32,
    map: *mut u32,
    n_slots: u32,
    n_expert: u32,
    miss_base: u32,
    _pad: u32,
) {
    let j = gid();
    if j >= n_slots {
        return;
    }
    // SAFETY: ABI: ids/slots/map hold n_slots u32, table n_expert u32; item j owns slot j.
    unsafe {
        let e = *ids.add(j as usize);
        if e >= n_expert {
            // A corrupt choice must not index past the table.
            core::intrinsics::abort();
        }
        let s = *table.add(e as usize);
        *slots.add(j as usize) = s;
        *map.add(j as usize) = if s == crate::abi::MOE_SLOT_MISS { miss_base + j } else { j };
    }
}

/// A chunk's slots ordered by expert within blocks of `MOE_SORT_BLOCK` (abi::MoeSortArgs):
/// the workgroup stages its block's ids in LDS (a block is whole workgroups), then item `j`
/// counts the slots of the block that sort before it, `(id, index)` ascending.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn moe_sort_slots(
    ids: *const u32,
    sorted: *mut u32,
    cols: *mut u32,
    map: *mut u32,
    n_slots: u32,
    k: u32,
    _p0: u32,
    _p1: u32,
) {
    const BLOCK: u32 = crate::abi::MOE_SORT_BLOCK;
    const _: () = assert!(BLOCK.is_multiple_of(WG_SIZE));
    if k == 0 {
        return;
    }
    let j = gid();
    let b0 = group_id() * WG_SIZE / BLOCK * BLOCK;
    if b0 >= n_slots {
        return; // the whole workgroup: no barrier is left waiting
    }
    let b1 = if n_slots - b0 < BLOCK { n_slots } else { b0 + BLOCK };
    let lds = Lds::get();
    let mut i = b0 + thread_id();
    while i < b1 {
        // SAFETY: ABI: ids holds n_slots u32 and i < b1 <= n_slots; the launch has BLOCK·4
        // bytes of LDS (registry) and item t writes only words t, t + WG_SIZE, ...
        unsafe { lds.st32((i - b0) * 4, *ids.add(i as usize)) };
        i += WG_SIZE;
    }
    barrier();
    if j >= n_slots {
        return;
    }
    // SAFETY: the staged block is read-only after the barrier; sorted/cols/map hold n_slots
    // u32 (ABI), and the positions of a block are a permutation of it (distinct (id, index)
    // keys), so item j alone writes sorted/cols[pos] and map[j].
    unsafe {
        let e = lds.ld32((j - b0) * 4);
        let mut pos = b0;
        let mut i = b0;
        while i < b1 {
            let o = lds.ld32((i - b0) * 4);
            pos += (o < e || (o == e && i < j)) as u32;
            i += 1;
        }
        *sorted.add(pos as usize) = e;
        *cols.add(pos as usize) = j / k;
        *map.add(j as usize) = pos;
    }
}

/// `out[t][i] = sum_{j<k} w[t*k+j] * y[map[t*k+j]][i]`, from 0.0 in order j = 0..k.
/// Workgroup `g` = token `g / ceil(d / WG_SIZE)`, so the token's map and weights are
/// workgroup-uniform (scalar loads) and each work-item reads only its y elements.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn moe_combine(
    y: *const f32,
    map: *const u32,
    w: *const f32,
    out: *mut f32,
    sh: *const f32,
    gate: *const f32,
    d: u32,
    n_tokens: u32,
    k: u32,
    _pad: u32,
) {
    let chunks = d.div_ceil(WG_SIZE);
    let g = group_id();
    if chunks == 0 || g >= chunks * n_tokens {
        return;
    }
    let t = g / chunks;
    let i = (g % chunks) * WG_SIZE + thread_id();
    if i >= d {
        return;
    }
    // SAFETY: ABI (abi::MoeCombineArgs): map/w = [n_tokens*k], map entries are rows of y (d
    // f32 each), out = [n_tokens][d]; element (t, i) is this item's.
    unsafe {
        let mut acc = 0f32;
        for j in 0..k {
            let m = *map.add((t * k + j) as usize);
            acc += *w.add((t * k + j) as usize) * *y.add((m * d + i) as usize);
        }
        if !sh.is_null() {
            // ABI: sh = [n_tokens][d], gate = [n_tokens]; moe_shared_add_f32's expression.
            acc += sigmoid(*gate.add(t as usize)) * *sh.add((t * d + i) as usize);
        }
        *out.add((t * d + i) as usize) = acc;
    }
}
