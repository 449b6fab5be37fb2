//! Activation preparation for a kernel path: quantizes f32 activation columns into an [`Acts`]
//! (layout described in `acts`) with `quant`'s reference quantizers or the x86-rounded ones
//! below, whose AVX2 halves live in `x86::quantize`; the AVX-512 ggml-order layout comes from
//! `x86::ggml_q8_512::prepare`. Called by the `matmul` entry points.

use crate::acts::Acts;
use crate::tensor::{Gemm, KernelError, Path};
use quant::GgmlType;

/// Columns per rayon task when quantizing many activation columns.
const COLS_PER_TASK: usize = 8;

/// Quantize `n` columns of length `k` (`x = [n][k]`) for weights of type `wty` (with
/// `Gemm::Tiles`, also the block sums the row tiles start from).
pub(crate) fn acts(wty: GgmlType, x: &[f32], n: usize, k: usize, path: Path, gemm: Gemm) -> Result<Acts, KernelError> {
    let ty = wty.vec_dot_type();
    let raw_row = ty.row_bytes(k).ok_or(KernelError::Shape {
        what: "activation length (not a multiple of the block size)",
        expected: ty.block_size(),
        got: k,
    })?;
    let mut a = Acts {
        ty,
        n,
        raw: Vec::new(),
        raw_row,
        qs: Vec::new(),
        d: Vec::new(),
        s: Vec::new(),
        bsums: Vec::new(),
        perm: Vec::new(),
        mb: Vec::new(),
        f: Vec::new(),
        h: Vec::new(),
        lcorr: Vec::new(),
        corr: Vec::new(),
        tiles: false,
    };
    if ty == GgmlType::F32 {
        // No quantization: kernels read `f`, the portable path reads `raw`.
        a.f = x[..n * k].to_vec();
        if path == Path::Portable {
            a.raw = a.f.iter().flat_map(|v| v.to_le_bytes()).collect();
        }
        return Ok(a);
    }
    a.raw = vec![0u8; n * raw_row];
    let work = |(c, dst): (usize, &mut [u8])| -> Result<(), KernelError> {
        for (j, row) in dst.chunks_exact_mut(raw_row).enumerate() {
            let col = c * COLS_PER_TASK + j;
            if ty == GgmlType::Q8K {
                quantize_q8_k(&x[col * k..(col + 1) * k], row)?;
            } else {
                quant::quantize_row(ty, &x[col * k..(col + 1) * k], row)?;
            }
        }
        Ok(())
    };
    if n >= 2 * COLS_PER_TASK {
        crate::team::try_chunks_mut(&mut a.raw, COLS_PER_TASK * raw_row, |c, dst| work((c, dst)))?;
    } else {
        a.raw.chunks_mut(COLS_PER_TASK * raw_row).enumerate().try_for_each(work)?;
    }
    if path == Path::Portable {
        return Ok(a);
    }
    #[cfg(target_arch = "x86_64")]
    {
        a.tiles = gemm == Gemm::Tiles && (n >= crate::x86::gemm_q0::MIN_COLS || crate::x86::gemv_tiles::has(wty));
    }
    let bs = ty.type_size();
    match ty {
        GgmlType::F16 | GgmlType::BF16 => {
            a.h = a.raw.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        }
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            let nb = n * k / 32;
            a.qs.reserve(n * k);
            a.d.reserve(nb);
            a.s.reserve(nb);
            let off = if ty == GgmlType::Q8_0 { 2 } else { 4 };
            for b in a.raw.chunks_exact(bs) {
                let d = quant::f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                let q = &b[off..off + 32];
                a.qs.extend(q.iter().map(|&v| v as i8));
                a.d.push(d);
                if ty == GgmlType::Q8_0 {
                    let sum: i32 = q.iter().map(|&v| v as i8 as i32).sum();
                    a.s.push(d * sum as f32);
                } else {
                    a.s.push(quant::f16_to_f32(u16::from_le_bytes([b[2], b[3]])));
                }
            }
            if ty == GgmlType::Q8_0 && path == Path::Avx512 {
                // x + 128 as u8 (x ^ 0x80): the unsigned operand of vpdpbusd (x86::zmm).
                a.perm = a.qs.iter().map(|&q| (q as u8 ^ 0x80) as i8).collect();
                #[cfg(target_arch = "x86_64")]
                if a.tiles {
                    a.corr = a.qs.chunks_exact(32).map(|q| -128 * q.iter().map(|&v| v as i32).sum::<i32>()).collect();
                }
            }
        }
        GgmlType::Q8K => {
            let nb = n * k / 256;
            a.qs.reserve(n * k);
            a.d.reserve(nb);
            a.bsums.reserve(nb * 16);
            for b in a.raw.chunks_exact(bs) {
                a.d.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                a.qs.extend(b[4..260].iter().map(|&v| v as i8));
                a.bsums.extend(b[260..292].chunks_exact(2).map(|v| i16::from_le_bytes([v[0], v[1]])));
            }
            if wty == GgmlType::Q4K && path == Path::Avx512 {
                a.mb = a
                    .bsums
                    .chunks_exact(16)
                    .zip(&a.d)
                    .flat_map(|(bs, &d)| (0..8).map(move |s| d * (bs[2 * s] as i32 + bs[2 * s + 1] as i32) as f32))
                    .collect();
                // Sub-block order 0,2,1,3,4,6,5,7 (see x86::zmm): 32-byte groups swapped.
                a.perm = vec![0i8; n * k];
                for (src, dst) in a.qs.chunks_exact(256).zip(a.perm.chunks_exact_mut(256)) {
                    for (o, s) in [0usize, 2, 1, 3, 4, 6, 5, 7].into_iter().enumerate() {
                        dst[32 * o..32 * o + 32].copy_from_slice(&src[32 * s..32 * s + 32]);
                    }
                }
            }
            if wty == GgmlType::IQ3XXS && path == Path::Avx512 {
                a.perm = vec![0i8; n * k];
                for (src, dst) in a.qs.chunks_exact(256).zip(a.perm.chunks_exact_mut(256)) {
                    for kk in 0..64 {
                        for j in 0..4 {
                            // Biased to u8 (x ^ 0x80 = x + 128), see x86::iq3_512.
                            dst[j * 64 + kk] = (src[4 * kk + j] as u8 ^ 0x80) as i8;
                        }
                    }
                }
            }
        }
        other => return Err(KernelError::Unsupported(other)),
    }
    Ok(a)
}

