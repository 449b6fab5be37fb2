//! The ABI of Flash-Next's layer kernels (gpu-kernels ops/gdn.rs, ops/gr.rs, the shared-expert
//! add in ops/fwd.rs): argument structs, names, launch constants. A part of the ABI,
//! re-exported by the crate root; same rules.

/// Gated DeltaNet kernels (ops/gdn.rs). `gdn_conv_silu_f32`: one work-item per conv channel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdnConvArgs {
    pub m: u64,
    pub state: u64,
    pub taps: u64,
    pub u: u64,
    pub n_tokens: u32,
    pub channels: u32,
    pub conv_k: u32,
    pub _pad: u32,
}
/// `gdn_l2_norm_f32`: one wave per (token, head) row.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdnL2NormArgs {
    pub x: u64,
    pub n_tokens: u32,
    pub n_heads: u32,
    pub head_dim: u32,
    pub token_stride: u32,
    pub eps_bits: u32,
    pub _pad: u32,
}
/// `gdn_delta_rule_f32`: one workgroup of [`GDN_DELTA_BLOCK`] per value head.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdnDeltaArgs {
    pub u: u64,
    pub beta: u64,
    pub alpha: u64,
    pub dt_bias: u64,
    pub ssm_a: u64,
    pub state: u64,
    pub o: u64,
    pub n_tokens: u32,
    pub hk: u32,
    pub hv: u32,
    pub s: u32,
    pub channels: u32,
    pub _pad: u32,
}
/// Most tokens of one GDN launch (a decode window; longer prompts go in windows of this).
pub const GDN_MAX_TOKENS: u32 = 8;
/// Work-items of a delta-rule workgroup (each owns state columns j, j + 128, ..).
pub const GDN_DELTA_BLOCK: u32 = 128;
/// `gdn_gated_norm_f32`: one wave per row.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdnGatedNormArgs {
    pub o: u64,
    pub z: u64,
    pub w: u64,
    /// Also `o`'s Q8_1 rows here (the bytes `quantize_q8_1` would write; 0: none).
    pub q: u64,
    pub n_rows: u32,
    pub n: u32,
    pub eps_bits: u32,
    pub _pad: u32,
}
pub const GDN_CONV_SILU: &str = "gdn_conv_silu_f32";
pub const GDN_L2_NORM: &str = "gdn_l2_norm_f32";
pub const GDN_DELTA_RULE: &str = "gdn_delta_rule_f32";
/// The delta rule for head dim 128 with the state in registers (same ABI).
pub const GDN_DELTA_RULE_S128: &str = "gdn_delta_rule_s128_f32";
/// Work-items of its workgroup (two per state column) and its LDS (two partial sums a column,
/// then the token's k and q).
pub const GDN_S128_BLOCK: u32 = 256;
pub const GDN_S128_LDS_BYTES: u32 = 4 * 128 * 4;
/// `gdn_delta_chunked_f32`: the chunked (prefill) delta rule, one workgroup of
/// [`GDN_CHUNK_BLOCK`] per value head, with a scratch of `[Hv][2·chunk][S]` f32 (`M₀ᵀk_t`, then
/// `δ_t`; `M₀ᵀq_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdnChunkArgs {
    pub u: u64,
    pub beta: u64,
    pub alpha: u64,
    pub dt_bias: u64,
    pub ssm_a: u64,
    pub state: u64,
    pub o: u64,
    pub delta: u64,
    pub n_tokens: u32,
    pub hk: u32,
    pub hv: u32,
    pub s: u32,
    pub channels: u32,
    pub chunk: u32,
}
pub const GDN_DELTA_CHUNKED: &str = "gdn_delta_chunked_f32";
/// Tokens of a chunk per read of a state column in `gdn_delta_chunked_f32` (and `δ`s per
/// rewrite of it): its register accumulators.
pub const GDN_CHUNK_PASS: u32 = 8;
/// Work-items of its workgroup (each owns state columns j, j + 128, ..), the largest chunk, and
/// its LDS: the chunk's cumulative log-decay and β, then the k·k and q·k triangles.
pub const GDN_CHUNK_BLOCK: u32 = 128;
pub const GDN_CHUNK_MAX: u32 = 64;
/// Largest head dim of the chunked kernel (its LDS stages `GDN_CHUNK_PASS` rows of k and of q).
pub const GDN_CHUNK_MAX_HEAD_DIM: u32 = 256;
pub const GDN_CHUNK_LDS_BYTES: u32 =
    8 * GDN_CHUNK_MAX + 8 * GDN_CHUNK_MAX * GDN_CHUNK_MAX + 8 * GDN_CHUNK_PASS * GDN_CHUNK_MAX_HEAD_DIM;
