//! The kernel ABI, one `no_std` crate without dependencies shared by the device crate
//! (`gpu-kernels`, compiled for `amdgcn-amd-amdhsa`) and the host (`gpu-executor` and its
//! build script), so kernel names, argument layouts, workgroup sizes and LDS layouts exist
//! exactly once. Both re-export it as `abi` (`crate::abi::WG_SIZE`).
//!
//! Rules (see docs/kernels.md):
//! - Kernel arguments are scalars only: 8-byte pointers and 4-byte `u32`s, in the order of the
//!   `#[repr(C)]` `*Args` struct here. A struct passed *by value* to a Rust `gpu-kernel` would
//!   become a pointer (ABI trap), so the device side takes the fields as separate parameters and
//!   the host packs this struct's bytes, checked against the code object's kernarg metadata.
//! - Every symbol name is a `pub const` here or produced by `stringify!` from the single lists
//!   below (`mmvq_kernels!`, `dequant_kernels!`, ...; exported at the crate root): the device
//!   crate defines one kernel per entry, the host builds its name tables from the same lists,
//!   and `registry` (host only) lists every kernel once with how it is launched.
//! - Plain `no_std` Rust without dependencies: the crate compiles for amdgcn and for the host.
//!
//! Parts by kernel family, re-exported here: `qwen4exp` (GDN, GR, PLE, QSA, the shared
//! expert), `mmvq` (decode products), `mmq` (prefill), `ordered` (ordered-numerics mode).
#![no_std]

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
    /// 32 weights a block, a 4-bit index into a fixed 16-level table: what llama.cpp's
    /// quantizer writes for IQ3_XXS tensors whose rows are not whole 256-weight blocks
    /// (Flash-Next's 640-wide down experts).
    IQ4NL,
}

impl WType {
    pub const ALL: [WType; 5] = [WType::Q8_0, WType::Q4K, WType::Q6K, WType::IQ3XXS, WType::IQ4NL];
    /// Weights per block.
    pub const fn block_k(self) -> u32 {
        match self {
            WType::Q8_0 | WType::IQ4NL => 32,
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
            WType::IQ4NL => 18,
        }
    }
    /// ggml's name of the type.
    pub const fn name(self) -> &'static str {
        match self {
            WType::Q8_0 => "q8_0",
            WType::Q4K => "q4_K",
            WType::IQ3XXS => "iq3_xxs",
            WType::Q6K => "q6_K",
            WType::IQ4NL => "iq4_nl",
        }
    }
    /// ggml type id (`quant::GgmlType as u32`).
    pub const fn ggml_id(self) -> u32 {
        match self {
            WType::Q8_0 => 8,
            WType::Q4K => 12,
            WType::Q6K => 14,
            WType::IQ3XXS => 18,
            WType::IQ4NL => 20,
        }
    }
    pub const fn from_ggml_id(id: u32) -> Option<WType> {
        match id {
            8 => Some(WType::Q8_0),
            12 => Some(WType::Q4K),
            14 => Some(WType::Q6K),
            18 => Some(WType::IQ3XXS),
            20 => Some(WType::IQ4NL),
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

// ---------------------------------------------------------------- forward-pass ops
// Every f32 scalar argument travels as its bits in a u32 field (`*_bits`); the device side
// declares it `f32` (same 4-byte by-value kernarg).

/// `rms_norm_f32`: per row `y = x * (1 / sqrt(mean(x^2) + eps)) * w` (cpu_kernels::rms_norm
/// order when `ggml == 0`: 8 f64 partial sums of exact squares; `ggml == 1`: rms_norm_ggml's
/// one chain of f32-rounded squares). One wave per row, `WAVES_PER_WG` rows per workgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmsNormArgs {
    pub x: u64,
    pub w: u64,
    pub y: u64,
    pub n: u32,
    pub n_rows: u32,
    pub eps_bits: u32,
    pub ggml: u32,
}

/// `rope_f32`: in place on `x[n_tokens][n_heads][head_dim]`, angles from `table`
/// (`[pos][rope_dim/2]` (cos, sin) pairs). `neox`/`fma` are 0/1. One work-item per (token,
/// group of `ROPE_HEADS` heads, rotated pair).
pub const ROPE_HEADS: u32 = 8;
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RopeArgs {
    pub x: u64,
    pub pos: u64,
    pub table: u64,
    pub n_tokens: u32,
    pub n_heads: u32,
    pub head_dim: u32,
    pub rope_dim: u32,
    pub neox: u32,
    pub fma: u32,
}

/// `glu_f32`: `out[i] = act(gate[i]) * up[i]`, `act` 0 = SiLU, 1 = GELU (tanh). One work-item
/// per element.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GluArgs {
    pub gate: u64,
    pub up: u64,
    pub out: u64,
    pub n: u32,
    pub act: u32,
}

