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
use super::unroll;
use super::mmvq_blocks::{ActCols, MmvqBlock, Q4K, Q6K, Q8_0, IQ3XXS};
use crate::abi::{act_col_bytes, act_q_bytes, act_q_offset, mmvq_lanes_log2, Q8_1_BYTES, WAVES_PER_WG, WG_SIZE};
use crate::arch::{barrier, group_id, group_sum_f32xn, lane_id, thread_id, uniform, wave_id, Lds};
use crate::mem::{ld_u32, ld_u32x4};
use quant::f16_to_f32;

/// Copies `NC` Q8_1 columns of `k` values into LDS (layout: `abi::act_*`).
///
/// # Safety
/// `x` holds `NC * k / 32` Q8_1 blocks (4-byte aligned); the launch has
/// `mmvq_lds_bytes(ty, k, NC)` bytes of LDS and `tb` is the type's table size.
#[inline(always)]
unsafe fn stage_activations<const NC: usize>(lds: Lds, x: *const u8, k: u32, tb: u32) {
    let nblk = k / 32;
    let colb = act_col_bytes(k);
    let qb = act_q_bytes(k);
    let tid = thread_id();
    unroll::<NC>(|c| {
        let c = c as u32;
        let mut j = tid;
        while j < nblk {
            let src = (c * nblk + j) * Q8_1_BYTES;
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
    // SAFETY: caller contract.
    unsafe { mmvq_impl::<B, NC, false>(w, core::ptr::null(), x, y, rows, nrows, k, y_stride, rows_per_wg, 0) }
}

/// The shared body; with `GLU` it also computes `u = W2[row] · x` (same rows, same order of
/// operations) and stores `act(y) * u` (act 0 = SiLU, 1 = GELU-tanh, `quant::fmath`), so the
/// fused result equals the separate MMVQ + GLU launches bit for bit.
///
/// # Safety
/// As `mmvq`; with `GLU`, `w2` has the shape of `w`.
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
    y_stride: u32,
    rows_per_wg: u32,
    act: u32,
) {
    let lds = Lds::get();
    let tb = 0; // the type's tables are in static LDS (Lds::tables)
    B::stage_tables(Lds::tables());
    // SAFETY: caller contract.
    unsafe { stage_activations::<NC>(lds, x, k, tb) };
    barrier();

    let nt = k / B::TY.block_k();
    let lg = uniform(mmvq_lanes_log2(B::TY, k));
    let lanes = 1u32 << lg;
    let rows_per_iter = 32 >> lg;
    let lane = lane_id();
    let sub = lane >> lg;
    let li = lane & (lanes - 1);
    let row0 = group_id() * rows_per_wg;
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
                // SAFETY: `y` holds NC columns of `y_stride >= nrows` f32 (ABI); one writer per output.
                unsafe { *y.add((c as u32 * y_stride + out) as usize) = v };
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
            // SAFETY: the host launches per abi::MmvqArgs (checked in engine/src/gpu).
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
            // SAFETY: the host launches per abi::MmvqGluArgs (engine/src/gpu/ops.rs).
            unsafe { mmvq_impl::<$ty, $nc, true>(wg, wu, x, y, rows, nrows, k, y_stride, rows_per_wg, act) }
        }
    )*};
}
mmvq_glu_kernels!(define_mmvq_glu);
