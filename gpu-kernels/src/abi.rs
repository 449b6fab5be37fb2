//! The kernel ABI, shared verbatim by the device crate and the host (`engine/src/gpu/`
//! includes this file with `#[path]`), so kernel names, argument layouts, workgroup sizes and
//! LDS layouts exist exactly once.
//!
//! Rules (see docs/kernels.md):
//! - Kernel arguments are scalars only: 8-byte pointers and 4-byte `u32`s, in the order of the
//!   `#[repr(C)]` `*Args` struct here. A struct passed *by value* to a Rust `gpu-kernel` would
//!   become a pointer (ABI trap), so the device side takes the fields as separate parameters and
//!   the host packs this struct's bytes, checked against the code object's kernarg metadata.
//! - Every symbol name is produced by `stringify!` from the single lists below
//!   (`mmvq_kernels!`, `dequant_kernels!`): the device crate defines one kernel per entry, the
//!   host builds its name tables from the same lists.
//! - Plain `no_std` Rust without dependencies: this file compiles for amdgcn and for the host.

/// Work-items per workgroup of every kernel in this crate (8 wave32 waves).
pub const WG_SIZE: u32 = 256;
/// Waves per workgroup.
pub const WAVES_PER_WG: u32 = WG_SIZE / 32;
/// Most activation columns one MMVQ launch handles (one instantiation per count).
pub const MAX_COLS: usize = 8;
/// LDS per workgroup the kernels may assume (gfx11: 64 KiB per workgroup).
pub const MAX_LDS_BYTES: u32 = 65536;

/// Activation quantization: Q8_1 (36-byte blocks of 32) and Q8_K (292-byte blocks of 256).
pub const QUANTIZE_Q8_1: &str = "quantize_q8_1";
pub const QUANTIZE_Q8_K: &str = "quantize_q8_k";
pub const QK8_1: u32 = 32;
pub const Q8_1_BYTES: u32 = 36;
pub const QK_K: u32 = 256;
pub const Q8_K_BYTES: u32 = 292;

/// Weight formats the MMVQ and dequant kernels support (ggml layouts, see the `quant` crate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WType {
    Q8_0,
    Q4K,
    Q6K,
    IQ3XXS,
}

impl WType {
    pub const ALL: [WType; 4] = [WType::Q8_0, WType::Q4K, WType::Q6K, WType::IQ3XXS];
    /// Weights per block.
    pub const fn block_k(self) -> u32 {
        match self {
            WType::Q8_0 => 32,
            _ => 256,
        }
    }
    /// Bytes per block.
    pub const fn block_bytes(self) -> u32 {
        match self {
            WType::Q8_0 => 34,
            WType::Q4K => 144,
            WType::Q6K => 210,
            WType::IQ3XXS => 98,
        }
    }
    /// ggml's name of the type.
    pub const fn name(self) -> &'static str {
        match self {
            WType::Q8_0 => "q8_0",
            WType::Q4K => "q4_K",
            WType::IQ3XXS => "iq3_xxs",
            WType::Q6K => "q6_K",
        }
    }
    /// ggml type id (`quant::GgmlType as u32`).
    pub const fn ggml_id(self) -> u32 {
        match self {
            WType::Q8_0 => 8,
            WType::Q4K => 12,
            WType::Q6K => 14,
            WType::IQ3XXS => 18,
        }
    }
    pub const fn from_ggml_id(id: u32) -> Option<WType> {
        match id {
            8 => Some(WType::Q8_0),
            12 => Some(WType::Q4K),
            14 => Some(WType::Q6K),
            18 => Some(WType::IQ3XXS),
            _ => None,
        }
    }
    /// Static LDS of the type's MMVQ kernels (lookup tables; IQ3_XXS: 256-entry grid as u32 +
    /// 128 sign masks of 16 bytes). It is in the code object's group segment, not in the
    /// launch's dynamic LDS, but counts against the 64 KiB.
    pub const fn table_lds_bytes(self) -> u32 {
        match self {
            WType::IQ3XXS => IQ3_GRID_LDS_BYTES + IQ3_SIGNS_LDS_BYTES,
            _ => 0,
        }
    }
}

pub const IQ3_GRID_LDS_BYTES: u32 = 256 * 4;
pub const IQ3_SIGNS_LDS_BYTES: u32 = 128 * 16;

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

/// Arguments of `quantize_q8_1` / `quantize_q8_k`: `n` f32 values (a multiple of the block
/// size; several columns back to back) to `n / block` blocks. Q8_1: one work-item per block;
/// Q8_K: one wave per block (`WAVES_PER_WG` blocks per workgroup).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuantizeArgs {
    pub x: u64,
    pub y: u64,
    pub n: u32,
    pub _pad: u32,
}

/// Arguments of every `dequant_*` kernel: `nblocks` consecutive weight blocks to
/// `nblocks * block_k` f32 or f16 values. One work-item per block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DequantArgs {
    pub w: u64,
    pub y: u64,
    pub nblocks: u32,
    pub _pad: u32,
}

