//! The ABI of the MMVQ kernels (gpu-kernels ops/mmvq.rs, ops/mmvq_blocks.rs): decode products of quantized
//! weights and 1-8 Q8_1 activation columns, their fused gate/up + GLU form and the expert
//! dispatch form (`mmvq_moe_*`): argument structs, the staged-activation LDS layout, launch
//! geometry and the kernel lists (exported at the crate root). A part of the ABI, re-exported
//! by the crate root; same rules.

use super::*;

/// Arguments of every `mmvq_*` kernel, in parameter order (kernarg offsets 0..48).
///
/// Computes, for every activation column `c < NC` and output row `i < nrows`,
/// `y[c * y_stride + i] = dot(W[row(i)], x[c])` with `row(i) = rows[i]` or `i` if `rows` is 0,
/// `W` row-major with `k` weights per row (`k % block_k == 0`), `x` = `NC` consecutive Q8_1
/// vectors of `k / 32` blocks each. Workgroup `g` handles output rows
/// `g * rows_per_wg .. min((g + 1) * rows_per_wg, nrows)`; launch `ceil(nrows / rows_per_wg)`
/// workgroups of `WG_SIZE` with `mmvq_lds_bytes(ty, k, NC)` bytes of dynamic LDS.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MmvqArgs {
    pub w: u64,
    pub x: u64,
    pub y: u64,
    /// Device pointer to `nrows` u32 row indices, or 0 for the identity.
    pub rows: u64,
    pub nrows: u32,
    pub k: u32,
    pub y_stride: u32,
    pub rows_per_wg: u32,
}

/// LDS layout of the staged Q8_1 activations of one column: the quants, with 16 bytes of
/// padding after every 256 (so that lanes reading different super-blocks hit different LDS
/// banks), then the block scales as f32 pairs `(d, s)`.
#[inline(always)]
pub const fn act_q_offset(k: u32) -> u32 {
    k + (k >> 8) * 16
}
/// Bytes of the quant part of one column (16-byte multiple).
#[inline(always)]
pub const fn act_q_bytes(k: u32) -> u32 {
    (act_q_offset(k) + 15) & !15
}
/// Bytes of the scale part of one column: one `(d, s)` f32 pair per 32 values.
#[inline(always)]
pub const fn act_ds_bytes(k: u32) -> u32 {
    (k / 32) * 8
}
/// Bytes of one staged column.
#[inline(always)]
pub const fn act_col_bytes(k: u32) -> u32 {
    act_q_bytes(k) + act_ds_bytes(k)
}
/// Dynamic LDS an MMVQ launch passes: the `ncols` staged columns (the type's tables are static).
#[inline(always)]
pub const fn mmvq_lds_bytes(_ty: WType, k: u32, ncols: u32) -> u32 {
    ncols * act_col_bytes(k)
}

/// log2 of the lanes an MMVQ kernel spreads one row over: a row of `nt = k / block_k` blocks
/// (one block per lane and step) gets `min(32, next_pow2(nt))` lanes, so a wave works on
/// `32 >> lg` rows at once.
#[inline(always)]
pub const fn mmvq_lanes_log2(ty: WType, k: u32) -> u32 {
    let nt = k / ty.block_k();
    if nt <= 1 {
        0
    } else {
        let lg = 32 - (nt - 1).leading_zeros();
        if lg > 5 { 5 } else { lg }
    }
}

/// Global bytes one MMVQ workgroup reads besides its weight rows, as the software device counts
/// them: the `ncols` staged Q8_1 columns (each workgroup stages every column in full: no cache
/// shares them between workgroups), the type's tables (IQ3_XXS: the 1 KiB grid and 128 sign
/// bytes from the code object) and the kernel arguments each of the 8 waves loads.
#[inline(always)]
pub const fn mmvq_wg_overhead_bytes(ty: WType, k: u32, ncols: u32) -> u32 {
    let tables = match ty {
        WType::IQ3XXS => IQ3_GRID_LDS_BYTES + 128,
        _ => 0,
    };
    ncols * (k / 32) * Q8_1_BYTES + tables + WAVES_PER_WG * MmvqArgs::SIZE as u32
}

