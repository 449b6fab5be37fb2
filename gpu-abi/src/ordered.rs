//! The ABI of the ordered-numerics kernels (`GpuOptions::ordered`, gpu-kernels
//! ops/ordered.rs): the `quant` crate's scalar code per lane, bit-identical to the CPU
//! backend's ordered path. A part of the ABI, re-exported by the crate root; same rules.

/// `quantize_ref`: `n` f32 (columns back to back, a multiple of the block size) to blocks of
/// the activation type `ty` (ggml id: Q8_0, Q8_1, Q8_K, F16, BF16, F32) with the reference
/// quantizer. One work-item per block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuantizeRefArgs {
    pub x: u64,
    pub y: u64,
    pub n: u32,
    pub ty: u32,
}
/// `mmv_ordered`: `y[c * nrows + r] = quant::vec_dot(ty, k, W[r], a[c])`; one work-item per
/// (row, column), rows fastest.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MmvOrderedArgs {
    pub w: u64,
    pub a: u64,
    pub y: u64,
    pub nrows: u32,
    pub ncols: u32,
    pub k: u32,
    pub ty: u32,
}
/// `geglu_table_f32`: `cpu_kernels::geglu_ggml` with its 65536-entry f32 GELU table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GegluTableArgs {
    pub gate: u64,
    pub up: u64,
    pub out: u64,
    pub table: u64,
    pub n: u32,
    pub _pad: u32,
}
impl_args_bytes!(QuantizeRefArgs, MmvOrderedArgs, GegluTableArgs);
const _: () = assert!(core::mem::size_of::<QuantizeRefArgs>() == 24);
const _: () = assert!(core::mem::size_of::<MmvOrderedArgs>() == 40);
const _: () = assert!(core::mem::size_of::<GegluTableArgs>() == 40);
pub const QUANTIZE_REF: &str = "quantize_ref";
pub const MMV_ORDERED: &str = "mmv_ordered";
pub const GEGLU_TABLE: &str = "geglu_table_f32";
