//! Block validation at load: every block's float scales must be finite numbers.
//!
//! Like ggml, the dequantizers and dots take a NaN or infinite f16 scale as it is, so one bad
//! block in a file would silently turn a whole output row into NaN. [`check_blocks`] reads only
//! the scale fields (a strided pass, two bytes per block for most types) so it can run over
//! every weight byte when a model loads.
//!
//! Grid indices need no check: every IQ index field is exactly as wide as its grid (8 bits
//! for the 256 points of IQ2_XXS and IQ3_XXS, 9 for the 512 of IQ2_XS and IQ3_S, 10 for the
//! 1024 of IQ2_S, 11 for the 2048 of IQ1_S/IQ1_M, 4 for the 16 levels of IQ4_NL/IQ4_XS), so no
//! bit pattern indexes outside its table. The sub-block scales of the K-quants are small
//! integers and always finite.

use core::fmt;

use crate::{GgmlType, QuantError, iq1_m};

/// What is wrong with a block's scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadScale {
    NaN,
    Inf,
}

/// The first bad block of a buffer: its index (counted from the buffer's start), the scale
/// field by its ggml name (`d`, `dmin`, `m`, `s`) and what is wrong with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadBlock {
    pub block: usize,
    pub field: &'static str,
    pub why: BadScale,
}

impl fmt::Display for BadBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.why {
            BadScale::NaN => "a NaN",
            BadScale::Inf => "an infinite",
        };
        write!(f, "block {} has {what} scale ({})", self.block, self.field)
    }
}

/// An f16 with an all-ones exponent is NaN (mantissa ≠ 0) or ±infinity.
#[inline(always)]
fn f16_bad(h: u16) -> Option<BadScale> {
    if h & 0x7c00 != 0x7c00 {
        None
    } else if h & 0x03ff != 0 {
        Some(BadScale::NaN)
    } else {
        Some(BadScale::Inf)
    }
}

#[inline(always)]
fn f32_bad(x: u32) -> Option<BadScale> {
    if x & 0x7f80_0000 != 0x7f80_0000 {
        None
    } else if x & 0x007f_ffff != 0 {
        Some(BadScale::NaN)
    } else {
        Some(BadScale::Inf)
    }
}

/// The f16 scale fields of a block type: (byte offset in the block, ggml field name).
/// Empty for the types without f16 scales at fixed offsets (IQ1_M, Q8_K: handled apart).
fn f16_fields(ty: GgmlType) -> &'static [(usize, &'static str)] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4NL | IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S | IQ1S | IQ4XS => &[(0, "d")],
        Q4_1 | Q5_1 => &[(0, "d"), (2, "m")],
        Q8_1 => &[(0, "d"), (2, "s")],
        Q4K | Q5K => &[(0, "d"), (2, "dmin")],
        Q2K => &[(80, "d"), (82, "dmin")], // after scales[16], qs[64]
        Q3K => &[(108, "d")],              // after hmask[32], qs[64], scales[12]
        Q6K => &[(208, "d")],              // after ql[128], qh[64], scales[16]
        _ => &[],
    }
}

/// The first block of `bytes` (whole blocks of `SIZE`, a constant so the chunks need no
/// bounds checks) with a non-finite f16 at one of `fields`; the first field on a tie. The hot
/// loop: one or two u16 loads and compares per block, in one pass.
fn scan_fields<const SIZE: usize>(bytes: &[u8], fields: &[(usize, &'static str)]) -> Option<BadBlock> {
    if fields.iter().any(|&(off, _)| off + 2 > SIZE) {
        return None;
    }
    for (block, c) in bytes.chunks_exact(SIZE).enumerate() {
        for &(off, field) in fields {
            let h = u16::from_le_bytes([c[off], c[off + 1]]);
            if h & 0x7c00 == 0x7c00 {
                return f16_bad(h).map(|why| BadBlock { block, field, why });
            }
        }
    }
    None
}

/// Checks every block of `bytes`, a whole number of blocks of `ty` as stored in a GGUF file:
/// each f16 (Q8_K: f32) scale must be a finite number. `Err(QuantError::BadBlock)` names the
/// first bad block (counted from the start of `bytes`) and its field. The plain float types
/// have no block scales and always pass; types without a block layout here (no
/// [`GgmlType::has_reference`]) are `Unsupported`; a length that is not whole blocks is
/// `BadLength`. Never panics.
pub fn check_blocks(ty: GgmlType, bytes: &[u8]) -> Result<(), QuantError> {
    use GgmlType::*;
    if !ty.has_reference() {
        return Err(QuantError::Unsupported(ty));
    }
    let size = ty.type_size();
    if !bytes.len().is_multiple_of(size) {
        return Err(QuantError::BadLength {
            ty,
            what: "block bytes (must be a whole number of blocks)",
            expected: size,
            got: bytes.len(),
        });
    }
    let fields = f16_fields(ty);
    let bad = match ty {
        F32 | F16 | BF16 => None,
        Q8K => bytes.chunks_exact(size).enumerate().find_map(|(block, c)| {
            f32_bad(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).map(|why| BadBlock { block, field: "d", why })
        }),
        // d is the top nibbles of the 4 scale words after qs[32], qh[16].
        IQ1M => bytes.chunks_exact(size).enumerate().find_map(|(block, c)| {
            let s: &[u8; 8] = c[48..56].try_into().ok()?;
            f16_bad(iq1_m::d_bits_of(&iq1_m::scale_words(s))).map(|why| BadBlock { block, field: "d", why })
        }),
        _ => match size {
            18 => scan_fields::<18>(bytes, fields),
            20 => scan_fields::<20>(bytes, fields),
            22 => scan_fields::<22>(bytes, fields),
            24 => scan_fields::<24>(bytes, fields),
            34 => scan_fields::<34>(bytes, fields),
            36 => scan_fields::<36>(bytes, fields),
            50 => scan_fields::<50>(bytes, fields),
            66 => scan_fields::<66>(bytes, fields),
            74 => scan_fields::<74>(bytes, fields),
            82 => scan_fields::<82>(bytes, fields),
            84 => scan_fields::<84>(bytes, fields),
            98 => scan_fields::<98>(bytes, fields),
            110 => scan_fields::<110>(bytes, fields),
            136 => scan_fields::<136>(bytes, fields),
            144 => scan_fields::<144>(bytes, fields),
            176 => scan_fields::<176>(bytes, fields),
            210 => scan_fields::<210>(bytes, fields),
            _ => return Err(QuantError::Unsupported(ty)),
        },
    };
    match bad {
        None => Ok(()),
        Some(b) => Err(QuantError::BadBlock { ty, bad: b }),
    }
}