/// The MMVQ geometry targets: the per-workgroup overhead (`mmvq_wg_overhead_bytes`) stays at
/// most this percentage of the workgroup's weight bytes, which keeps a whole launch under
/// 1.10x the ideal global bytes (weights + activations + outputs once) for every type and
/// column count; and a workgroup has at least `MMVQ_MIN_ROWS_PER_WG` rows.
pub const MMVQ_OVERHEAD_PERCENT: u32 = 9;
pub const MMVQ_MIN_ROWS_PER_WG: u32 = 64;

/// Rows per workgroup of an MMVQ launch of `ty` with `k` weights per row, `nrows` output rows
/// and `ncols` activation columns: the single rule every launcher uses (docs/kernels.md,
/// "MMVQ launch geometry").
///
/// Every workgroup stages all `ncols` activation columns, so the bytes beyond the ideal grow
/// with `ncols x workgroups`: the rule takes the fewest rows that keep that overhead within
/// `MMVQ_OVERHEAD_PERCENT` of the weight bytes (at least `MMVQ_MIN_ROWS_PER_WG`), rounded up to
/// a multiple of the rows the 8 waves cover per step, then spreads `nrows` evenly over the
/// resulting number of workgroups. More columns => more rows per workgroup => fewer
/// workgroups (4096 rows: 64 with 1 column; 43 / 22 / 32 / 16 for Q8_0 / Q4_K / Q6_K /
/// IQ3_XXS with 8 columns). Never more rows than `nrows` (rounded up to the rows of one wave
/// step).
pub const fn mmvq_rows_per_wg(ty: WType, k: u32, nrows: u32, ncols: u32) -> u32 {
    let per_step = 32 >> mmvq_lanes_log2(ty, k);
    let step = WAVES_PER_WG * per_step;
    let nt = if k / ty.block_k() == 0 { 1 } else { k / ty.block_k() };
    let row_bytes = nt as u64 * ty.block_bytes() as u64;
    let extra = mmvq_wg_overhead_bytes(ty, k, if ncols == 0 { 1 } else { ncols }) as u64;
    let need = (extra * 100).div_ceil(row_bytes * MMVQ_OVERHEAD_PERCENT as u64);
    let mut r = MMVQ_MIN_ROWS_PER_WG as u64;
    if need > r {
        r = need;
    }
    r = r.div_ceil(step as u64) * step as u64;
    let n = if nrows == 0 { 1 } else { nrows as u64 };
    // Same number of workgroups, rows spread evenly (the last one is not left nearly empty).
    let groups = n.div_ceil(r);
    r = n.div_ceil(groups).div_ceil(step as u64) * step as u64;
    let cap = n.div_ceil(per_step as u64) * per_step as u64;
    (if r < cap { r } else { cap }) as u32
}