/// `add_rows_f32`: `x[r*n+i] += b[r*b_stride+i]`. One work-item per element.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddRowsArgs {
    pub x: u64,
    pub b: u64,
    pub n: u32,
    pub n_rows: u32,
    pub b_stride: u32,
    pub _pad: u32,
}

/// `convert_f32_f16` / `convert_f32_bf16`: `y[i] = f16(x[i])` / `bf16(x[i])` (round to nearest
/// even), one work-item per value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConvertArgs {
    pub x: u64,
    pub y: u64,
    pub n: u32,
    pub _pad: u32,
}

/// `scale_f32`: `x[i] *= factor`. `softmax_f32`: per row of `n` (one wave per row).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScaleArgs {
    pub x: u64,
    pub n: u32,
    pub factor_bits: u32,
}
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoftmaxArgs {
    pub x: u64,
    pub n: u32,
    pub n_rows: u32,
}

/// `logits_top_f32`: each row's greedy token (lowest index on ties) and its softmax
/// probability; `out` holds 2 u32 a row (token, p's bits). One wave per row.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogitsTopArgs {
    pub logits: u64,
    pub out: u64,
    pub n_vocab: u32,
    pub n_rows: u32,
}
pub const LOGITS_TOP: &str = "logits_top_f32";

/// `get_rows_*`: `out[i][..k] = dequant(table row ids[i]) * scale` (no multiply when
/// scale == 1.0). Quantized types: one work-item per block; f32/f16: one per element.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GetRowsArgs {
    pub table: u64,
    pub ids: u64,
    pub out: u64,
    pub n_ids: u32,
    pub k: u32,
    pub scale_bits: u32,
    pub _pad: u32,
}

/// `kv_store_f16` / `kv_store_i8`: row `pos[t]` of a K or V cache (cpu-executor/src/kv_cache.rs
/// layout: `[pos][n_head_kv * head_dim]` f16 or i8, int8 scales `[pos][n_head_kv]` f32) from
/// `src[t]`. One wave per (token, kv head); `head_dim` <= 256.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvStoreArgs {
    pub src: u64,
    pub cache: u64,
    pub scale: u64,
    pub pos: u64,
    pub n_tokens: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub _pad: u32,
}

/// `attn_*`: causal attention of `n_tokens` query rows over the cache (see
/// `attend_ordered` in cpu-executor/src/attention.rs for the exact order). One wave (a
/// workgroup of `ATTN_BLOCK`) per (token, head); dynamic LDS `attn_lds_bytes(head_dim, max_kv)`;
/// a window of more than `max_kv` cells traps.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttnArgs {
    pub q: u64,
    pub k: u64,
    pub k_scale: u64,
    pub v: u64,
    pub v_scale: u64,
    pub out: u64,
    pub pos: u64,
    pub n_tokens: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub window: u32,
    pub kq_scale_bits: u32,
    pub max_kv: u32,
}
/// Work-items per attention workgroup (one wave).
pub const ATTN_BLOCK: u32 = 32;
/// Head dims with an attention kernel.
pub const ATTN_HEAD_DIMS: [u32; 5] = [16, 32, 64, 128, 256];
/// Dynamic LDS of an attention launch: the staged query, then one f32 score per cell.
pub const fn attn_lds_bytes(head_dim: u32, max_kv: u32) -> u32 {
    head_dim * 4 + max_kv * 4
}

/// `moe_router`: per token softmax over `n_expert` (<= 512: Flash-Next's 512) logits,
/// top-`k` (<= 16: Flash-Next routes 10; ties to the lower index), optional renormalisation.
/// One wave per token, 16 logits a lane.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoeRouterArgs {
    pub logits: u64,
    pub ids: u64,
    pub w: u64,
    pub n_tokens: u32,
    pub n_expert: u32,
    pub k: u32,
    pub renorm: u32,
}
pub const MOE_MAX_EXPERTS: u32 = 512;
pub const MOE_MAX_K: u32 = 16;

/// `moe_combine`: `out[t][i] = sum_{j<k} w[t*k+j] * y[map[t*k+j]][i]`, added in order j = 0..k
/// from 0.0; with `sh` (not 0), then `+ σ(gate[t]) · sh[t][i]` (Flash-Next's shared expert, the
/// bits of a separate `moe_shared_add_f32`). One work-item per output element,
/// `ceil(d / WG_SIZE)` workgroups per token.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoeCombineArgs {
    pub y: u64,
    pub map: u64,
    pub w: u64,
    pub out: u64,
    pub sh: u64,
    pub gate: u64,
    pub d: u32,
    pub n_tokens: u32,
    pub k: u32,
    pub _pad: u32,
}

