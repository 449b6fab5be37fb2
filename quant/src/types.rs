//! [`GgmlType`] (ggml's `enum ggml_type`, same numeric values as in GGUF files) with its block
//! geometry, and the crate's error type.

use core::fmt;

/// Tensor element types, numbered exactly as ggml/GGUF number them (`ggml_type`).
/// Gaps (4, 5, 31..33) are types ggml removed; they never appear in valid files.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    IQ2XXS = 16,
    IQ2XS = 17,
    IQ3XXS = 18,
    IQ1S = 19,
    IQ4NL = 20,
    IQ3S = 21,
    IQ2S = 22,
    IQ4XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
}

/// Every variant, in numeric order (handy for tests and lookups).
pub const ALL_TYPES: [GgmlType; 31] = {
    use GgmlType::*;
    [
        F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K, IQ2XXS, IQ2XS, IQ3XXS, IQ1S, IQ4NL,
        IQ3S, IQ2S, IQ4XS, I8, I16, I32, I64, F64, IQ1M, BF16, TQ1_0, TQ2_0,
    ]
};

impl GgmlType {
    /// The type with ggml number `v`, or `None` for unknown/removed numbers.
    pub fn from_u32(v: u32) -> Option<GgmlType> {
        let mut i = 0;
        while i < ALL_TYPES.len() {
            if ALL_TYPES[i] as u32 == v {
                return Some(ALL_TYPES[i]);
            }
            i += 1;
        }
        None
    }

    /// ggml's type name (`ggml_type_name`): "f32", "q4_K", "iq3_xxs", ...
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q8_1 => "q8_1",
            Q2K => "q2_K",
            Q3K => "q3_K",
            Q4K => "q4_K",
            Q5K => "q5_K",
            Q6K => "q6_K",
            Q8K => "q8_K",
            IQ2XXS => "iq2_xxs",
            IQ2XS => "iq2_xs",
            IQ3XXS => "iq3_xxs",
            IQ1S => "iq1_s",
            IQ4NL => "iq4_nl",
            IQ3S => "iq3_s",
            IQ2S => "iq2_s",
            IQ4XS => "iq4_xs",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F64 => "f64",
            IQ1M => "iq1_m",
            BF16 => "bf16",
            TQ1_0 => "tq1_0",
            TQ2_0 => "tq2_0",
        }
    }

    /// Elements per block (1 for the plain scalar types).
    pub const fn block_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4NL => 32,
            Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | IQ2XXS | IQ2XS | IQ3XXS | IQ1S | IQ3S | IQ2S | IQ4XS | IQ1M | TQ1_0
            | TQ2_0 => crate::QK_K,
        }
    }

    /// Bytes per block (`ggml_type_size`).
    pub const fn type_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 => 4,
            F16 | BF16 => 2,
            F64 => 8,
            I8 => 1,
            I16 => 2,
            I32 => 4,
            I64 => 8,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2K => 84,  // scales[16] + qs[64] + d + dmin
            Q3K => 110, // hmask[32] + qs[64] + scales[12] + d
            Q4K => 144,
            Q5K => 176,
            Q6K => 210,
            Q8K => 292,
            IQ2XXS => 66, // d + qs[32] u16
            IQ2XS => 74,  // d + qs[32] u16 + scales[8]
            IQ3XXS => 98,
            IQ1S => 50, // d + qs[32] + qh[8] u16
            IQ4NL => 18,
            IQ3S => 110,  // d + qs[64] + qh[8] + signs[32] + scales[4]
            IQ2S => 82,   // d + qs[64] + qh[8] + scales[8]
            IQ4XS => 136, // d + scales_h + scales_l[4] + qs[128]
            IQ1M => 56,   // qs[32] + qh[16] + scales[8]
            TQ1_0 => 54,  // qs[48] + qh[4] + d
            TQ2_0 => 66,  // qs[64] + d
        }
    }

    /// Bytes of a row of `n` elements, or `None` if `n` is not a multiple of the block size
    /// (or the byte count overflows).
    pub const fn row_bytes(self, n: usize) -> Option<usize> {
        let bs = self.block_size();
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size())
    }

    /// The activation format ggml's CPU backend quantizes the other operand to before calling
    /// this type's `vec_dot` (`type_traits_cpu[ty].vec_dot_type`).
    pub const fn vec_dot_type(self) -> GgmlType {
        use GgmlType::*;
        match self {
            Q4_0 | Q5_0 | Q8_0 | IQ4NL => Q8_0,
            Q4_1 | Q5_1 | Q8_1 => Q8_1,
            Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | IQ2XXS | IQ2XS | IQ3XXS | IQ1S | IQ3S | IQ2S | IQ4XS | IQ1M | TQ1_0
            | TQ2_0 => Q8K,
            F16 => F16,
            BF16 => BF16,
            F32 | F64 | I8 | I16 | I32 | I64 => self,
        }
    }

    /// Whether this crate implements `dequantize_row` and `vec_dot` for it: everything a
    /// backend needs to read weights of this type.
    pub const fn has_reference(self) -> bool {
        use GgmlType::*;
        self.has_quantizer() || matches!(self, Q2K | Q3K | IQ4XS | IQ3S | IQ2XXS | IQ2XS | IQ2S | IQ1S | IQ1M)
    }

    /// Whether this crate also implements `quantize_row` for it (the types it writes).
    pub const fn has_quantizer(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | Q4K | Q5K | Q6K | Q8K | IQ3XXS | IQ4NL
        )
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors of the row-level façade. Never a panic: bad lengths are reported with what was
/// expected.
#[derive(Debug, Clone, PartialEq)]
pub enum QuantError {
    /// No reference implementation of this operation for this type in this crate (see
    /// [`GgmlType::has_reference`] and [`GgmlType::has_quantizer`]).
    Unsupported(GgmlType),
    /// A length does not fit the format. `what` names the argument and the rule;
    /// for "not a multiple of the block size" errors `expected` is the block size.
    BadLength { ty: GgmlType, what: &'static str, expected: usize, got: usize },
    /// A block whose scale is NaN or infinite ([`crate::check_blocks`]).
    BadBlock { ty: GgmlType, bad: crate::BadBlock },
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantError::Unsupported(t) => {
                write!(f, "ggml type {t} has no reference implementation")
            }
            QuantError::BadLength { ty, what, expected, got } => {
                write!(f, "{ty}: bad length of {what}: expected {expected}, got {got}")
            }
            QuantError::BadBlock { ty, bad } => write!(f, "{ty}: {bad}"),
        }
    }
}

impl core::error::Error for QuantError {}
