//! The kernel registry: one entry per kernel of the code objects, saying how the host launches
//! it (argument struct, workgroup size, dynamic LDS, scratch, archs). It is plain `no_std` data
//! over the ABI (names from its lists, struct sizes, LDS functions), read by:
//! - `gpu-executor/build.rs`: the per-kernel attribute file of the nested build and the default
//!   archs;
//! - the host (`gpu-executor/src/`, as `gpu_executor::registry`): `GpuOps::new` looks up and
//!   checks every entry of the device's arch, the selftest and the benchmarks iterate it, the
//!   tests compare it with the objects.
//!
//! It needs nothing of std, so it lives in this crate next to the ABI it expands; it is left
//! out of the amdgcn build (`cfg(not(target_arch = "amdgpu"))`): no kernel needs it.
//! `tests/gpu/gpu_kernels.rs` asserts that, for every embedded code object, the entries of its arch
//! are exactly its kernel symbols, and that each entry matches the object's metadata
//! (docs/kernels.md, "Adding a kernel").
use crate::{self as abi, WType};

/// Every arch the kernels are built for (the default of `KERNEL_GFX`).
pub const GFX11_ARCHS: &[&str] = &["gfx1100", "gfx1101", "gfx1102"];

/// Largest ordered-attention window (cells) a launch can support: its scores live in LDS, and
/// `attn_lds_bytes(256, n)` must fit 64 KiB.
pub const ATTN_MAX_KV_LIMIT: u32 = (abi::MAX_LDS_BYTES - 256 * 4) / 4;

/// What a kernel is for (benchmarks and tests select kernels by family).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// f32 -> Q8_1 / Q8_K activations.
    Quantize,
    Mmvq,
    /// Fused gate/up MMVQ + GLU.
    MmvqGlu,
    /// Expert-dispatch MMVQ (ids read on the device).
    MmvqMoe,
    /// Prefill matmul (WMMA / dot4).
    Mmq,
    Dequant,
    /// Embedding rows (quantized, f32, f16).
    GetRows,
    /// Norm, rope, activations, adds, scale, conversions, softmax.
    Elementwise,
    KvStore,
    /// Ordered attention (one wave per (token, head)).
    Attention,
    /// WMMA attention.
    AttentionFast,
    /// Router and combine.
    Moe,
    /// Gated DeltaNet: conv, q/k norms, delta rule, gated norm (Flash-Next).
    Gdn,
    /// Hyper-connection streams: read (norm, low-rank act, gate mix) and write (Flash-Next).
    Gr,
    /// The PLE n-gram block after the row gather: gate, norm, dilated conv (Flash-Next).
    Ple,
    /// QSA sparse attention: q/k norm + partial rope, block indexer, top-k, gated attention
    /// (Flash-Next).
    Qsa,
    /// Ordered-numerics mode (the `quant` crate's scalar code per work-item).
    Ordered,
    /// Cross-lane reduction micro-benchmarks (not used by the engine).
    Reduce,
}

/// Whether a kernel may use scratch (a private segment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scratch {
    /// Hot kernels: a private segment is refused at load time (spilled registers).
    Forbidden,
    /// Not hot, or scalar reference code that holds a block per work-item.
    Allowed,
}

/// The `#[repr(C)]` argument struct a kernel takes: its name in the ABI, its size, and how many
/// of its leading fields are 8 bytes (every struct is u64 fields, then u32 fields), which
/// gives the explicit kernel arguments the code object must declare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgStruct {
    pub name: &'static str,
    pub bytes: u32,
    pub wide_fields: u32,
}

impl ArgStruct {
    /// `(offset, size)` of every field, in order.
    pub fn fields(&self) -> impl Iterator<Item = (u32, u32)> {
        let wide = self.wide_fields;
        let narrow = (self.bytes - 8 * wide) / 4;
        (0..wide).map(|i| (8 * i, 8)).chain((0..narrow).map(move |i| (8 * wide + 4 * i, 4)))
    }
}

macro_rules! arg_struct {
    ($t:ident, $wide:literal) => {{
        const _: () = assert!($wide * 8 <= abi::$t::SIZE && (abi::$t::SIZE - $wide * 8) % 4 == 0);
        ArgStruct { name: stringify!($t), bytes: abi::$t::SIZE as u32, wide_fields: $wide }
    }};
}

