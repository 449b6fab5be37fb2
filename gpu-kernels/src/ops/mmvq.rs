//! MMVQ: quantized weights × Q8_1 activations, 1..=8 activation columns, f32 out (decode).
//!
//! Work split (see docs/kernels.md for the reasoning and numbers):
//! 1. Staging: the workgroup copies all `NC` activation columns from global memory into LDS
//!    once (quants + `(d, s)` as f32), so the activations are read from memory once per
//!    workgroup rather than once per row. Types with lookup tables (IQ3_XXS) also put them in LDS.
//! 2. One *task* = one weight block of one row, done by one lane: every weight byte is loaded
//!    exactly once, with wide (b128) loads, and per-block scale decoding is not repeated.
//!    A row of `nt = k / block_k` tasks is spread over `L = min(32, 2^ceil(log2 nt))` lanes,
//!    so a wave works on `32 / L` rows at once (K = 4096 Q4_K: 16 tasks, 2 rows per wave).
//! 3. The `L` partial sums are added with DPP `row_xmask` butterflies (+ `permlanex16` when
//!    L = 32); the first lane of each row group stores the `NC` results.
//! Row indirection (`rows`) lets one launch compute the rows of selected MoE experts.
use super::mmvq_blocks::{ActCols, IQ3XXS, IQ4NL, MmvqBlock, Q4K, Q6K, Q8_0};
use super::unroll;
use crate::abi::{
    Q8_1_BYTES, WAVES_PER_WG, WG_SIZE, act_col_bytes, act_q_bytes, act_q_offset, mmvq_glu_kernels, mmvq_kernels,
    mmvq_lanes_log2, mmvq_moe_kernels,
};
use crate::arch::{
    Lds, ballot, barrier, group_id, group_id_y, group_sum_f32xn, lane_id, read_lane, thread_id, uniform, wave_id,
};
use crate::mem::{ld_u32, ld_u32x4};
use quant::f16_to_f32;

/// Copies `NC` Q8_1 columns of `k` values into LDS (layout: `abi::act_*`): staged column `c`
/// is column `xcol[c]` of `x`.
///
/// # Safety
/// `x` holds columns `xcol[c]` of `k / 32` Q8_1 blocks each (4-byte aligned); the launch has
/// `mmvq_lds_bytes(ty, k, NC)` bytes of LDS and `tb` is the type's table size.
#[inline(always)]
unsafe fn stage_activations<const NC: usize>(lds: Lds, x: *const u8, k: u32, tb: u32, xcol: &[u32; NC]) {
    let nblk = k / 32;
    let colb = act_col_bytes(k);
    let qb = act_q_bytes(k);
    let tid = thread_id();
    unroll::<NC>(|c| {
        let xc = xcol[c];
        let c = c as u32;
        let mut j = tid;
        while j < nblk {
            let src = (xc * nblk + j) * Q8_1_BYTES;
            // SAFETY: block (c, j) is inside `x` (caller contract).
            let (h, q0, q1) = unsafe {
                let p = x.add(src as usize);
                (ld_u32(p), ld_u32x4(p.add(4)), ld_u32x4(p.add(20)))
            };
            let base = tb + c * colb;
            let ds = [f16_to_f32(h as u16).to_bits(), f16_to_f32((h >> 16) as u16).to_bits()];
            // SAFETY: offsets inside the column (act_q_offset(j*32)+32 <= qb, j*8+8 <= ds
            // bytes), 16/8-byte aligned; block j is staged by this work-item only.
            unsafe {
                lds.st128(base + act_q_offset(j * 32), q0);
                lds.st128(base + act_q_offset(j * 32) + 16, q1);
                lds.st64(base + qb + j * 8, ds);
            }
            j += WG_SIZE;
        }
    });
}

/// The kernel body for weight type `B` and `NC` columns (arguments as `abi::MmvqArgs`).
///
/// # Safety
/// The buffers satisfy `abi::MmvqArgs`' contract and the launch has `WG_SIZE` work-items
/// and `mmvq_lds_bytes(B::TY, k, NC)` bytes of dynamic LDS.
#[inline(always)]
unsafe fn mmvq<B: MmvqBlock, const NC: usize>(
    w: *const u8,
    x: *const u8,
    y: *mut f32,
    rows: *const u32,
    nrows: u32,
    k: u32,
    y_stride: u32,
    rows_per_wg: u32,
) {
    let (xcol, ycol) = identity_cols::<NC>(y_stride);
    // SAFETY: caller contract.
    unsafe {
        mmvq_impl::<B, NC, false>(
            w,
            core::ptr::null(),
            x,
            y,
            rows,
            nrows,
            k,
            rows_per_wg,
            0,
            group_id() * rows_per_wg,
            &xcol,
            &ycol,
        )
    }
}