/// Every MMVQ instantiation: `symbol, weight type, columns`. Invokes `$m!` with the list.
#[macro_export]
macro_rules! mmvq_kernels {
    ($m:ident) => {
        $m! {
            mmvq_q8_0_q8_1_c1 Q8_0 1, mmvq_q8_0_q8_1_c2 Q8_0 2, mmvq_q8_0_q8_1_c3 Q8_0 3,
            mmvq_q8_0_q8_1_c4 Q8_0 4, mmvq_q8_0_q8_1_c5 Q8_0 5, mmvq_q8_0_q8_1_c6 Q8_0 6,
            mmvq_q8_0_q8_1_c7 Q8_0 7, mmvq_q8_0_q8_1_c8 Q8_0 8,
            mmvq_q4_k_q8_1_c1 Q4K 1, mmvq_q4_k_q8_1_c2 Q4K 2, mmvq_q4_k_q8_1_c3 Q4K 3,
            mmvq_q4_k_q8_1_c4 Q4K 4, mmvq_q4_k_q8_1_c5 Q4K 5, mmvq_q4_k_q8_1_c6 Q4K 6,
            mmvq_q4_k_q8_1_c7 Q4K 7, mmvq_q4_k_q8_1_c8 Q4K 8,
            mmvq_q6_k_q8_1_c1 Q6K 1, mmvq_q6_k_q8_1_c2 Q6K 2, mmvq_q6_k_q8_1_c3 Q6K 3,
            mmvq_q6_k_q8_1_c4 Q6K 4, mmvq_q6_k_q8_1_c5 Q6K 5, mmvq_q6_k_q8_1_c6 Q6K 6,
            mmvq_q6_k_q8_1_c7 Q6K 7, mmvq_q6_k_q8_1_c8 Q6K 8,
            mmvq_iq3_xxs_q8_1_c1 IQ3XXS 1, mmvq_iq3_xxs_q8_1_c2 IQ3XXS 2,
            mmvq_iq3_xxs_q8_1_c3 IQ3XXS 3, mmvq_iq3_xxs_q8_1_c4 IQ3XXS 4,
            mmvq_iq3_xxs_q8_1_c5 IQ3XXS 5, mmvq_iq3_xxs_q8_1_c6 IQ3XXS 6,
            mmvq_iq3_xxs_q8_1_c7 IQ3XXS 7, mmvq_iq3_xxs_q8_1_c8 IQ3XXS 8,
            mmvq_iq4_nl_q8_1_c1 IQ4NL 1, mmvq_iq4_nl_q8_1_c2 IQ4NL 2, mmvq_iq4_nl_q8_1_c3 IQ4NL 3,
            mmvq_iq4_nl_q8_1_c4 IQ4NL 4, mmvq_iq4_nl_q8_1_c5 IQ4NL 5, mmvq_iq4_nl_q8_1_c6 IQ4NL 6,
            mmvq_iq4_nl_q8_1_c7 IQ4NL 7, mmvq_iq4_nl_q8_1_c8 IQ4NL 8,
        }
    };
}

/// Arguments of `mmvq_moe_*` (and `mmvq_moe_glu_*`): MMVQ over the experts the router chose,
/// with the choice read on the device (`ids` = `n_slots` u32 written by `moe_router`, slot
/// `s` = token `s / k`, rank `s % k`). For every slot `s < n_slots` and row `i < nrows`:
/// `y[s * nrows + i] = dot(W_e[i], x[c(s)])` with `e = ids[s]`, `c(s) = s / x_div` (or `cols[s]`
/// when `cols` is not 0: slots sorted by expert, [`MoeSortArgs`](crate::MoeSortArgs)) and
/// `W_e = w + e * expert_bytes` (row-major, `k` weights per row); the GLU form stores
/// `act(W_e[i] · x) * (U_e[i] · x)` with `U_e = w2 + e * expert_bytes` (`act` 0 = SiLU,
/// 1 = GELU-tanh). `x` = Q8_1 columns of `k / 32` blocks (gate/up: `x_div` = k, the token's
/// normed input; down: 1, the slot's own activation).
///
/// Slots that chose the same expert are computed together (the first of them leads; the
/// others' workgroups exit), up to `G` columns per pass (the kernel's `_g<G>` suffix), so each
/// expert's weights are read once per window as on the host-readback path. The per-row order
/// of operations is `mmvq_*`'s, so results are bit-identical to it. A slot whose id is
/// [`MOE_SLOT_MISS`] is skipped (its output row is not written); any other id `>= n_expert`
/// traps (`s_trap 2`): no out-of-bounds read. Grid: 2-D, `[ceil(nrows / rows_per_wg),
/// n_slots, 1]` workgroups (x = row group, y = slot) of `WG_SIZE`, dynamic LDS
/// `mmvq_moe_lds_bytes(ty, k, G)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MmvqMoeArgs {
    pub w: u64,
    /// Up weights of the GLU form (0 for the plain kernels).
    pub w2: u64,
    pub x: u64,
    pub y: u64,
    pub ids: u64,
    pub expert_bytes: u64,
    /// Device pointer to `n_slots` u32 activation columns, or 0 for `s / x_div`.
    pub cols: u64,
    pub n_slots: u32,
    pub x_div: u32,
    pub nrows: u32,
    pub k: u32,
    pub rows_per_wg: u32,
    pub n_expert: u32,
    pub act: u32,
    pub _pad: u32,
}
impl_args_bytes!(MmvqMoeArgs);
const _: () = assert!(core::mem::size_of::<MmvqMoeArgs>() == 88);
/// Most slots (tokens x experts per token) of one `mmvq_moe_*` launch: 8 tokens x 8 experts,
/// a u64 slot mask (a wider routing, e.g. Flash-Next's top-10, launches fewer tokens at once).
pub const MOE_MAX_SLOTS: u32 = MAX_COLS as u32 * 8;
const _: () = assert!(MOE_MAX_SLOTS <= 64);