/// One kernel and how every launch of it looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelEntry {
    pub name: &'static str,
    pub family: Family,
    pub args: ArgStruct,
    /// Work-items per workgroup of every launch (x; y = z = 1).
    pub block: u32,
    /// The most dynamic LDS a launch passes (bytes; static LDS is in the code object).
    pub max_dynamic_lds: u32,
    pub scratch: Scratch,
    /// Archs whose code object has the kernel.
    pub archs: &'static [&'static str],
}

/// An entry with the usual launch: `WG_SIZE` work-items, no dynamic LDS, no scratch, every arch.
const fn entry(name: &'static str, family: Family, args: ArgStruct) -> KernelEntry {
    KernelEntry {
        name,
        family,
        args,
        block: abi::WG_SIZE,
        max_dynamic_lds: 0,
        scratch: Scratch::Forbidden,
        archs: GFX11_ARCHS,
    }
}
impl KernelEntry {
    const fn block(self, block: u32) -> Self {
        KernelEntry { block, ..self }
    }
    const fn lds(self, max_dynamic_lds: u32) -> Self {
        KernelEntry { max_dynamic_lds, ..self }
    }
    const fn scratch_allowed(self) -> Self {
        KernelEntry { scratch: Scratch::Allowed, ..self }
    }
}

const QUANTIZE_ARGS: ArgStruct = arg_struct!(QuantizeArgs, 2);
const MMVQ_ARGS: ArgStruct = arg_struct!(MmvqArgs, 4);
const ATTN_ARGS: ArgStruct = arg_struct!(AttnArgs, 7);
const GET_ROWS_ARGS: ArgStruct = arg_struct!(GetRowsArgs, 3);
const CONVERT_ARGS: ArgStruct = arg_struct!(ConvertArgs, 2);
const KV_STORE_ARGS: ArgStruct = arg_struct!(KvStoreArgs, 4);
const GR_ARGS: ArgStruct = arg_struct!(GrArgs, 4);

/// The LDS an MMVQ-style launch may stage (64 KiB minus the type's static tables).
const fn mmvq_lds(ty: WType) -> u32 {
    abi::MAX_LDS_BYTES - ty.table_lds_bytes()
}

