//! Unquantized rows: F32, F16 and BF16 (block size 1). Dot products accumulate in f64 like
//! ggml's `ggml_vec_dot_f32/f16/bf16` generic code (`ggml_float` = double), each product
//! formed in f32 first.

use crate::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

#[inline]
fn le_u16(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}
#[inline]
fn le_f32(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// F32 bytes → f32 (`src.len() == 4 * dst.len()`, checked by the caller).
pub fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *o = le_f32(c);
    }
}
/// F16 bytes → f32.
pub fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16_to_f32(le_u16(c));
    }
}
/// BF16 bytes → f32.
pub fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16_to_f32(le_u16(c));
    }
}
/// f32 → F32 bytes.
pub fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (&x, c) in src.iter().zip(dst.chunks_exact_mut(4)) {
        c.copy_from_slice(&x.to_le_bytes());
    }
}
/// f32 → F16 bytes (round to nearest even).
pub fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    for (&x, c) in src.iter().zip(dst.chunks_exact_mut(2)) {
        c.copy_from_slice(&f32_to_f16(x).to_le_bytes());
    }
}
/// f32 → BF16 bytes (round to nearest even).
pub fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (&x, c) in src.iter().zip(dst.chunks_exact_mut(2)) {
        c.copy_from_slice(&f32_to_bf16(x).to_le_bytes());
    }
}
/// F32 · F32.
pub fn vec_dot_f32(w: &[u8], a: &[u8]) -> f32 {
    let mut s = 0.0f64;
    for (x, y) in w.chunks_exact(4).zip(a.chunks_exact(4)) {
        s += (le_f32(x) * le_f32(y)) as f64;
    }
    s as f32
}
/// F16 · F16.
pub fn vec_dot_f16(w: &[u8], a: &[u8]) -> f32 {
    let mut s = 0.0f64;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(2)) {
        s += (f16_to_f32(le_u16(x)) * f16_to_f32(le_u16(y))) as f64;
    }
    s as f32
}
/// BF16 · BF16.
pub fn vec_dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    let mut s = 0.0f64;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(2)) {
        s += (bf16_to_f32(le_u16(x)) * bf16_to_f32(le_u16(y))) as f64;
    }
    s as f32
}
