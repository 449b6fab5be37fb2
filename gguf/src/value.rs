//! GGUF metadata values: the 13 on-disk value types and typed accessors.

use std::fmt;

/// On-disk value type codes (`gguf_type` in ggml's `gguf.h`).
pub(crate) mod code {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STR: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// One metadata value. Arrays may nest (an array of arrays is legal GGUF).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Array(Vec<Value>),
}

impl Value {
    /// The GGUF type code of this value.
    pub fn type_code(&self) -> u32 {
        match self {
            Value::U8(_) => code::U8,
            Value::I8(_) => code::I8,
            Value::U16(_) => code::U16,
            Value::I16(_) => code::I16,
            Value::U32(_) => code::U32,
            Value::I32(_) => code::I32,
            Value::F32(_) => code::F32,
            Value::Bool(_) => code::BOOL,
            Value::Str(_) => code::STR,
            Value::U64(_) => code::U64,
            Value::I64(_) => code::I64,
            Value::F64(_) => code::F64,
            Value::Array(_) => code::ARRAY,
        }
    }

    /// Human-readable type name, used in error messages.
    pub fn type_name(&self) -> &'static str {
        type_name(self.type_code())
    }

    /// Any integer type, widened to i128 so every GGUF integer fits exactly.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v as i128,
            Value::I8(v) => v as i128,
            Value::U16(v) => v as i128,
            Value::I16(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::I32(v) => v as i128,
            Value::U64(v) => v as i128,
            Value::I64(v) => v as i128,
            _ => return None,
        })
    }

    pub fn as_u32(&self) -> Option<u32> {
        self.as_int().and_then(|v| u32::try_from(v).ok())
    }

    pub fn as_u64(&self) -> Option<u64> {
        self.as_int().and_then(|v| u64::try_from(v).ok())
    }

    pub fn as_i64(&self) -> Option<i64> {
        self.as_int().and_then(|v| i64::try_from(v).ok())
    }

    /// Floats as f32; integers are accepted too (some converters write `1` for `1.0`).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => self.as_int().map(|v| v as f32),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

pub(crate) fn type_name(code: u32) -> &'static str {
    match code {
        code::U8 => "u8",
        code::I8 => "i8",
        code::U16 => "u16",
        code::I16 => "i16",
        code::U32 => "u32",
        code::I32 => "i32",
        code::F32 => "f32",
        code::BOOL => "bool",
        code::STR => "string",
        code::ARRAY => "array",
        code::U64 => "u64",
        code::I64 => "i64",
        code::F64 => "f64",
        _ => "unknown",
    }
}

/// Size in bytes of a fixed-size scalar type, `None` for string/array/unknown.
pub(crate) fn scalar_size(code: u32) -> Option<usize> {
    match code {
        code::U8 | code::I8 | code::BOOL => Some(1),
        code::U16 | code::I16 => Some(2),
        code::U32 | code::I32 | code::F32 => Some(4),
        code::U64 | code::I64 | code::F64 => Some(8),
        _ => None,
    }
}

/// Smallest number of bytes one element of `code` can occupy on disk; used to reject element
/// counts that cannot possibly fit in the rest of the file before allocating anything.
pub(crate) fn min_encoded_size(code: u32) -> usize {
    match code {
        code::STR => 8,    // u64 length
        code::ARRAY => 12, // u32 type + u64 count
        c => scalar_size(c).unwrap_or(1),
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::Str(v) => write!(f, "{v:?}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Array(a) => {
                write!(f, "[")?;
                for (i, v) in a.iter().take(8).enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{v}")?;
                }
                if a.len() > 8 {
                    write!(f, ", ... ({} items)", a.len())?;
                }
                write!(f, "]")
            }
        }
    }
}