/// Little-endian bytes of a `#[repr(C)]` args struct made only of u64/u32 fields.
macro_rules! impl_args_bytes {
    ($($t:ty),*) => {$(
        impl $t {
            pub const SIZE: usize = core::mem::size_of::<$t>();
            /// Kernarg bytes (the layout is `#[repr(C)]`, fields are plain integers).
            pub fn to_bytes(self) -> [u8; core::mem::size_of::<$t>()] {
                // SAFETY: the struct is `#[repr(C)]`, made of u64/u32 fields whose sizes add up
                // to its size (asserted below), so it has no padding and every byte is initialised.
                unsafe { core::mem::transmute_copy(&self) }
            }
        }
    )*};
}
impl_args_bytes!(MmvqArgs, QuantizeArgs, DequantArgs);
const _: () = assert!(core::mem::size_of::<MmvqArgs>() == 48);
const _: () = assert!(core::mem::size_of::<QuantizeArgs>() == 24);
const _: () = assert!(core::mem::size_of::<DequantArgs>() == 24);
const _: () = assert!(cfg!(target_endian = "little"));

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
        if lg > 5 {
            5
        } else {
            lg
        }
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

/// Cross-lane reduction micro-benchmarks (`strata bench kernels`, docs/kernels.md): wave `w`
/// (of `n_waves`, `WAVES_PER_WG` per workgroup) loads `V` values per lane, `x[(w * V + j) * 32 +
/// lane]`, then `reps` times replaces each by its 32-lane sum with cross-lane method `M`
/// (`arch::XL_*`; 0 = no sum, the baseline) times 1/32, and lane 0 stores them to `y[w * V + j]`.
/// Launching with two `reps` values gives the exact marginal cost of one sum. Not used by the
/// engine.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReduceArgs {
    pub x: u64,
    pub y: u64,
    pub n_waves: u32,
    pub reps: u32,
}
impl_args_bytes!(ReduceArgs);
const _: () = assert!(core::mem::size_of::<ReduceArgs>() == 24);

/// Every reduction benchmark: `symbol, method (arch::XL_*), values per lane`.
macro_rules! reduce_kernels {
    ($m:ident) => {
        $m! {
            reduce_none_v1 0 1, reduce_none_v8 0 8,
            reduce_dpp_permlanex16_v1 1 1, reduce_dpp_permlanex16_v8 1 8,
            reduce_dpp_readlane_v1 2 1, reduce_dpp_readlane_v8 2 8,
            reduce_permlane16_v1 3 1, reduce_permlane16_v8 3 8,
            reduce_ds_swizzle_v1 4 1, reduce_ds_swizzle_v8 4 8,
            reduce_ds_bpermute_v1 5 1, reduce_ds_bpermute_v8 5 8,
        }
    };
}
macro_rules! reduce_name_table {
    ($($name:ident $m:literal $v:literal),* $(,)?) => {
        /// `(method, values per lane, symbol)` of every reduction benchmark.
        pub const REDUCE_KERNELS: &[(u32, u32, &str)] = &[$(($m, $v, stringify!($name))),*];
    };
}
reduce_kernels!(reduce_name_table);

/// Dynamic LDS a dequant launch passes: none (IQ3_XXS stages its grid, once per workgroup so
/// the 64 lookups per block do not read global memory, in the static table region).
#[inline(always)]
pub const fn dequant_lds_bytes(_ty: WType) -> u32 {
    0
}

/// Every MMVQ instantiation: `symbol, weight type, columns`. Invokes `$m!` with the list.
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
        }
    };
}

/// Every dequant kernel: `symbol, weight type, output (f32 | f16)`.
macro_rules! dequant_kernels {
    ($m:ident) => {
        $m! {
            dequant_q8_0_f32 Q8_0 f32, dequant_q8_0_f16 Q8_0 f16,
            dequant_q4_k_f32 Q4K f32, dequant_q4_k_f16 Q4K f16,
            dequant_q6_k_f32 Q6K f32, dequant_q6_k_f16 Q6K f16,
            dequant_iq3_xxs_f32 IQ3XXS f32, dequant_iq3_xxs_f16 IQ3XXS f16,
        }
    };
}

macro_rules! mmvq_name_table {
    ($($name:ident $ty:ident $nc:literal),* $(,)?) => {
        /// `(type, columns, symbol)` of every MMVQ kernel.
        pub const MMVQ_KERNELS: &[(WType, u32, &str)] = &[$((WType::$ty, $nc, stringify!($name))),*];
    };
}
mmvq_kernels!(mmvq_name_table);

macro_rules! dequant_name_table {
    ($($name:ident $ty:ident $out:ident),* $(,)?) => {
        /// `(type, output is f16, symbol)` of every dequant kernel.
        pub const DEQUANT_KERNELS: &[(WType, bool, &str)] =
            &[$((WType::$ty, stringify!($out).as_bytes()[1] == b'1', stringify!($name))),*];
    };
}
dequant_kernels!(dequant_name_table);

/// Symbol of the MMVQ kernel for `ty` with `ncols` columns (1..=MAX_COLS).
pub fn mmvq_kernel(ty: WType, ncols: u32) -> Option<&'static str> {
    MMVQ_KERNELS.iter().find(|(t, n, _)| *t == ty && *n == ncols).map(|(_, _, s)| *s)
}
/// Symbol of the dequant kernel for `ty` to f16 (`true`) or f32.
pub fn dequant_kernel(ty: WType, f16: bool) -> Option<&'static str> {
    DEQUANT_KERNELS.iter().find(|(t, h, _)| *t == ty && *h == f16).map(|(_, _, s)| *s)
}
/// Every kernel symbol of the code object.
pub fn all_kernels() -> impl Iterator<Item = &'static str> {
    [QUANTIZE_Q8_1, QUANTIZE_Q8_K]
        .into_iter()
        .chain(MMVQ_KERNELS.iter().map(|e| e.2))
        .chain(DEQUANT_KERNELS.iter().map(|e| e.2))
}
