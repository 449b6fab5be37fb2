//! QSA (Flash-Next's sparse attention layers) between the projections: q/k RMS norms with the
//! partial NEOX rope, the block indexer (pooled block keys, ReLU head scores, libstdc++'s
//! heap-order top-k over cells) and the gated GQA softmax attention over the kept cells of an
//! f16 cache. The host reference is `Qsa::mix` (engine, `cpu::qwen4exp::qsa`): every sum is
//! in its order and the rope angles come from the host table the CPU computes, so the norms,
//! rope, block keys, scores and the kept cells are bit-identical; the softmax exp and the gate
//! sigmoid are `quant::fmath`'s (within 2 ulp of libm), hence a tolerance on the attention output
//! (`GpuOps::qsa_mix`, tests/gpu/gpu_ops_qsa.rs).
//!
//! Every position comes from the device buffer `pos` (a window's tokens at consecutive
//! positions), so a launch's arguments do not change from one decode step to the next.
//! Index math is u32; every kernel returns early for work-items past the end.
use super::rms_scale_ggml;
use crate::abi::{QSA_ATTEND_BLOCK, WAVES_PER_WG, WG_SIZE};
use crate::arch::{Lds, barrier, fma, group_id, lane_id, read_lane_f32, thread_id, wave_id, wave_max_f32};
use crate::mem::f32_to_f16;
use quant::f16_to_f32;
use quant::fmath::{expf, sigmoid};

#[inline(always)]
fn wave_row() -> u32 {
    group_id() * WAVES_PER_WG + wave_id()
}

#[inline(always)]
fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// Writes `dst[i] = rope((x(i) * scale) * w[i])` for one row of `dim`: NEOX pairs
/// `(i, i + n_rot/2)` rotated with the host table's `(cos, sin)` at `p` as
/// `fma(a, c, -(b*s))`, `fma(a, s, b*c)` (the CPU's ggml rope, `rope_neox_ggml_cs`); dims `>= n_rot` only
/// normed. Each lane owns its pairs and dims.
///
/// # Safety
/// `w` and `dst` hold `dim` f32, `table` holds row `p` of `n_rot / 2` (cos, sin) pairs.
#[inline(always)]
unsafe fn norm_rope_row(
    x: impl Fn(u32) -> f32,
    w: *const f32,
    dst: *mut f32,
    table: *const f32,
    p: u32,
    dim: u32,
    n_rot: u32,
    scale: f32,
) {
    let half = n_rot / 2;
    let lane = lane_id();
    // SAFETY: per the function's contract.
    unsafe {
        let y = |i: u32| x(i) * scale * *w.add(i as usize);
        let mut i = lane;
        while i < half {
            let cs = table.add((2 * (p * half + i)) as usize);
            let (c, s) = (*cs, *cs.add(1));
            let (a, b) = (y(i), y(i + half));
            *dst.add(i as usize) = fma(a, c, -(b * s));
            *dst.add((i + half) as usize) = fma(a, s, b * c);
            i += 32;
        }
        let mut i = n_rot + lane;
        while i < dim {
            *dst.add(i as usize) = y(i);
            i += 32;
        }
    }
}

/// One wave per (token t, head h) row: `dst[t][h] = rope(rms(src row; w), pos[t])`, the source
/// row at `src + t * src_tok_stride + h * src_head_stride` (the q heads sit in `[q_h | gate_h]`
/// pairs of the q projection), the destination `[n_tokens][n_heads][head_dim]`.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn qsa_norm_rope_f32(
    src: *const f32,
    w: *const f32,
    dst: *mut f32,
    pos: *const u32,
    table: *const f32,
    n_tokens: u32,
    n_heads: u32,
    head_dim: u32,
    n_rot: u32,
    src_head_stride: u32,
    src_tok_stride: u32,
    eps: f32,
    _pad: u32,
) {
    let row = wave_row();
    if row >= n_tokens * n_heads || head_dim == 0 || n_rot > head_dim {
        return;
    }
    let (t, h) = (row / n_heads, row % n_heads);
    // SAFETY: ABI (abi::QsaNormRopeArgs): src rows as above, w [head_dim], dst [n_tokens][n_heads]
    // [head_dim] apart from src, pos [n_tokens] within the table's rows; this wave owns row (t, h).
    unsafe {
        let sr = src.add((t * src_tok_stride + h * src_head_stride) as usize);
        let x = |i: u32| *sr.add(i as usize);
        let scale = rms_scale_ggml(x, head_dim, eps);
        let dr = dst.add((row * head_dim) as usize);
        norm_rope_row(x, w, dr, table, *pos.add(t as usize), head_dim, n_rot, scale);
    }
}

