//! Q8_K: the activation format of all K-quants and IQ formats. 256 values per block,
//! `x = d * q` with an **f32** scale, plus `bsums[k] = sum(q[16k..16k+16])` so that formats
//! with mins (Q4_K, Q5_K) can compute the min term from 16 sums instead of 256 products.
//!
//! Layout (292 bytes, align 4): `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]`.

use crate::block::impl_block;
use crate::util::{fabsf, nearest_int};
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8K {
    /// Scale (f32 bits; kept as u32 so the struct is `Eq` and any bytes are valid).
    pub d: u32,
    pub qs: [i8; QK_K],
    /// Sums of each 16 consecutive quants.
    pub bsums: [i16; QK_K / 16],
}
impl_block!(BlockQ8K, GgmlType::Q8K, QK_K);

impl BlockQ8K {
    /// The scale as f32.
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f32::from_bits(self.d)
    }
}

/// `dequantize_row_q8_K` for one block: `y = d * q`.
pub fn dequantize_ref(b: &BlockQ8K, y: &mut [f32; QK_K]) {
    let d = b.d();
    for (o, &q) in y.iter_mut().zip(b.qs.iter()) {
        *o = d * q as f32;
    }
}

/// `quantize_row_q8_K_ref` for one block, byte-exact: `iscale = -127/max` (max = the value of
/// largest magnitude, sign kept), `q = min(127, nearest_int(iscale*x))` with the product
/// rounded to f32 before the rounding trick, `d = 1/iscale`. An all-zero block gets `d = 0`,
/// zero quants and zero bsums.
pub fn quantize_ref(x: &[f32; QK_K]) -> BlockQ8K {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = fabsf(v);
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    let mut b = BlockQ8K { d: 0, qs: [0; QK_K], bsums: [0; QK_K / 16] };
    if amax == 0.0 {
        return b;
    }
    let iscale = -127.0 / max;
    for (q, &v) in b.qs.iter_mut().zip(x.iter()) {
        *q = nearest_int(iscale * v).min(127) as i8;
    }
    compute_bsums(&mut b);
    b.d = (1.0 / iscale).to_bits();
    b
}

/// Fill `bsums` from `qs`.
pub fn compute_bsums(b: &mut BlockQ8K) {
    for (k, s) in b.bsums.iter_mut().enumerate() {
        let mut sum = 0i32;
        for &q in &b.qs[16 * k..16 * k + 16] {
            sum += q as i32;
        }
        *s = sum as i16;
    }
}

/// Q8_K · Q8_K (not a ggml kernel; provided so every type has a `vec_dot`).
pub fn vec_dot_ref(w: &BlockQ8K, a: &BlockQ8K) -> f32 {
    let mut s = 0i32;
    for j in 0..QK_K {
        s += w.qs[j] as i32 * a.qs[j] as i32;
    }
    (w.d() * a.d()) * s as f32
}