/// `ycol` entry of a padding column: computed, not stored.
const NO_COL: u32 = u32::MAX;

/// Columns `0..NC` of `x`, outputs at `c * y_stride` (the plain MMVQ layout).
#[inline(always)]
fn identity_cols<const NC: usize>(y_stride: u32) -> ([u32; NC], [u32; NC]) {
    (core::array::from_fn(|c| c as u32), core::array::from_fn(|c| c as u32 * y_stride))
}

/// The shared body; with `GLU` it also computes `u = W2[row] · x` (same rows, same order of
/// operations) and stores `act(y) * u` (act 0 = SiLU, 1 = GELU-tanh, `quant::fmath`), so the
/// fused result equals the separate MMVQ + GLU launches bit for bit.
///
/// The workgroup computes rows `row0 .. row0 + rows_per_wg` of staged column `c` = column
/// `xcol[c]` of `x`, storing row `i` at `y[ycol[c] + i]`.
///
/// # Safety
/// As `mmvq`; with `GLU`, `w2` has the shape of `w`; `x` holds the columns `xcol` and `y` the
/// outputs `ycol[c] + i` for `i < nrows`, distinct per (c, i).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn mmvq_impl<B: MmvqBlock, const NC: usize, const GLU: bool>(
    w: *const u8,
    w2: *const u8,
    x: *const u8,
    y: *mut f32,
    rows: *const u32,
    nrows: u32,
    k: u32,
    rows_per_wg: u32,
    act: u32,
    row0: u32,
    xcol: &[u32; NC],
    ycol: &[u32; NC],
) {
    let lds = Lds::get();
    let tb = 0; // the type's tables are in static LDS (Lds::tables)
    B::stage_tables(Lds::tables());
    // SAFETY: caller contract.
    unsafe { stage_activations::<NC>(lds, x, k, tb, xcol) };
    barrier();

    let nt = k / B::TY.block_k();
    let lg = uniform(mmvq_lanes_log2(B::TY, k));
    let lanes = 1u32 << lg;
    let rows_per_iter = 32 >> lg;
    let lane = lane_id();
    let sub = lane >> lg;
    let li = lane & (lanes - 1);
    if row0 >= nrows {
        return;
    }
    let wg_rows = rows_per_wg.min(nrows - row0);
    let row_bytes = nt as usize * B::TY.block_bytes() as usize;
    let cols = ActCols::new(lds, k, tb);

    let mut g = wave_id() * rows_per_iter;
    while g < wg_rows {
        let i = g + sub;
        let valid = i < wg_rows;
        let out = row0 + i;
        let mut acc = [0f32; NC];
        let mut acc2 = [0f32; NC];
        if valid {
            // SAFETY: `rows` (when not null) holds `nrows` indices of rows of `w` (ABI).
            let r = if rows.is_null() { out } else { unsafe { *rows.add(out as usize) } };
            // SAFETY: row `r` of `w` has `nt` blocks (ABI).
            let wrow = unsafe { w.add(r as usize * row_bytes) };
            let mut t = li;
            while t < nt {
                // SAFETY: task t < nt is block t of the row.
                unsafe { B::dot::<NC>(wrow.add(t as usize * B::TY.block_bytes() as usize), t, &cols, &mut acc) };
                t += lanes;
            }
            if GLU {
                // SAFETY: `w2` has the shape of `w` (caller contract).
                let wrow2 = unsafe { w2.add(r as usize * row_bytes) };
                let mut t = li;
                while t < nt {
                    // SAFETY: task t < nt is block t of the row.
                    unsafe { B::dot::<NC>(wrow2.add(t as usize * B::TY.block_bytes() as usize), t, &cols, &mut acc2) };
                    t += lanes;
                }
            }
        }
        // Uniform control flow again: all lanes take part in the butterflies.
        group_sum_f32xn(&mut acc, lg);
        if GLU {
            group_sum_f32xn(&mut acc2, lg);
        }
        if valid && li == 0 {
            unroll::<NC>(|c| {
                let v = if GLU {
                    let a = if act == 0 { quant::fmath::silu(acc[c]) } else { quant::fmath::gelu_tanh(acc[c]) };
                    a * acc2[c]
                } else {
                    acc[c]
                };
                // Padding columns (`NO_COL`, expert dispatch) are computed but not stored.
                if ycol[c] != NO_COL {
                    // SAFETY: `y` holds every output `ycol[c] + out` (caller contract); one writer per output.
                    unsafe { *y.add((ycol[c] + out) as usize) = v };
                }
            });
        }
        g += WAVES_PER_WG * rows_per_iter;
    }
}