/// One wave per block that the window completes: with the window at `pos[0] ..
/// pos[0] + n_tokens`, block `b = pos[0] / ratio + wave` for `b < (pos[0] + n_tokens) / ratio`.
/// `K_b = rope(rms(mean of the raw keys κ of cells b·r .. b·r + r; w), b·r)` into
/// `blocks[b][dim]`. The mean adds the cache rows (f16, or int8 times the row's scale) in cell
/// order, then divides by `r`; each lane recomputes the means it needs (lane 0 all of them for
/// the norm), so no value crosses lanes.
///
/// # Safety
/// Arguments per `abi::QsaBlockKeysArgs`: kappa holds [cells][dim] (f16 bits, or i8 with
/// kappa_scale [cells]) for every cell below pos[0] + n_tokens, blocks [cells / ratio][dim]
/// f32, w [dim], the table rows b·r.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn block_keys<const I8: bool>(
    kappa: *const u8,
    kappa_scale: *const f32,
    w: *const f32,
    blocks: *mut f32,
    pos: *const u32,
    table: *const f32,
    n_tokens: u32,
    dim: u32,
    ratio: u32,
    n_rot: u32,
    eps: f32,
) {
    if ratio == 0 || dim == 0 || n_rot > dim {
        return;
    }
    // SAFETY: per the function's contract; this wave owns block b.
    unsafe {
        let start = *pos;
        let b = start / ratio + wave_row();
        if b >= (start + n_tokens) / ratio {
            return;
        }
        let value = |j: u32, i: u32| -> f32 {
            if I8 {
                (*(kappa.add((j * dim + i) as usize) as *const i8)) as f32 * *kappa_scale.add(j as usize)
            } else {
                f16_to_f32(*(kappa as *const u16).add((j * dim + i) as usize))
            }
        };
        let mean = |i: u32| -> f32 {
            let mut m = 0f32;
            for j in b * ratio..(b + 1) * ratio {
                m += value(j, i);
            }
            m / ratio as f32
        };
        let scale = rms_scale_ggml(mean, dim, eps);
        norm_rope_row(mean, w, blocks.add((b * dim) as usize), table, b * ratio, dim, n_rot, scale);
    }
}

macro_rules! block_keys_kernel {
    ($name:ident, $i8:literal) => {
        /// [`block_keys`] on an f16 (`qsa_block_keys_f16`) or int8 (`qsa_block_keys_i8`) cache.
        #[unsafe(no_mangle)]
        pub extern "gpu-kernel" fn $name(
            kappa: *const u8,
            kappa_scale: *const f32,
            w: *const f32,
            blocks: *mut f32,
            pos: *const u32,
            table: *const f32,
            n_tokens: u32,
            dim: u32,
            ratio: u32,
            n_rot: u32,
            eps: f32,
            _pad: u32,
        ) {
            // SAFETY: ABI (abi::QsaBlockKeysArgs), as `block_keys` requires.
            unsafe { block_keys::<$i8>(kappa, kappa_scale, w, blocks, pos, table, n_tokens, dim, ratio, n_rot, eps) }
        }
    };
}
block_keys_kernel!(qsa_block_keys_f16, false);
block_keys_kernel!(qsa_block_keys_i8, true);