/// Every expert-dispatch MMVQ instantiation: `symbol, weight type, columns per pass, GLU`.
/// `g1`: decode (one token: every expert has one slot); `g8` / `g4`: windows of 2..=8 tokens
/// (the GLU forms keep 4 columns per pass: 8 would spill). Q6_K's plain g4 has two bodies, 1
/// and 4 columns (a pass of 2-3 slots pads to 4): with the 2- and 3-column bodies as well its
/// registers spilled to scratch on gfx1102, whose VGPR file is smaller.
#[macro_export]
macro_rules! mmvq_moe_kernels {
    ($m:ident) => {
        $m! {
            mmvq_moe_q8_0_g1 Q8_0 1 false, mmvq_moe_q8_0_g8 Q8_0 8 false,
            mmvq_moe_q4_k_g1 Q4K 1 false, mmvq_moe_q4_k_g8 Q4K 8 false,
            mmvq_moe_q6_k_g1 Q6K 1 false, mmvq_moe_q6_k_g4 Q6K 4 false,
            mmvq_moe_iq3_xxs_g1 IQ3XXS 1 false, mmvq_moe_iq3_xxs_g8 IQ3XXS 8 false,
            mmvq_moe_iq4_nl_g1 IQ4NL 1 false, mmvq_moe_iq4_nl_g8 IQ4NL 8 false,
            mmvq_moe_glu_q8_0_g1 Q8_0 1 true, mmvq_moe_glu_q8_0_g4 Q8_0 4 true,
            mmvq_moe_glu_q4_k_g1 Q4K 1 true, mmvq_moe_glu_q4_k_g4 Q4K 4 true,
            mmvq_moe_glu_q6_k_g1 Q6K 1 true, mmvq_moe_glu_q6_k_g4 Q6K 4 true,
            mmvq_moe_glu_iq3_xxs_g1 IQ3XXS 1 true, mmvq_moe_glu_iq3_xxs_g4 IQ3XXS 4 true,
            mmvq_moe_glu_iq4_nl_g1 IQ4NL 1 true, mmvq_moe_glu_iq4_nl_g4 IQ4NL 4 true,
        }
    };
}
macro_rules! mmvq_moe_name_table {
    ($($name:ident $ty:ident $g:literal $glu:literal),* $(,)?) => {
        /// `(type, columns per pass, GLU, symbol)` of every expert-dispatch MMVQ kernel.
        pub const MMVQ_MOE_KERNELS: &[(WType, u32, bool, &str)] = &[$((WType::$ty, $g, $glu, stringify!($name))),*];
    };
}
mmvq_moe_kernels!(mmvq_moe_name_table);
/// LDS offset of the 16-byte group record of an expert-dispatch launch (`[mask lo, mask hi,
/// expert, leads]`, written by wave 0 after it scanned `ids`, read by every wave): after the
/// staged columns.
#[inline(always)]
pub const fn mmvq_moe_info_offset(ty: WType, k: u32, g: u32) -> u32 {
    (mmvq_lds_bytes(ty, k, g) + 15) & !15
}
/// Dynamic LDS an expert-dispatch launch passes: `g` staged columns and the group record.
#[inline(always)]
pub const fn mmvq_moe_lds_bytes(ty: WType, k: u32, g: u32) -> u32 {
    mmvq_moe_info_offset(ty, k, g) + 16
}
/// Most columns per pass of the expert-dispatch kernels for `ty` (GLU form or not).
pub fn mmvq_moe_max_group(ty: WType, glu: bool) -> u32 {
    MMVQ_MOE_KERNELS.iter().filter(|(t, _, f, _)| *t == ty && *f == glu).map(|e| e.1).max().unwrap_or(1)
}
/// Symbol of the expert-dispatch MMVQ kernel for `ty`, GLU form or not, `g` columns per pass.
pub fn mmvq_moe_kernel(ty: WType, glu: bool, g: u32) -> Option<&'static str> {
    MMVQ_MOE_KERNELS.iter().find(|(t, n, f, _)| *t == ty && *n == g && *f == glu).map(|e| e.3)
}