/// Activations for the ggml-order kernels (`x86::ggml_kernel`): only `raw` (Q8_0 blocks
/// rounded like llama.cpp's x86 `quantize_row_q8_0`, or the reference Q8_K quantizer), plus
/// on AVX-512 for Q8_0/Q5_0 weights the biased quants and f32 scales of `ggml_q8_512`.
pub(crate) fn acts_ggml(wty: GgmlType, x: &[f32], n: usize, k: usize, path: Path) -> Result<Acts, KernelError> {
    let ty = wty.vec_dot_type();
    let raw_row = ty.row_bytes(k).ok_or(KernelError::Shape {
        what: "activation length (not a multiple of the block size)",
        expected: ty.block_size(),
        got: k,
    })?;
    let mut a = Acts {
        ty,
        n,
        raw: vec![0u8; n * raw_row],
        raw_row,
        qs: Vec::new(),
        d: Vec::new(),
        s: Vec::new(),
        bsums: Vec::new(),
        perm: Vec::new(),
        mb: Vec::new(),
        f: Vec::new(),
        h: Vec::new(),
        lcorr: Vec::new(),
        corr: Vec::new(),
        tiles: false,
    };
    let work = |(c, dst): (usize, &mut [u8])| -> Result<(), KernelError> {
        for (j, row) in dst.chunks_exact_mut(raw_row).enumerate() {
            let col = c * COLS_PER_TASK + j;
            let src = &x[col * k..(col + 1) * k];
            if ty == GgmlType::Q8_0 {
                quantize_q8_0_x86(src, row);
            } else if ty == GgmlType::Q8K {
                quantize_q8_k(src, row)?;
            } else {
                quant::quantize_row(ty, src, row)?;
            }
        }
        Ok(())
    };
    if n >= 2 * COLS_PER_TASK {
        crate::team::try_chunks_mut(&mut a.raw, COLS_PER_TASK * raw_row, |c, dst| work((c, dst)))?;
    } else {
        a.raw.chunks_mut(COLS_PER_TASK * raw_row).enumerate().try_for_each(work)?;
    }
    #[cfg(target_arch = "x86_64")]
    if ty == GgmlType::Q8_0 && path == Path::Avx512 {
        crate::x86::ggml_q8_512::prepare(&mut a, wty);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = path;
    Ok(a)
}

/// `quant::quantize_row(Q8K, ..)` (the reference quantizer llama.cpp also uses on x86), with the
/// same bytes: AVX2 for blocks of finite values, the reference for anything else.
pub(crate) fn quantize_q8_k(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    #[cfg(target_arch = "x86_64")]
    if crate::x86::cpu::has_avx2() && x.len().is_multiple_of(256) && out.len() == x.len() / 256 * 292 {
        for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
            // SAFETY: AVX2 present (checked); 256 inputs and 292 output bytes.
            if !unsafe { crate::x86::quantize::quantize_q8_k_block_avx2(xb, ob) } {
                quant::quantize_row(GgmlType::Q8K, xb, ob)?;
            }
        }
        return Ok(());
    }
    quant::quantize_row(GgmlType::Q8K, x, out)?;
    Ok(())
}