const _: () = assert!(GDN_CHUNK_LDS_BYTES <= 65536);
/// Most tokens of one chunked (prefill) GDN launch.
pub const GDN_MAX_PREFILL_TOKENS: u32 = 8192;
pub const GDN_GATED_NORM: &str = "gdn_gated_norm_f32";

/// Hyper-connection kernels (ops/gr.rs), one struct for the four: three buffers, a Q8_1
/// output, then the rows or tokens, the embedding width, the stream count and (norm only) eps.
/// `gr_stream_norm_f32` (r, gamma, flat; n_rows = tokens x hc): one wave per row;
/// `gr_lowrank_act_f32` (lo; n values): `gr_gate_mix_f32` (flat, gate, x) and `gr_combine_f32`
/// (r, y, inj): one work-item per value. `q` (norm and low-rank act; 0 = none) receives the
/// output's Q8_1 quantization as well, the bytes `quantize_q8_1` would write for it (so the
/// next product need not launch it): the rows' width must be a multiple of 32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrArgs {
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub q: u64,
    pub n: u32,
    pub e: u32,
    pub hc: u32,
    pub eps_bits: u32,
}
pub const GR_STREAM_NORM: &str = "gr_stream_norm_f32";
pub const GR_LOWRANK_ACT: &str = "gr_lowrank_act_f32";
pub const GR_GATE_MIX: &str = "gr_gate_mix_f32";
pub const GR_COMBINE: &str = "gr_combine_f32";

/// `moe_shared_add_f32`: `out[t][i] += sigmoid(gate[t]) * sh[t][i]` (Flash-Next's shared
/// expert). One work-item per value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoeSharedArgs {
    pub out: u64,
    pub sh: u64,
    pub gate: u64,
    pub d: u32,
    pub n_tokens: u32,
}
pub const MOE_SHARED_ADD: &str = "moe_shared_add_f32";