/// The kernels launched one by one (no list in the ABI).
const SINGLES: &[KernelEntry] = &[
    entry(abi::QUANTIZE_Q8_1, Family::Quantize, QUANTIZE_ARGS),
    entry(abi::QUANTIZE_Q8_K, Family::Quantize, QUANTIZE_ARGS),
    entry(abi::RMS_NORM, Family::Elementwise, arg_struct!(RmsNormArgs, 3)),
    entry(abi::ROPE, Family::Elementwise, arg_struct!(RopeArgs, 3)),
    entry(abi::GLU, Family::Elementwise, arg_struct!(GluArgs, 3)),
    entry(abi::ADD_ROWS, Family::Elementwise, arg_struct!(AddRowsArgs, 2)),
    entry(abi::SCALE, Family::Elementwise, arg_struct!(ScaleArgs, 1)),
    entry(abi::CONVERT_F32_F16, Family::Elementwise, CONVERT_ARGS),
    entry(abi::CONVERT_F32_BF16, Family::Elementwise, CONVERT_ARGS),
    entry(abi::SOFTMAX, Family::Elementwise, arg_struct!(SoftmaxArgs, 1)),
    entry(abi::LOGITS_TOP, Family::Elementwise, arg_struct!(LogitsTopArgs, 2)),
    entry(abi::KV_STORE_F16, Family::KvStore, KV_STORE_ARGS),
    entry(abi::KV_STORE_I8, Family::KvStore, KV_STORE_ARGS),
    entry(abi::MOE_ROUTER, Family::Moe, arg_struct!(MoeRouterArgs, 3)),
    entry(abi::MOE_COMBINE, Family::Moe, arg_struct!(MoeCombineArgs, 6)),
    entry(abi::MOE_SLOT_MAP, Family::Moe, arg_struct!(MoeSlotMapArgs, 4)),
    entry(abi::MOE_SORT_SLOTS, Family::Moe, arg_struct!(MoeSortArgs, 4)).lds(abi::MOE_SORT_BLOCK * 4),
    entry(abi::MOE_SHARED_ADD, Family::Moe, arg_struct!(MoeSharedArgs, 3)),
    entry(abi::GET_ROWS_F32, Family::GetRows, GET_ROWS_ARGS),
    entry(abi::GET_ROWS_F16, Family::GetRows, GET_ROWS_ARGS),
    entry(abi::GDN_CONV_SILU, Family::Gdn, arg_struct!(GdnConvArgs, 4)),
    entry(abi::GDN_L2_NORM, Family::Gdn, arg_struct!(GdnL2NormArgs, 1)),
    entry(abi::GDN_DELTA_RULE, Family::Gdn, arg_struct!(GdnDeltaArgs, 7)).block(abi::GDN_DELTA_BLOCK),
    entry(abi::GDN_DELTA_RULE_S128, Family::Gdn, arg_struct!(GdnDeltaArgs, 7))
        .block(abi::GDN_S128_BLOCK)
        .lds(abi::GDN_S128_LDS_BYTES),
    entry(abi::GDN_DELTA_CHUNKED, Family::Gdn, arg_struct!(GdnChunkArgs, 8))
        .block(abi::GDN_CHUNK_BLOCK)
        .lds(abi::GDN_CHUNK_LDS_BYTES),
    entry(abi::GDN_GATED_NORM, Family::Gdn, arg_struct!(GdnGatedNormArgs, 4)),
    entry(abi::GR_STREAM_NORM, Family::Gr, GR_ARGS),
    entry(abi::GR_LOWRANK_ACT, Family::Gr, GR_ARGS),
    entry(abi::GR_GATE_MIX, Family::Gr, GR_ARGS),
    entry(abi::GR_COMBINE, Family::Gr, GR_ARGS),
    entry(abi::PLE_GATE, Family::Ple, arg_struct!(PleGateArgs, 6)),
    entry(abi::PLE_CONV, Family::Ple, arg_struct!(PleConvArgs, 5)),
    entry(abi::QSA_NORM_ROPE, Family::Qsa, arg_struct!(QsaNormRopeArgs, 5)),
    entry(abi::QSA_BLOCK_KEYS, Family::Qsa, arg_struct!(QsaBlockKeysArgs, 6)),
    entry(abi::QSA_BLOCK_KEYS_I8, Family::Qsa, arg_struct!(QsaBlockKeysArgs, 6)),
    entry(abi::QSA_INDEX_SCORES, Family::Qsa, arg_struct!(QsaIndexScoresArgs, 4)),
    entry(abi::QSA_SELECT_TOPK, Family::Qsa, arg_struct!(QsaSelectArgs, 4)),
    entry(abi::QSA_ATTEND, Family::Qsa, arg_struct!(QsaAttendArgs, 10))
        .block(abi::QSA_ATTEND_BLOCK)
        .lds(abi::qsa_attend_lds_bytes(256, abi::QSA_MAX_CELLS)),
    entry(abi::QSA_ATTEND_I8, Family::Qsa, arg_struct!(QsaAttendArgs, 10))
        .block(abi::QSA_ATTEND_BLOCK)
        .lds(abi::qsa_attend_lds_bytes(256, abi::QSA_MAX_CELLS)),
    // Ordered-numerics mode: the quant crate's scalar code per lane (Q4_K's dot unpacks 256
    // quants, Q8_K's quantizer holds its block: scratch allowed).
    entry(abi::QUANTIZE_REF, Family::Ordered, arg_struct!(QuantizeRefArgs, 2)).scratch_allowed(),
    entry(abi::MMV_ORDERED, Family::Ordered, arg_struct!(MmvOrderedArgs, 3)).scratch_allowed(),
    entry(abi::GEGLU_TABLE, Family::Ordered, arg_struct!(GegluTableArgs, 4)),
];