/// The id of a slot whose expert has no cache slot (`moe_slot_map`'s output for a miss):
/// `mmvq_moe_*` skip it, leaving its output row to the host's part.
pub const MOE_SLOT_MISS: u32 = u32::MAX;

/// `moe_slot_map`: the expert cache's view of a routing choice. For each of `n_slots` slots,
/// `slots[j] = table[ids[j]]` (the expert's cache slot, or [`MOE_SLOT_MISS`]) and `map[j] = j`
/// for a hit, `miss_base + j` for a miss (the row of the host's output: `moe_combine` then reads
/// hits and misses from one buffer). `table` holds `n_expert` u32 (one layer's row); an id
/// `>= n_expert` traps. One work-item per slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoeSlotMapArgs {
    pub ids: u64,
    pub table: u64,
    pub slots: u64,
    pub map: u64,
    pub n_slots: u32,
    pub n_expert: u32,
    pub miss_base: u32,
    pub _pad: u32,
}
pub const MOE_SLOT_MAP: &str = "moe_slot_map";

/// `moe_sort_slots`: a prompt chunk's slots ordered by expert, so that `mmvq_moe_*` launches
/// over consecutive sorted slots meet each expert's tokens together (one read of its weights
/// per chunk rather than per launch of [`MOE_MAX_SLOTS`]). Slots go in blocks of
/// [`MOE_SORT_BLOCK`]; within block `b`, slot `j` (token `j / k`) lands at
/// `pos = b·MOE_SORT_BLOCK + #{i in the block: (ids[i], i) < (ids[j], j)}` (a stable sort by
/// expert id): `sorted[pos] = ids[j]`, `cols[pos] = j / k`, `map[j] = pos` (the row
/// `moe_combine` reads slot `j` from). Ids are not bounds-checked here (`mmvq_moe_*` traps on
/// a bad one). One work-item per slot, each comparing against its block staged in LDS
/// (`MOE_SORT_BLOCK · 4` bytes of dynamic LDS).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoeSortArgs {
    pub ids: u64,
    pub sorted: u64,
    pub cols: u64,
    pub map: u64,
    pub n_slots: u32,
    pub k: u32,
    pub _pad: [u32; 2],
}
pub const MOE_SORT_SLOTS: &str = "moe_sort_slots";
/// Slots sorted together by `moe_sort_slots` (its work is quadratic in the block).
pub const MOE_SORT_BLOCK: u32 = 1024;

pub const RMS_NORM: &str = "rms_norm_f32";
pub const ROPE: &str = "rope_f32";
pub const GLU: &str = "glu_f32";
pub const ADD_ROWS: &str = "add_rows_f32";
pub const SCALE: &str = "scale_f32";
pub const CONVERT_F32_F16: &str = "convert_f32_f16";
pub const CONVERT_F32_BF16: &str = "convert_f32_bf16";
pub const SOFTMAX: &str = "softmax_f32";
pub const KV_STORE_F16: &str = "kv_store_f16";
pub const KV_STORE_I8: &str = "kv_store_i8";
pub const MOE_ROUTER: &str = "moe_router";
pub const MOE_COMBINE: &str = "moe_combine";
pub const GET_ROWS_F32: &str = "get_rows_f32";
pub const GET_ROWS_F16: &str = "get_rows_f16";