/// QSA kernels (ops/qsa.rs). `qsa_norm_rope_f32`: one wave per (token, head) row.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QsaNormRopeArgs {
    pub src: u64,
    pub w: u64,
    pub dst: u64,
    pub pos: u64,
    pub table: u64,
    pub n_tokens: u32,
    pub n_heads: u32,
    pub head_dim: u32,
    pub n_rot: u32,
    pub src_head_stride: u32,
    pub src_tok_stride: u32,
    pub eps_bits: u32,
    pub _pad: u32,
}
/// `qsa_block_keys_f16`: one wave per block the window completes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QsaBlockKeysArgs {
    pub kappa: u64,
    pub kappa_scale: u64,
    pub w: u64,
    pub blocks: u64,
    pub pos: u64,
    pub table: u64,
    pub n_tokens: u32,
    pub dim: u32,
    pub ratio: u32,
    pub n_rot: u32,
    pub eps_bits: u32,
    pub _pad: u32,
}
/// `qsa_index_scores_f32`: one work-item per (token, block).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QsaIndexScoresArgs {
    pub iq: u64,
    pub blocks: u64,
    pub score: u64,
    pub pos: u64,
    pub n_tokens: u32,
    pub heads: u32,
    pub dim: u32,
    pub ratio: u32,
    pub max_blocks: u32,
    pub _pad: u32,
}
/// `qsa_select_topk`: one wave per token (its lane 0 selects).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QsaSelectArgs {
    pub score: u64,
    pub sel: u64,
    pub sel_n: u64,
    pub pos: u64,
    pub n_tokens: u32,
    pub max_blocks: u32,
    pub ratio: u32,
    pub k: u32,
    pub tail_bias_bits: u32,
    pub _pad: u32,
}
/// `qsa_attend_f16`: one wave (workgroup of [`QSA_ATTEND_BLOCK`]) per (token, head), with
/// [`qsa_attend_lds_bytes`] of dynamic LDS.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QsaAttendArgs {
    pub q: u64,
    pub qf: u64,
    pub k_cache: u64,
    pub k_scale: u64,
    pub v_cache: u64,
    pub v_scale: u64,
    pub sel: u64,
    pub sel_n: u64,
    pub out: u64,
    pub pos: u64,
    pub n_tokens: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub sel_stride: u32,
    pub use_sel: u32,
    pub scale_bits: u32,
    pub _pad: u32,
}
/// PLE block kernels (ops/ple.rs). `ple_gate_f32`: one wave per (token, stream).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PleGateArgs {
    pub key: u64,
    pub r: u64,
    pub val: u64,
    pub norms: u64,
    pub gv: u64,
    pub nn: u64,
    pub n_tokens: u32,
    pub hc: u32,
    pub e: u32,
    pub eps_bits: u32,
}
/// `ple_conv_f32`: one work-item per channel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PleConvArgs {
    pub nn: u64,
    pub gv: u64,
    pub taps: u64,
    pub hist: u64,
    pub r: u64,
    pub n_tokens: u32,
    pub channels: u32,
    pub kp: u32,
    pub dil: u32,
}
pub const PLE_GATE: &str = "ple_gate_f32";
pub const PLE_CONV: &str = "ple_conv_f32";
pub const QSA_NORM_ROPE: &str = "qsa_norm_rope_f32";
pub const QSA_BLOCK_KEYS: &str = "qsa_block_keys_f16";
pub const QSA_BLOCK_KEYS_I8: &str = "qsa_block_keys_i8";
pub const QSA_INDEX_SCORES: &str = "qsa_index_scores_f32";
pub const QSA_SELECT_TOPK: &str = "qsa_select_topk";
pub const QSA_ATTEND: &str = "qsa_attend_f16";
pub const QSA_ATTEND_I8: &str = "qsa_attend_i8";
pub const QSA_ATTEND_BLOCK: u32 = 32;
/// LDS of one `qsa_attend_f16` launch: the query and one score per cell.
pub const fn qsa_attend_lds_bytes(head_dim: u32, cells: u32) -> u32 {
    4 * (head_dim + cells)
}
/// Most cells one `qsa_attend_f16` launch attends at head dim 256 (64 KiB of LDS).
pub const QSA_MAX_CELLS: u32 = super::MAX_LDS_BYTES / 4 - 256;

impl_args_bytes!(GdnConvArgs, GdnL2NormArgs, GdnDeltaArgs, GdnGatedNormArgs, GrArgs, MoeSharedArgs);
impl_args_bytes!(PleGateArgs, PleConvArgs, GdnChunkArgs);
const _: () = assert!(core::mem::size_of::<GdnChunkArgs>() == 88);
const _: () = assert!(core::mem::size_of::<PleGateArgs>() == 64);
const _: () = assert!(core::mem::size_of::<PleConvArgs>() == 56);
impl_args_bytes!(QsaNormRopeArgs, QsaBlockKeysArgs, QsaIndexScoresArgs, QsaSelectArgs, QsaAttendArgs);
const _: () = assert!(core::mem::size_of::<QsaNormRopeArgs>() == 72);
const _: () = assert!(core::mem::size_of::<QsaBlockKeysArgs>() == 72);
const _: () = assert!(core::mem::size_of::<QsaIndexScoresArgs>() == 56);
const _: () = assert!(core::mem::size_of::<QsaSelectArgs>() == 56);
const _: () = assert!(core::mem::size_of::<QsaAttendArgs>() == 112);
const _: () = assert!(core::mem::size_of::<MoeSharedArgs>() == 32);
const _: () = assert!(core::mem::size_of::<GrArgs>() == 48);
const _: () = assert!(core::mem::size_of::<GdnConvArgs>() == 48);
const _: () = assert!(core::mem::size_of::<GdnL2NormArgs>() == 32);
const _: () = assert!(core::mem::size_of::<GdnDeltaArgs>() == 80);
const _: () = assert!(core::mem::size_of::<GdnGatedNormArgs>() == 48);