macro_rules! mmvq_entries {
    ($($name:ident $ty:ident $nc:literal),* $(,)?) => {
        &[$(entry(stringify!($name), Family::Mmvq, MMVQ_ARGS).lds(mmvq_lds(WType::$ty))),*]
    };
}
macro_rules! mmvq_glu_entries {
    ($($name:ident $ty:ident $nc:literal),* $(,)?) => {
        &[$(entry(stringify!($name), Family::MmvqGlu, arg_struct!(MmvqGluArgs, 5)).lds(mmvq_lds(WType::$ty))),*]
    };
}
macro_rules! mmvq_moe_entries {
    ($($name:ident $ty:ident $g:literal $glu:literal),* $(,)?) => {
        &[$(entry(stringify!($name), Family::MmvqMoe, arg_struct!(MmvqMoeArgs, 7)).lds(mmvq_lds(WType::$ty))),*]
    };
}
macro_rules! mmq_entries {
    ($($name:ident $ty:ident $dot4:literal),* $(,)?) => {
        &[$(entry(stringify!($name), Family::Mmq, arg_struct!(MmqArgs, 3)).lds(abi::mmq_lds_bytes(WType::$ty))),*]
    };
}
// Dequantizers are not hot: they may spill (none does today; tests/gpu/gpu_kernels.rs checks).
macro_rules! dequant_entries {
    ($($name:ident $ty:ident $out:ident),* $(,)?) => {
        &[$(entry(stringify!($name), Family::Dequant, arg_struct!(DequantArgs, 2)).lds(abi::dequant_lds_bytes(WType::$ty)).scratch_allowed()),*]
    };
}
macro_rules! get_rows_entries {
    ($($name:ident $ty:ident),* $(,)?) => {
        &[$(entry(stringify!($name), Family::GetRows, GET_ROWS_ARGS)),*]
    };
}
// Ordered attention: one wave per (token, head); the LDS holds the query and one score per
// cell of the largest window `GpuOps::set_attn_max_kv` allows.
macro_rules! attn_entries {
    ($($name:ident $i8:literal $hd:literal),* $(,)?) => {
        &[$(entry(stringify!($name), Family::Attention, ATTN_ARGS).block(abi::ATTN_BLOCK).lds(abi::attn_lds_bytes($hd, ATTN_MAX_KV_LIMIT))),*]
    };
}
macro_rules! attn_fast_entries {
    ($($name:ident $i8:literal $hd:literal),* $(,)?) => {
        &[$(entry(stringify!($name), Family::AttentionFast, ATTN_ARGS).block(abi::ATTN_FAST_BLOCK).lds(abi::attn_fast_lds_bytes($hd))),*]
    };
}
// The reduction benchmarks' `V` values per lane may spill; they are never launched by the engine.
macro_rules! reduce_entries {
    ($($name:ident $m:literal $v:literal),* $(,)?) => {
        &[$(entry(stringify!($name), Family::Reduce, arg_struct!(ReduceArgs, 2)).scratch_allowed()),*]
    };
}

/// Every kernel, in groups (the singles, then one group per list of the ABI).
pub const KERNELS: &[&[KernelEntry]] = &[
    SINGLES,
    mmvq_kernels!(mmvq_entries),
    mmvq_glu_kernels!(mmvq_glu_entries),
    mmvq_moe_kernels!(mmvq_moe_entries),
    mmq_kernels!(mmq_entries),
    dequant_kernels!(dequant_entries),
    get_rows_kernels!(get_rows_entries),
    attn_kernels!(attn_entries),
    attn_fast_kernels!(attn_fast_entries),
    reduce_kernels!(reduce_entries),
];

/// Every kernel of the registry.
pub fn all() -> impl Iterator<Item = &'static KernelEntry> {
    KERNELS.iter().flat_map(|g| g.iter())
}

/// The kernels of one arch's code object (`gfx1100`, features such as `:xnack-` ignored).
pub fn for_arch(arch: &str) -> impl Iterator<Item = &'static KernelEntry> + '_ {
    let base = arch.split(':').next().unwrap_or(arch).trim();
    all().filter(move |k| k.archs.contains(&base))
}

/// The entry of kernel `name`.
pub fn find(name: &str) -> Option<&'static KernelEntry> {
    all().find(|k| k.name == name)
}

/// The kernels of one family.
pub fn family(f: Family) -> impl Iterator<Item = &'static KernelEntry> {
    all().filter(move |k| k.family == f)
}