macro_rules! define_mmvq {
    ($($name:ident $ty:ident $nc:literal),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub extern "gpu-kernel" fn $name(
            w: *const u8, x: *const u8, y: *mut f32, rows: *const u32,
            nrows: u32, k: u32, y_stride: u32, rows_per_wg: u32,
        ) {
            // SAFETY: the host launches per abi::MmvqArgs (checked in gpu-executor/src).
            unsafe { mmvq::<$ty, $nc>(w, x, y, rows, nrows, k, y_stride, rows_per_wg) }
        }
    )*};
}
mmvq_kernels!(define_mmvq);

macro_rules! define_mmvq_glu {
    ($($name:ident $ty:ident $nc:literal),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub extern "gpu-kernel" fn $name(
            wg: *const u8, wu: *const u8, x: *const u8, y: *mut f32, rows: *const u32,
            nrows: u32, k: u32, y_stride: u32, rows_per_wg: u32, act: u32, _pad: u32,
        ) {
            let (xcol, ycol) = identity_cols::<$nc>(y_stride);
            // SAFETY: the host launches per abi::MmvqGluArgs (gpu-executor/src/ops.rs).
            unsafe {
                mmvq_impl::<$ty, $nc, true>(wg, wu, x, y, rows, nrows, k, rows_per_wg, act, group_id() * rows_per_wg, &xcol, &ycol)
            }
        }
    )*};
}
mmvq_glu_kernels!(define_mmvq_glu);

/// One pass of `mmvq_moe`: the next `NC` slots of `mask` (lowest first) as staged columns;
/// when `mask` has fewer, the rest are padding columns (computed on a copy, not stored).
///
/// # Safety
/// As `mmvq_impl`; `mask` has at least one bit set, all `< n_slots`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn moe_pass<B: MmvqBlock, const NC: usize, const GLU: bool>(
    w: *const u8,
    w2: *const u8,
    x: *const u8,
    y: *mut f32,
    mask: &mut u64,
    cols: *const u32,
    x_div: u32,
    nrows: u32,
    k: u32,
    rows_per_wg: u32,
    act: u32,
    row0: u32,
) {
    let mut xcol = [0u32; NC];
    let mut ycol = [0u32; NC];
    unroll::<NC>(|c| {
        if *mask != 0 {
            let s = mask.trailing_zeros();
            *mask &= *mask - 1;
            xcol[c] = if cols.is_null() {
                s / x_div
            } else {
                // One lane loads the column and the wave shares it (a word read by every lane
                // would move 128 bytes a wave).
                // SAFETY: a non-null `cols` holds the launch's n_slots u32 (ABI), s < n_slots.
                read_lane(if lane_id() == 0 { unsafe { *cols.add(s as usize) } } else { 0 }, 0)
            };
            ycol[c] = s * nrows;
        } else {
            // Padding (fewer slots than NC): stage the previous column again, store nothing.
            xcol[c] = if c > 0 { xcol[c - 1] } else { 0 };
            ycol[c] = NO_COL;
        }
    });
    // SAFETY: caller contract (rows: the identity).
    unsafe { mmvq_impl::<B, NC, GLU>(w, w2, x, y, core::ptr::null(), nrows, k, rows_per_wg, act, row0, &xcol, &ycol) }
}