/// Every fused gate/up MMVQ + GLU instantiation: `symbol, weight type, columns` (1..=4).
#[macro_export]
macro_rules! mmvq_glu_kernels {
    ($m:ident) => {
        $m! {
            mmvq_glu_q8_0_c1 Q8_0 1, mmvq_glu_q8_0_c2 Q8_0 2, mmvq_glu_q8_0_c3 Q8_0 3, mmvq_glu_q8_0_c4 Q8_0 4,
            mmvq_glu_q4_k_c1 Q4K 1, mmvq_glu_q4_k_c2 Q4K 2, mmvq_glu_q4_k_c3 Q4K 3, mmvq_glu_q4_k_c4 Q4K 4,
            mmvq_glu_q6_k_c1 Q6K 1, mmvq_glu_q6_k_c2 Q6K 2, mmvq_glu_q6_k_c3 Q6K 3, mmvq_glu_q6_k_c4 Q6K 4,
            mmvq_glu_iq3_xxs_c1 IQ3XXS 1, mmvq_glu_iq3_xxs_c2 IQ3XXS 2, mmvq_glu_iq3_xxs_c3 IQ3XXS 3,
            mmvq_glu_iq3_xxs_c4 IQ3XXS 4,
            mmvq_glu_iq4_nl_c1 IQ4NL 1, mmvq_glu_iq4_nl_c2 IQ4NL 2, mmvq_glu_iq4_nl_c3 IQ4NL 3, mmvq_glu_iq4_nl_c4 IQ4NL 4,
        }
    };
}
/// Most columns of one fused MMVQ + GLU launch (more spill registers; the host splits).
pub const MAX_GLU_COLS: u32 = 4;

/// Arguments of `mmvq_glu_*`: `y[c * y_stride + i] = act(Wg[row(i)] · x[c]) * (Wu[row(i)] ·
/// x[c])`, otherwise exactly `MmvqArgs` (same launch geometry and LDS); `act` 0 = SiLU,
/// 1 = GELU-tanh.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MmvqGluArgs {
    pub wg: u64,
    pub wu: u64,
    pub x: u64,
    pub y: u64,
    pub rows: u64,
    pub nrows: u32,
    pub k: u32,
    pub y_stride: u32,
    pub rows_per_wg: u32,
    pub act: u32,
    pub _pad: u32,
}

macro_rules! mmvq_name_table {
    ($($name:ident $ty:ident $nc:literal),* $(,)?) => {
        /// `(type, columns, symbol)` of every MMVQ kernel.
        pub const MMVQ_KERNELS: &[(WType, u32, &str)] = &[$((WType::$ty, $nc, stringify!($name))),*];
    };
}
mmvq_kernels!(mmvq_name_table);

/// Symbol of the MMVQ kernel for `ty` with `ncols` columns (1..=MAX_COLS).
pub fn mmvq_kernel(ty: WType, ncols: u32) -> Option<&'static str> {
    MMVQ_KERNELS.iter().find(|(t, n, _)| *t == ty && *n == ncols).map(|(_, _, s)| *s)
}
macro_rules! mmvq_glu_name_table {
    ($($name:ident $ty:ident $nc:literal),* $(,)?) => {
        /// `(type, columns, symbol)` of every fused gate/up MMVQ + GLU kernel.
        pub const MMVQ_GLU_KERNELS: &[(WType, u32, &str)] = &[$((WType::$ty, $nc, stringify!($name))),*];
    };
}
mmvq_glu_kernels!(mmvq_glu_name_table);
/// Symbol of the fused MMVQ + GLU kernel for `ty` with `ncols` columns.
pub fn mmvq_glu_kernel(ty: WType, ncols: u32) -> Option<&'static str> {
    MMVQ_GLU_KERNELS.iter().find(|(t, n, _)| *t == ty && *n == ncols).map(|(_, _, s)| *s)
}