/// Q8_0 activation blocks as llama.cpp's x86 `quantize_row_q8_0` (AVX path) writes them: the
/// stored scale is `d = amax/127` (f16), but the quants are `round_half_even(x * (127/amax))`,
/// not `roundf(x / d)` like the reference quantizer: the two differ in the last bit of the
/// multiplier and on ties, which flips a quant now and then.
pub fn quantize_q8_0_x86(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::x86::cpu::has_avx2() {
        // SAFETY: AVX2/FMA/F16C present (checked).
        return unsafe { crate::x86::quantize::quantize_q8_0_x86_avx2(x, out) };
    }
    quantize_q8_0_x86_scalar(x, out)
}

fn quantize_q8_0_x86_scalar(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        ob[..2].copy_from_slice(&quant::f32_to_f16(d).to_le_bytes());
        for (o, &v) in ob[2..].iter_mut().zip(xb) {
            *o = ((v * id).round_ties_even() as i32).clamp(-128, 127) as i8 as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    /// The AVX2 x86 Q8_0 quantizer writes the same bytes as the scalar definition (outliers,
    /// zeros, ties such as x * 127/amax = k + 0.5, tiny and huge magnitudes).
    #[test]
    fn quantize_q8_0_x86_simd_matches_scalar() {
        let mut seed = 0x1357_9bdf_2468_ace0u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let mut x: Vec<f32> = (0..32 * 4000).map(|i| rnd() * [1e-30, 1e-3, 1.0, 7.0, 3e4][i / 32 % 5]).collect();
        x[32..64].fill(0.0);
        for (i, v) in x[64..96].iter_mut().enumerate() {
            *v = (i as f32 - 16.0) * 0.5 + 0.25; // ties after scaling
        }
        x[96] = 127.0;
        let mut a = vec![0u8; 4000 * 34];
        let mut b = vec![0u8; 4000 * 34];
        super::quantize_q8_0_x86(&x, &mut a);
        super::quantize_q8_0_x86_scalar(&x, &mut b);
        assert_eq!(a, b);
    }

    /// The AVX2 Q8_K quantizer writes the reference's bytes: random scales, the maximum
    /// reached by both signs (first one wins), zero blocks, ties after scaling, NaN/inf blocks
    /// (reference fallback).
    #[test]
    fn quantize_q8_k_simd_matches_reference() {
        let mut seed = 0x0123_4567_89ab_cdefu64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let nb = 600;
        let mut x: Vec<f32> = (0..256 * nb).map(|i| rnd() * [1e-30, 1e-3, 1.0, 7.0, 3e4, 300.0][i / 256 % 6]).collect();
        x[256..512].fill(0.0);
        x[512 + 3] = 5.0;
        x[512 + 9] = -5.0;
        x[768 + 9] = -5.0;
        x[768 + 100] = 5.0;
        for (i, v) in x[1024..1280].iter_mut().enumerate() {
            *v = (i as f32 - 128.0) * 0.5; // ties after scaling by -127/-64
        }
        x[1280 + 7] = f32::NAN;
        x[1536 + 8] = f32::INFINITY;
        let mut a = vec![0u8; nb * 292];
        let mut b = vec![0u8; nb * 292];
        super::quantize_q8_k(&x, &mut a).unwrap();
        quant::quantize_row(quant::GgmlType::Q8K, &x, &mut b).unwrap();
        for i in 0..nb {
            assert_eq!(a[i * 292..(i + 1) * 292], b[i * 292..(i + 1) * 292], "block {i}");
        }
    }
}