/// Every get_rows kernel for quantized tables: `symbol, weight type`.
#[macro_export]
macro_rules! get_rows_kernels {
    ($m:ident) => {
        $m! { get_rows_q8_0 Q8_0, get_rows_q4_k Q4K, get_rows_q6_k Q6K, get_rows_iq3_xxs IQ3XXS, get_rows_iq4_nl IQ4NL, }
    };
}
/// Every attention kernel: `symbol, int8 cache, head_dim`.
#[macro_export]
macro_rules! attn_kernels {
    ($m:ident) => {
        $m! {
            attn_f16_d16 false 16, attn_f16_d32 false 32, attn_f16_d64 false 64,
            attn_f16_d128 false 128, attn_f16_d256 false 256,
            attn_i8_d16 true 16, attn_i8_d32 true 32, attn_i8_d64 true 64,
            attn_i8_d128 true 128, attn_i8_d256 true 256,
        }
    };
}
/// Every fast (WMMA f16) attention kernel: `symbol, int8 cache, head_dim`.
#[macro_export]
macro_rules! attn_fast_kernels {
    ($m:ident) => {
        $m! {
            attn_fast_f16_d16 false 16, attn_fast_f16_d32 false 32, attn_fast_f16_d64 false 64,
            attn_fast_f16_d128 false 128, attn_fast_f16_d256 false 256,
            attn_fast_i8_d16 true 16, attn_fast_i8_d32 true 32, attn_fast_i8_d64 true 64,
            attn_fast_i8_d128 true 128, attn_fast_i8_d256 true 256,
        }
    };
}
/// Waves (and work-items) of a fast-attention workgroup: the cells are split over the waves
/// in blocks of 16, each wave keeps an online softmax, the workgroup combines them in LDS.
pub const ATTN_FAST_WAVES: u32 = 4;
pub const ATTN_FAST_BLOCK: u32 = ATTN_FAST_WAVES * 32;
/// Dynamic LDS of a fast-attention launch: the query tile (16 rows of f16), per-wave row
/// maxima and sums, the combined output tile (16 rows of f32).
pub const fn attn_fast_lds_bytes(head_dim: u32) -> u32 {
    32 * head_dim + 2 * ATTN_FAST_WAVES * 64 + 64 * head_dim
}
macro_rules! attn_fast_name_table {
    ($($name:ident $i8:literal $hd:literal),* $(,)?) => {
        /// `(int8 cache, head_dim, symbol)` of every fast attention kernel.
        pub const ATTN_FAST_KERNELS: &[(bool, u32, &str)] = &[$(($i8, $hd, stringify!($name))),*];
    };
}
attn_fast_kernels!(attn_fast_name_table);
/// Symbol of the fast attention kernel for a cache format and head dim.
pub fn attn_fast_kernel(int8: bool, head_dim: u32) -> Option<&'static str> {
    ATTN_FAST_KERNELS.iter().find(|(i, h, _)| *i == int8 && *h == head_dim).map(|(_, _, s)| *s)
}
macro_rules! get_rows_name_table {
    ($($name:ident $ty:ident),* $(,)?) => {
        /// `(type, symbol)` of every quantized get_rows kernel.
        pub const GET_ROWS_KERNELS: &[(WType, &str)] = &[$((WType::$ty, stringify!($name))),*];
    };
}
get_rows_kernels!(get_rows_name_table);
macro_rules! attn_name_table {
    ($($name:ident $i8:literal $hd:literal),* $(,)?) => {
        /// `(int8 cache, head_dim, symbol)` of every attention kernel.
        pub const ATTN_KERNELS: &[(bool, u32, &str)] = &[$(($i8, $hd, stringify!($name))),*];
    };
}
attn_kernels!(attn_name_table);
/// Symbol of the quantized get_rows kernel for `ty`.
pub fn get_rows_kernel(ty: WType) -> Option<&'static str> {
    GET_ROWS_KERNELS.iter().find(|(t, _)| *t == ty).map(|(_, s)| *s)
}
/// Symbol of the attention kernel for a cache format and head dim.
pub fn attn_kernel(int8: bool, head_dim: u32) -> Option<&'static str> {
    ATTN_KERNELS.iter().find(|(i, h, _)| *i == int8 && *h == head_dim).map(|(_, _, s)| *s)
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
impl_args_bytes!(
    MmvqArgs,
    QuantizeArgs,
    DequantArgs,
    RmsNormArgs,
    RopeArgs,
    GluArgs,
    AddRowsArgs,
    ScaleArgs,
    ConvertArgs,
    SoftmaxArgs,
    LogitsTopArgs,
    GetRowsArgs,
    KvStoreArgs,
    AttnArgs,
    MoeRouterArgs,
    MoeCombineArgs,
    MoeSlotMapArgs,
    MoeSortArgs,
    MmvqGluArgs,
    MmqArgs
);

