//! Row-level entry points over raw GGUF bytes, dispatching on [`GgmlType`] to the per-format
//! block functions. All length errors are returned, never panicked on.

use crate::block::Block;
use crate::{GgmlType, QuantError, float};
use crate::{iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs, iq4_nl, iq4_xs};
use crate::{q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, q8_1, q8_k};

/// `n` must be a whole number of blocks of `ty`.
fn check_multiple(ty: GgmlType, n: usize, what: &'static str) -> Result<(), QuantError> {
    if !n.is_multiple_of(ty.block_size()) {
        return Err(QuantError::BadLength { ty, what, expected: ty.block_size(), got: n });
    }
    Ok(())
}

/// `bytes` must be exactly the row size of `n` elements of `ty`.
fn check_bytes(ty: GgmlType, n: usize, bytes: usize, what: &'static str) -> Result<(), QuantError> {
    match ty.row_bytes(n) {
        Some(b) if b == bytes => Ok(()),
        Some(b) => Err(QuantError::BadLength { ty, what, expected: b, got: bytes }),
        None => Err(QuantError::BadLength { ty, what, expected: ty.block_size(), got: n }),
    }
}

fn deq_blocks<B: Block, const QK: usize>(src: &[u8], dst: &mut [f32], f: fn(&B, &mut [f32; QK])) {
    for (c, o) in src.chunks_exact(B::SIZE).zip(dst.chunks_exact_mut(QK)) {
        if let (Some(b), Ok(o)) = (B::read(c), <&mut [f32; QK]>::try_from(o)) {
            f(&b, o);
        }
    }
}

fn q_blocks<B: Block, const QK: usize>(src: &[f32], dst: &mut [u8], f: fn(&[f32; QK]) -> B) {
    for (x, c) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(B::SIZE)) {
        if let Ok(x) = <&[f32; QK]>::try_from(x) {
            f(x).write(c);
        }
    }
}

fn dot_blocks<W: Block, A: Block>(w: &[u8], a: &[u8], f: fn(&W, &A) -> f32) -> f32 {
    let mut s = 0.0f32;
    for (cw, ca) in w.chunks_exact(W::SIZE).zip(a.chunks_exact(A::SIZE)) {
        if let (Some(bw), Some(ba)) = (W::read(cw), A::read(ca)) {
            s += f(&bw, &ba);
        }
    }
    s
}

/// Dequantize one row: `src` holds `dst.len()` elements of `ty` (ggml `dequantize_row_*`).
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    if !ty.has_reference() {
        return Err(QuantError::Unsupported(ty));
    }
    check_multiple(ty, dst.len(), "dst elements (must be a multiple of the block size)")?;
    check_bytes(ty, dst.len(), src.len(), "src bytes")?;
    use GgmlType::*;
    match ty {
        F32 => float::dequantize_f32(src, dst),
        F16 => float::dequantize_f16(src, dst),
        BF16 => float::dequantize_bf16(src, dst),
        Q4_0 => deq_blocks(src, dst, q4_0::dequantize_ref),
        Q4_1 => deq_blocks(src, dst, q4_1::dequantize_ref),
        Q5_0 => deq_blocks(src, dst, q5_0::dequantize_ref),
        Q5_1 => deq_blocks(src, dst, q5_1::dequantize_ref),
        Q8_0 => deq_blocks(src, dst, q8_0::dequantize_ref),
        Q8_1 => deq_blocks(src, dst, q8_1::dequantize_ref),
        Q4K => deq_blocks(src, dst, q4_k::dequantize_ref),
        Q5K => deq_blocks(src, dst, q5_k::dequantize_ref),
        Q6K => deq_blocks(src, dst, q6_k::dequantize_ref),
        Q8K => deq_blocks(src, dst, q8_k::dequantize_ref),
        IQ3XXS => deq_blocks(src, dst, iq3_xxs::dequantize_ref),
        IQ4NL => deq_blocks(src, dst, iq4_nl::dequantize_ref),
        Q2K => deq_blocks(src, dst, q2_k::dequantize_ref),
        Q3K => deq_blocks(src, dst, q3_k::dequantize_ref),
        IQ4XS => deq_blocks(src, dst, iq4_xs::dequantize_ref),
        IQ3S => deq_blocks(src, dst, iq3_s::dequantize_ref),
        IQ2XXS => deq_blocks(src, dst, iq2_xxs::dequantize_ref),
        IQ2XS => deq_blocks(src, dst, iq2_xs::dequantize_ref),
        IQ2S => deq_blocks(src, dst, iq2_s::dequantize_ref),
        IQ1S => deq_blocks(src, dst, iq1_s::dequantize_ref),
        IQ1M => deq_blocks(src, dst, iq1_m::dequantize_ref),
        _ => return Err(QuantError::Unsupported(ty)),
    }
    Ok(())
}

