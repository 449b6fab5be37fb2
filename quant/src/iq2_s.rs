//! IQ2_S: 2.5625 bits per weight. 256 weights per super-block; each 8 magnitudes are one of
//! 1024 points of [`IQ2S_GRID`] (values 8, 25, 43), every weight has its own sign bit, each 16
//! weights a 4-bit scale `s` (multiplier `d * (0.5 + s) * 0.25`). Pairs with Q8_K.
//!
//! Layout (82 bytes): `d: f16`, `qs: [u8; 64]`: `qs[0..32]` the low 8 bits of the grid indices
//! (one per 8 weights), `qs[32..64]` the sign bytes (one per 8 weights); `qh: [u8; 8]` (bits
//! `2i..2i+2` of `qh[k/4]`, i = k%4, are bits 8..10 of index `k`); `scales: [u8; 8]` as IQ2_XS.

use crate::block::impl_block;
use crate::grids::IQ2S_GRID;
use crate::iq2_octets::{self, Iq2Octets};
use crate::q8_k::BlockQ8K;
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ2S {
    /// Super-block scale (f16 bits).
    pub d: u16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}
impl_block!(BlockIQ2S, GgmlType::IQ2S, QK_K);

impl Iq2Octets for BlockIQ2S {
    fn d_bits(&self) -> u16 {
        self.d
    }
    fn scales(&self) -> &[u8; QK_K / 32] {
        &self.scales
    }
    #[inline(always)]
    fn octet(&self, k: usize) -> ([u8; 8], u8) {
        let k = k & 31;
        let idx = self.qs[k] as usize | ((((self.qh[k / 4] >> (2 * (k % 4))) & 3) as usize) << 8);
        (IQ2S_GRID[idx & 1023].to_le_bytes(), self.qs[32 + k])
    }
}

/// `dequantize_row_iq2_s` for one block.
pub fn dequantize_ref(b: &BlockIQ2S, y: &mut [f32; QK_K]) {
    iq2_octets::dequantize_ref(b, y)
}

/// `ggml_vec_dot_iq2_s_q8_K` (generic) for one block pair.
pub fn vec_dot_ref(w: &BlockIQ2S, a: &BlockQ8K) -> f32 {
    iq2_octets::vec_dot_ref(w, a)
}
