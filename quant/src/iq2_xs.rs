//! IQ2_XS: 2.3125 bits per weight. 256 weights per super-block; each 8 magnitudes are one of
//! 512 points of [`IQ2XS_GRID`] (values 8, 25, 43) with an even-parity sign pattern
//! ([`ksigns`]); each 16 weights have a 4-bit scale `s` (multiplier `d * (0.5 + s) * 0.25`).
//! Pairs with Q8_K.
//!
//! Layout (74 bytes): `d: f16`, `qs: [u16; 32]` (one per 8 weights: grid index in bits 0..9,
//! 7 sign bits in 9..16), `scales: [u8; 8]` (group of 32 `g`: first 16 weights in the low
//! nibble of `scales[g]`, last 16 in the high one).

use crate::block::impl_block;
use crate::grids::IQ2XS_GRID;
use crate::iq2_octets::{self, Iq2Octets};
use crate::iq3_xxs::ksigns;
use crate::q8_k::BlockQ8K;
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ2XS {
    /// Super-block scale (f16 bits).
    pub d: u16,
    pub qs: [u16; QK_K / 8],
    pub scales: [u8; QK_K / 32],
}
impl_block!(BlockIQ2XS, GgmlType::IQ2XS, QK_K);

impl Iq2Octets for BlockIQ2XS {
    fn d_bits(&self) -> u16 {
        self.d
    }
    fn scales(&self) -> &[u8; QK_K / 32] {
        &self.scales
    }
    #[inline(always)]
    fn octet(&self, k: usize) -> ([u8; 8], u8) {
        let q = self.qs[k & 31];
        (IQ2XS_GRID[(q & 511) as usize].to_le_bytes(), ksigns((q >> 9) as u32))
    }
}

/// `dequantize_row_iq2_xs` for one block.
pub fn dequantize_ref(b: &BlockIQ2XS, y: &mut [f32; QK_K]) {
    iq2_octets::dequantize_ref(b, y)
}

/// `ggml_vec_dot_iq2_xs_q8_K` (generic) for one block pair.
pub fn vec_dot_ref(w: &BlockIQ2XS, a: &BlockQ8K) -> f32 {
    iq2_octets::vec_dot_ref(w, a)
}