/// One work-item per (token t, block b) with `b < (pos[t] + 1) / ratio` (the blocks complete at
/// t): `score[t][b] = Σ_h relu(ι_{t,h} · K_b)`, each dot one f32 chain in dim order, the heads
/// added in order from 0.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn qsa_index_scores_f32(
    iq: *const f32,
    blocks: *const f32,
    score: *mut f32,
    pos: *const u32,
    n_tokens: u32,
    heads: u32,
    dim: u32,
    ratio: u32,
    max_blocks: u32,
    _pad: u32,
) {
    let g = group_id() * WG_SIZE + thread_id();
    if max_blocks == 0 || ratio == 0 || g >= n_tokens * max_blocks {
        return;
    }
    let (t, b) = (g / max_blocks, g % max_blocks);
    // SAFETY: ABI (abi::QsaIndexScoresArgs): iq [n_tokens][heads][dim], blocks [max_blocks][dim]
    // (every block below (pos[t] + 1) / ratio <= max_blocks written), score
    // [n_tokens][max_blocks]; this item owns score[t][b].
    unsafe {
        if b >= (*pos.add(t as usize) + 1) / ratio {
            return;
        }
        let kb = blocks.add((b * dim) as usize);
        let mut s = 0f32;
        for h in 0..heads {
            let q = iq.add(((t * heads + h) * dim) as usize);
            let mut d = 0f32;
            for i in 0..dim {
                d += *q.add(i as usize) * *kb.add(i as usize);
            }
            s += d.max(0.0);
        }
        *score.add(g as usize) = s;
    }
}

/// Sifts `value` from the hole at `hole` down to a leaf of the heap `a[..len]` along the
/// preferred children, then back up (libstdc++'s `__adjust_heap` with `__push_heap`); `beats(x,
/// y)` is the heap's comparison (`x` ranks below `y`).
///
/// # Safety
/// `a` holds `len` u32.
#[inline(always)]
unsafe fn adjust_heap(a: *mut u32, mut hole: u32, len: u32, value: u32, beats: &impl Fn(u32, u32) -> bool) {
    // SAFETY: every index below is < len.
    unsafe {
        let at = |i: u32| *a.add(i as usize);
        let top = hole;
        let mut second = hole;
        while len >= 2 && second < (len - 1) / 2 {
            second = 2 * (second + 1);
            if beats(at(second), at(second - 1)) {
                second -= 1;
            }
            *a.add(hole as usize) = at(second);
            hole = second;
        }
        if len % 2 == 0 && len >= 2 && second == (len - 2) / 2 {
            second = 2 * (second + 1);
            *a.add(hole as usize) = at(second - 1);
            hole = second - 1;
        }
        while hole > top {
            let parent = (hole - 1) / 2;
            if !beats(at(parent), value) {
                break;
            }
            *a.add(hole as usize) = at(parent);
            hole = parent;
        }
        *a.add(hole as usize) = value;
    }
}

/// One wave per token t, its lane 0 working alone (the selection is sequential by definition):
/// the cells `0 ..= pos[t]` have values `score[t][j / ratio]` for cells of complete blocks and
/// `tail_bias` for the rest; with `k` or fewer cells every one is kept, otherwise the `k` that
/// `std::partial_sort(idx, idx + k, idx + n, v[a] > v[b])` keeps (the CPU's `heap_select`, whose
/// ties the heap order decides). `sel[t][..sel_n[t]]` gets them in ascending order.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn qsa_select_topk(
    score: *const f32,
    sel: *mut u32,
    sel_n: *mut u32,
    pos: *const u32,
    n_tokens: u32,
    max_blocks: u32,
    ratio: u32,
    k: u32,
    tail_bias: f32,
    _pad: u32,
) {
    let t = wave_row();
    if t >= n_tokens || lane_id() != 0 || ratio == 0 || k == 0 {
        return;
    }
    // SAFETY: ABI (abi::QsaSelectArgs): score [n_tokens][max_blocks] holds the blocks complete at
    // each token, sel [n_tokens][k] u32, sel_n [n_tokens]; this lane owns token t's rows.
    unsafe {
        let n = *pos.add(t as usize) + 1;
        let a = sel.add((t * k) as usize);
        let sc = score.add((t * max_blocks) as usize);
        if n <= k {
            for j in 0..n {
                *a.add(j as usize) = j;
            }
            *sel_n.add(t as usize) = n;
            return;
        }
        let tail = n / ratio * ratio;
        let v = |j: u32| if j < tail { *sc.add((j / ratio) as usize) } else { tail_bias };
        // A min-heap on value: its top is the weakest kept cell.
        let beats = |x: u32, y: u32| v(x) > v(y);
        for j in 0..k {
            *a.add(j as usize) = j;
        }
        if k >= 2 {
            let mut parent = (k - 2) / 2;
            loop {
                adjust_heap(a, parent, k, *a.add(parent as usize), &beats);
                if parent == 0 {
                    break;
                }
                parent -= 1;
            }
        }
        for j in k..n {
            if beats(j, *a) {
                adjust_heap(a, 0, k, j, &beats);
            }
        }
        // Ascending cell order (heapsort with the max-heap of the indices themselves).
        let larger = |x: u32, y: u32| x < y;
        let mut parent = k / 2;
        while parent > 0 {
            parent -= 1;
            adjust_heap(a, parent, k, *a.add(parent as usize), &larger);
        }
        let mut end = k;
        while end > 1 {
            end -= 1;
            let top = *a;
            let last = *a.add(end as usize);
            *a.add(end as usize) = top;
            adjust_heap(a, 0, end, last, &larger);
        }
        *sel_n.add(t as usize) = k;
    }
}

