//! Activations prepared for the dot kernels: the [`Acts`] struct (filled by `prepare`).
//!
//! f32 activation columns are quantized to the weight type's `vec_dot_type` with `quant`'s
//! reference quantizer (bit-identical to what `quant::vec_dot` expects), then the blocks are
//! split into flat arrays the SIMD kernels read without per-block parsing:
//! `qs` (all int8 quants, column-major by column), `d` (scales as f32), `s` (Q8_0: d·Σq,
//! Q8_1: the stored s; used by the offset/min terms) and `bsums` (Q8_K sums of 16).
//! On AVX-512, `perm` holds Q8_0 quants biased to u8 (x ^ 0x80) for the signed pair kernels,
//! Q8_K super-blocks in Q4_K's sub-block order, or, for IQ3_XXS, biased to u8 and each Q8_K super-block transposed so that
//! byte `j*64 + k` is quant `4k + j` (see `x86::iq3`).

use quant::GgmlType;

pub(crate) struct Acts {
    pub ty: GgmlType,
    pub n: usize,
    /// `quant::quantize_row` bytes, `raw_row` per column (the portable path uses these).
    pub raw: Vec<u8>,
    pub raw_row: usize,
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub bsums: Vec<i16>,
    pub perm: Vec<i8>,
    /// Q4_K on AVX-512: per column, super-block and 32-quant sub-block, d · Σ quants (f32), so
    /// the min term is one FMA per super-block (x86::zmm).
    pub mb: Vec<f32>,
    pub f: Vec<f32>,
    pub h: Vec<u16>,
    /// ggml-order Q8_0/Q5_0 on AVX-512: per block 8 lane corrections (`x86::ggml_q8_512`).
    pub lcorr: Vec<i32>,
    /// Q8_0 on AVX-512 with at least `x86::gemm_q0::MIN_COLS` columns: per column and block,
    /// `-128 · Σ quants`, the start of each block sum of the GEMM tiles (weights biased to u8).
    pub corr: Vec<i32>,
    /// Prepared for the prompt tiles (`Gemm::Tiles` with at least `x86::gemm_q0::MIN_COLS`
    /// columns): the kernels that have tiles run them.
    pub tiles: bool,
}