/// Expert-dispatch MMVQ (`abi::MmvqMoeArgs`): workgroup (x, y) = (row group, slot). The slot's expert is read from `ids` (by wave 0, which shares the
/// result through LDS); the first slot of each expert gathers every slot with that expert into
/// a bit mask and computes them `G` columns per pass (a barrier between passes, which reuse
/// the LDS); the other slots' workgroups exit.
///
/// # Safety
/// The buffers satisfy `abi::MmvqMoeArgs`' contract and the launch has `WG_SIZE` work-items
/// and `mmvq_moe_lds_bytes(B::TY, k, G)` bytes of dynamic LDS.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn mmvq_moe<B: MmvqBlock, const G: usize, const GLU: bool>(
    w: *const u8,
    w2: *const u8,
    x: *const u8,
    y: *mut f32,
    ids: *const u32,
    expert_bytes: u64,
    cols: *const u32,
    n_slots: u32,
    x_div: u32,
    nrows: u32,
    k: u32,
    rows_per_wg: u32,
    n_expert: u32,
    act: u32,
) {
    if x_div == 0 || n_slots > crate::abi::MOE_MAX_SLOTS {
        return; // the host never launches this (GpuOps::mmvq_moe checks)
    }
    let s = group_id_y();
    let row0 = group_id() * rows_per_wg;
    if s >= n_slots || row0 >= nrows {
        return;
    }
    // Wave 0 scans the choice and leaves the group record in LDS (the other waves would read
    // the same ids again).
    let lds = Lds::get();
    let info = crate::abi::mmvq_moe_info_offset(B::TY, k, G as u32);
    if wave_id() == 0 {
        // SAFETY: `ids` holds `n_slots` u32 (ABI) and s < n_slots.
        let e = uniform(unsafe { *ids.add(s as usize) });
        if e >= n_expert && e != crate::abi::MOE_SLOT_MISS {
            // A corrupt choice must not index past the expert stack.
            core::intrinsics::abort();
        }
        // Lane l compares slots l and l + 32 (n_slots <= 64): two coalesced loads, two ballots.
        let l = lane_id();
        // SAFETY: only slots < n_slots are read (ABI: `ids` holds n_slots u32).
        let (a, b) = unsafe {
            (
                if l < n_slots { *ids.add(l as usize) } else { u32::MAX },
                if l + 32 < n_slots { *ids.add(l as usize + 32) } else { u32::MAX },
            )
        };
        let all = ballot(a == e) as u64 | (ballot(b == e) as u64) << 32;
        // Slots before s with the same expert: one of them leads. A miss of the expert cache
        // (MOE_SLOT_MISS: the host computes its row) leads nothing, so every wave exits.
        let lead = (e != crate::abi::MOE_SLOT_MISS && (all & ((1u64 << s) - 1)) == 0) as u32;
        let mask = all & !((1u64 << s) - 1);
        if l == 0 {
            // SAFETY: the record lies after the staged columns inside the launch's LDS
            // (mmvq_moe_lds_bytes), 16-byte aligned; one writer, read after the barrier.
            unsafe { lds.st128(info, [mask as u32, (mask >> 32) as u32, e, lead]) };
        }
    }
    barrier();
    // SAFETY: written before the barrier, read-only from now on.
    let rec = unsafe { lds.ld128(info) };
    if uniform(rec[3]) == 0 {
        return;
    }
    let e = uniform(rec[2]);
    let mut mask = uniform(rec[0]) as u64 | (uniform(rec[1]) as u64) << 32;
    let off = e as usize * expert_bytes as usize;
    // SAFETY: e < n_expert: expert e's matrices lie inside the stacks (ABI).
    let (we, w2e) = unsafe { (w.add(off), if GLU { w2.add(off) } else { w2 }) };
    let mut first = true;
    while mask != 0 {
        if !first {
            barrier(); // every wave is done with the previous pass's LDS
        }
        first = false;
        let n = mask.count_ones();
        let n = if n < G as u32 { n } else { G as u32 };
        // SAFETY: `mask` has >= n bits, all slots < n_slots; caller contract for the rest.
        unsafe {
            macro_rules! pass {
                ($nc:literal) => {
                    moe_pass::<B, $nc, GLU>(we, w2e, x, y, &mut mask, cols, x_div, nrows, k, rows_per_wg, act, row0)
                };
            }
            // Q6_K: one 1-column body and one G-column body with padding, since the register
            // allocation of all G bodies in one kernel spills on gfx1102 (see `mmvq_moe_kernels!`).
            if matches!(B::TY, crate::abi::WType::Q6K) && !GLU && n > 1 {
                macro_rules! padded {
                    ($nc:literal) => {
                        if G == $nc {
                            pass!($nc)
                        }
                    };
                }
                padded!(2);
                padded!(3);
                padded!(4);
                padded!(8);
                if !matches!(G, 2 | 3 | 4 | 8) {
                    core::intrinsics::abort(); // no padded body: never instantiated (`mmvq_moe_kernels!`)
                }
                continue;
            }
            match n {
                1 => pass!(1),
                2 if G >= 2 => pass!(2),
                3 if G >= 3 => pass!(3),
                4 if G >= 4 => pass!(4),
                5 if G >= 5 => pass!(5),
                6 if G >= 6 => pass!(6),
                7 if G >= 7 => pass!(7),
                8 if G >= 8 => pass!(8),
                _ => core::intrinsics::abort(),
            }
        }
    }
}

macro_rules! define_mmvq_moe {
    ($($name:ident $ty:ident $g:literal $glu:literal),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub extern "gpu-kernel" fn $name(
            w: *const u8, w2: *const u8, x: *const u8, y: *mut f32, ids: *const u32, expert_bytes: u64, cols: *const u32,
            n_slots: u32, x_div: u32, nrows: u32, k: u32, rows_per_wg: u32, n_expert: u32, act: u32, _pad: u32,
        ) {
            // SAFETY: the host launches per abi::MmvqMoeArgs (gpu-executor/src/ops.rs).
            unsafe {
                mmvq_moe::<$ty, $g, $glu>(w, w2, x, y, ids, expert_bytes, cols, n_slots, x_div, nrows, k, rows_per_wg, n_expert, act)
            }
        }
    )*};
}
mmvq_moe_kernels!(define_mmvq_moe);