/// One wave (workgroup of `QSA_ATTEND_BLOCK`) per (token t, head h), kv head `h / (H / KV)`,
/// over the cells `sel[t][..sel_n[t]]` (`use_sel != 0`) or `0 ..= pos[t]`:
/// 1. the query (rounded to f16 for an f16 cache, as the CPU does; as is for int8) is staged in
///    LDS; lane `l` scores cells `l, l + 32, ..`: `s = (Σ_d q[d] k[d]) * scale` in d order, with
///    `k[d]` the f16 value or `q8 · row scale`, kept in LDS;
/// 2. `max` over the wave, `e = expf(s - max)` in LDS, lane 0 adds them in cell order in f64,
///    `inv = (1 / sum) as f32`;
/// 3. `p_j = e_j * inv` (rounded to f16 for an f16 cache) in LDS; lane `l` owns dims `l, l + 32,
///    ..` and adds `p_j * v_j[d]` in cell order; the row is multiplied by `sigmoid(gate)`, the
///    gate at `qf[t][h][head_dim..]`.
///
/// # Safety
/// Arguments per `abi::QsaAttendArgs`: q/out [n_tokens][n_head][head_dim], qf
/// [n_tokens][n_head][2 head_dim], caches [cell][n_head_kv][head_dim] (f16 bits, or i8 with
/// scales [cell][n_head_kv]) for every cell <= pos[t], sel [n_tokens][sel_stride] with
/// sel_n[t] <= sel_stride kept cells <= pos[t]; the launch has (head_dim + cells) * 4 bytes of
/// LDS (GpuOps::qsa_mix checks).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn attend<const I8: bool>(
    q: *const f32,
    qf: *const f32,
    k_cache: *const u8,
    k_scale: *const f32,
    v_cache: *const u8,
    v_scale: *const f32,
    sel: *const u32,
    sel_n: *const u32,
    out: *mut f32,
    pos: *const u32,
    n_tokens: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    sel_stride: u32,
    use_sel: u32,
    scale: f32,
) {
    const _: () = assert!(QSA_ATTEND_BLOCK == 32);
    let th = group_id();
    if n_head_kv == 0 || th >= n_tokens * n_head || n_head % n_head_kv != 0 || head_dim > 256 {
        return;
    }
    let (t, h) = (th / n_head, th % n_head);
    let kvh = h / (n_head / n_head_kv);
    let lane = lane_id();
    let lds = Lds::get();
    let d = head_dim;
    // SAFETY: per the function's contract; this wave owns (t, h).
    unsafe {
        let p = *pos.add(t as usize);
        let cnt = if use_sel != 0 { *sel_n.add(t as usize) } else { p + 1 };
        let st = sel.add((t * sel_stride) as usize);
        let cell = |j: u32| if use_sel != 0 { *st.add(j as usize) } else { j };
        // Value `i` of the cache row of cell `c` (kv head kvh).
        let at = |cache: *const u8, scales: *const f32, c: u32, i: u32| -> f32 {
            let row = c * n_head_kv + kvh;
            if I8 {
                (*(cache.add((row * d + i) as usize) as *const i8)) as f32 * *scales.add(row as usize)
            } else {
                f16_to_f32(*(cache as *const u16).add((row * d + i) as usize))
            }
        };
        let sc = 4 * d;
        let qr = q.add((th * d) as usize);
        let mut i = lane;
        while i < d {
            let x = *qr.add(i as usize);
            lds.st32(4 * i, if I8 { x } else { round_f16(x) }.to_bits());
            i += 32;
        }
        barrier();
        let mut mx = f32::NEG_INFINITY;
        let mut j = lane;
        while j < cnt {
            let c = cell(j);
            let mut s = 0f32;
            for i in 0..d {
                s += f32::from_bits(lds.ld32(4 * i)) * at(k_cache, k_scale, c, i);
            }
            let s = s * scale;
            lds.st32(sc + 4 * j, s.to_bits());
            mx = mx.max(s);
            j += 32;
        }
        let mx = wave_max_f32(mx);
        let mut j = lane;
        while j < cnt {
            let e = expf(f32::from_bits(lds.ld32(sc + 4 * j)) - mx);
            lds.st32(sc + 4 * j, e.to_bits());
            j += 32;
        }
        barrier();
        // The division stays in lane 0's VGPRs (an f64 division of a wave-uniform value does
        // not compile: "illegal VGPR to SGPR copy"), then is broadcast.
        let mut inv = 0f32;
        if lane == 0 {
            let mut sum = 0f64;
            for j in 0..cnt {
                sum += f32::from_bits(lds.ld32(sc + 4 * j)) as f64;
            }
            inv = (1.0 / sum) as f32;
        }
        let inv = read_lane_f32(inv, 0);
        // The probabilities, by the lane that owns the cell (an f16 rounding of a wave-uniform
        // value does not compile either: the fence before the conversion has only a VGPR form).
        let mut j = lane;
        while j < cnt {
            let pj = f32::from_bits(lds.ld32(sc + 4 * j)) * inv;
            lds.st32(sc + 4 * j, if I8 { pj } else { round_f16(pj) }.to_bits());
            j += 32;
        }
        barrier();
        let gate = qf.add((th * 2 * d + d) as usize);
        let o = out.add((th * d) as usize);
        let mut i = lane;
        while i < d {
            let mut acc = 0f32;
            for j in 0..cnt {
                let pj = f32::from_bits(lds.ld32(sc + 4 * j));
                acc += pj * at(v_cache, v_scale, cell(j), i);
            }
            *o.add(i as usize) = acc * sigmoid(*gate.add(i as usize));
            i += 32;
        }
    }
}

macro_rules! attend_kernel {
    ($name:ident, $i8:literal) => {
        /// [`attend`] on an f16 (`qsa_attend_f16`) or int8 (`qsa_attend_i8`) cache.
        #[unsafe(no_mangle)]
        pub extern "gpu-kernel" fn $name(
            q: *const f32,
            qf: *const f32,
            k_cache: *const u8,
            k_scale: *const f32,
            v_cache: *const u8,
            v_scale: *const f32,
            sel: *const u32,
            sel_n: *const u32,
            out: *mut f32,
            pos: *const u32,
            n_tokens: u32,
            n_head: u32,
            n_head_kv: u32,
            head_dim: u32,
            sel_stride: u32,
            use_sel: u32,
            scale: f32,
            _pad: u32,
        ) {
            // SAFETY: ABI (abi::QsaAttendArgs), as `attend` requires.
            unsafe {
                attend::<$i8>(
                    q, qf, k_cache, k_scale, v_cache, v_scale, sel, sel_n, out, pos, n_tokens, n_head, n_head_kv,
                    head_dim, sel_stride, use_sel, scale,
                )
            }
        }
    };
}
attend_kernel!(qsa_attend_f16, false);
attend_kernel!(qsa_attend_i8, true);