/// Quantize one row with the reference quantizer (ggml `quantize_row_*_ref`); `dst` must be
/// exactly `ty.row_bytes(src.len())` bytes.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    if !ty.has_quantizer() {
        return Err(QuantError::Unsupported(ty));
    }
    check_multiple(ty, src.len(), "src elements (must be a multiple of the block size)")?;
    check_bytes(ty, src.len(), dst.len(), "dst bytes")?;
    use GgmlType::*;
    match ty {
        F32 => float::quantize_f32(src, dst),
        F16 => float::quantize_f16(src, dst),
        BF16 => float::quantize_bf16(src, dst),
        Q4_0 => q_blocks(src, dst, q4_0::quantize_ref),
        Q4_1 => q_blocks(src, dst, q4_1::quantize_ref),
        Q5_0 => q_blocks(src, dst, q5_0::quantize_ref),
        Q5_1 => q_blocks(src, dst, q5_1::quantize_ref),
        Q8_0 => q_blocks(src, dst, q8_0::quantize_ref),
        Q8_1 => q_blocks(src, dst, q8_1::quantize_ref),
        Q4K => q_blocks(src, dst, q4_k::quantize_ref),
        Q5K => q_blocks(src, dst, q5_k::quantize_ref),
        Q6K => q_blocks(src, dst, q6_k::quantize_ref),
        Q8K => q_blocks(src, dst, q8_k::quantize_ref),
        IQ3XXS => q_blocks(src, dst, iq3_xxs::quantize_ref),
        IQ4NL => q_blocks(src, dst, iq4_nl::quantize_ref),
        _ => return Err(QuantError::Unsupported(ty)),
    }
    Ok(())
}

/// Dot product of a weight row `w` (`n` elements of `ty`) with an activation row `act`
/// (`n` elements of `ty.vec_dot_type()`), as ggml's generic `ggml_vec_dot_<ty>_<act>`:
/// integer sums within blocks, f32 accumulation across blocks.
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> Result<f32, QuantError> {
    if !ty.has_reference() {
        return Err(QuantError::Unsupported(ty));
    }
    let at = ty.vec_dot_type();
    check_multiple(ty, n, "n (must be a multiple of the block size)")?;
    check_multiple(at, n, "n (must be a multiple of the activation block size)")?;
    check_bytes(ty, n, w.len(), "weight bytes")?;
    check_bytes(at, n, act.len(), "activation bytes")?;
    use GgmlType::*;
    Ok(match ty {
        F32 => float::vec_dot_f32(w, act),
        F16 => float::vec_dot_f16(w, act),
        BF16 => float::vec_dot_bf16(w, act),
        Q4_0 => dot_blocks(w, act, q4_0::vec_dot_ref),
        Q4_1 => dot_blocks(w, act, q4_1::vec_dot_ref),
        Q5_0 => dot_blocks(w, act, q5_0::vec_dot_ref),
        Q5_1 => dot_blocks(w, act, q5_1::vec_dot_ref),
        Q8_0 => dot_blocks(w, act, q8_0::vec_dot_ref),
        Q8_1 => dot_blocks(w, act, q8_1::vec_dot_ref),
        Q4K => dot_blocks(w, act, q4_k::vec_dot_ref),
        Q5K => dot_blocks(w, act, q5_k::vec_dot_ref),
        Q6K => dot_blocks(w, act, q6_k::vec_dot_ref),
        Q8K => dot_blocks(w, act, q8_k::vec_dot_ref),
        IQ3XXS => dot_blocks(w, act, iq3_xxs::vec_dot_ref),
        IQ4NL => dot_blocks(w, act, iq4_nl::vec_dot_ref),
        Q2K => dot_blocks(w, act, q2_k::vec_dot_ref),
        Q3K => dot_blocks(w, act, q3_k::vec_dot_ref),
        IQ4XS => dot_blocks(w, act, iq4_xs::vec_dot_ref),
        IQ3S => dot_blocks(w, act, iq3_s::vec_dot_ref),
        IQ2XXS => dot_blocks(w, act, iq2_xxs::vec_dot_ref),
        IQ2XS => dot_blocks(w, act, iq2_xs::vec_dot_ref),
        IQ2S => dot_blocks(w, act, iq2_s::vec_dot_ref),
        IQ1S => dot_blocks(w, act, iq1_s::vec_dot_ref),
        IQ1M => dot_blocks(w, act, iq1_m::vec_dot_ref),
        _ => return Err(QuantError::Unsupported(ty)),
    })
}