// Flash-Next's layer kernels (GDN, GR, the shared expert): their own file, after the macro.
mod qwen4exp;
pub use qwen4exp::*;
const _: () = assert!(core::mem::size_of::<MmqArgs>() == 40);
const _: () = assert!(core::mem::size_of::<MmvqGluArgs>() == 64);
const _: () = assert!(core::mem::size_of::<MmvqArgs>() == 48);
const _: () = assert!(core::mem::size_of::<QuantizeArgs>() == 24);
const _: () = assert!(core::mem::size_of::<DequantArgs>() == 24);
const _: () = assert!(core::mem::size_of::<RmsNormArgs>() == 40);
const _: () = assert!(core::mem::size_of::<RopeArgs>() == 48);
const _: () = assert!(core::mem::size_of::<GluArgs>() == 32);
const _: () = assert!(core::mem::size_of::<AddRowsArgs>() == 32);
const _: () = assert!(core::mem::size_of::<ScaleArgs>() == 16);
const _: () = assert!(core::mem::size_of::<ConvertArgs>() == 24);
const _: () = assert!(core::mem::size_of::<SoftmaxArgs>() == 16);
const _: () = assert!(core::mem::size_of::<GetRowsArgs>() == 40);
const _: () = assert!(core::mem::size_of::<KvStoreArgs>() == 48);
const _: () = assert!(core::mem::size_of::<AttnArgs>() == 80);
const _: () = assert!(core::mem::size_of::<MoeRouterArgs>() == 40);
const _: () = assert!(core::mem::size_of::<MoeCombineArgs>() == 64);
const _: () = assert!(core::mem::size_of::<MoeSlotMapArgs>() == 48);
const _: () = assert!(core::mem::size_of::<MoeSortArgs>() == 48);
const _: () = assert!(cfg!(target_endian = "little"));

// The MMVQ ABI (decode products, fused GLU, expert dispatch): its own file, after the macros
// it uses; its kernel-list macros are used after it (and by the kernels).
#[macro_use]
mod mmvq;
pub use mmvq::*;

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
#[macro_export]
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

/// Every MMQ kernel: `symbol, weight type, dot4 (false = WMMA)`.
#[macro_export]
macro_rules! mmq_kernels {
    ($m:ident) => {
        $m! {
            mmq_q8_0_wmma Q8_0 false, mmq_q8_0_dot4 Q8_0 true,
            mmq_q4_k_wmma Q4K false, mmq_q4_k_dot4 Q4K true,
            mmq_q6_k_wmma Q6K false, mmq_q6_k_dot4 Q6K true,
            mmq_iq3_xxs_wmma IQ3XXS false, mmq_iq3_xxs_dot4 IQ3XXS true,
            mmq_iq4_nl_wmma IQ4NL false, mmq_iq4_nl_dot4 IQ4NL true,
        }
    };
}
macro_rules! mmq_name_table {
    ($($name:ident $ty:ident $dot4:literal),* $(,)?) => {
        /// `(type, dot4, symbol)` of every MMQ kernel.
        pub const MMQ_KERNELS: &[(WType, bool, &str)] = &[$((WType::$ty, $dot4, stringify!($name))),*];
    };
}
mmq_kernels!(mmq_name_table);
/// Symbol of the MMQ kernel for `ty` (`dot4`: the `v_dot4_i32_iu8` variant, else WMMA).
pub fn mmq_kernel(ty: WType, dot4: bool) -> Option<&'static str> {
    MMQ_KERNELS.iter().find(|(t, d, _)| *t == ty && *d == dot4).map(|(_, _, s)| *s)
}

/// Every dequant kernel: `symbol, weight type, output (f32 | f16)`.
#[macro_export]
macro_rules! dequant_kernels {
    ($m:ident) => {
        $m! {
            dequant_q8_0_f32 Q8_0 f32, dequant_q8_0_f16 Q8_0 f16,
            dequant_q4_k_f32 Q4K f32, dequant_q4_k_f16 Q4K f16,
            dequant_q6_k_f32 Q6K f32, dequant_q6_k_f16 Q6K f16,
            dequant_iq3_xxs_f32 IQ3XXS f32, dequant_iq3_xxs_f16 IQ3XXS f16,
            dequant_iq4_nl_f32 IQ4NL f32, dequant_iq4_nl_f16 IQ4NL f16,
        }
    };
}

macro_rules! dequant_name_table {
    ($($name:ident $ty:ident $out:ident),* $(,)?) => {
        /// `(type, output is f16, symbol)` of every dequant kernel.
        pub const DEQUANT_KERNELS: &[(WType, bool, &str)] =
            &[$((WType::$ty, stringify!($out).as_bytes()[1] == b'1', stringify!($name))),*];
    };
}
dequant_kernels!(dequant_name_table);

/// Symbol of the dequant kernel for `ty` to f16 (`true`) or f32.
pub fn dequant_kernel(ty: WType, f16: bool) -> Option<&'static str> {
    DEQUANT_KERNELS.iter().find(|(t, h, _)| *t == ty && *h == f16).map(|(_, _, s)| *s)
}
// The MMQ prefill and ordered-numerics ABIs: their own files, after the macros they use.
mod mmq;
pub use mmq::*;
mod ordered;
pub use ordered::*;

// After every kernel-list macro: the registry expands them all. Host only: no kernel needs
// it, so the device build does not compile launch metadata at all.
#[cfg(not(target_arch = "amdgpu"))]
pub mod registry;
