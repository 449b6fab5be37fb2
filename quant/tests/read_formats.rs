//! The formats Strata reads but does not write (Q2_K, Q3_K, IQ4_XS, IQ3_S, IQ2_XXS/XS/S,
//! IQ1_S/M): their dequantization is checked bit for bit in `vectors.rs`; here their block
//! dots against Q8_K are checked against an f64 dot of the dequantized operands, and the row
//! façade's refusals and length errors.

mod common;
use common::Rng;
use quant::{GgmlType, QuantError, dequantize_row, quantize_row, vec_dot};

const READ_ONLY: [GgmlType; 9] = [
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::IQ4XS,
    GgmlType::IQ3S,
    GgmlType::IQ2XXS,
    GgmlType::IQ2XS,
    GgmlType::IQ2S,
    GgmlType::IQ1S,
    GgmlType::IQ1M,
];

/// Byte offsets of the f16 scales in a block (IQ1_M: none, its scale is split, see below).
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::IQ1M => &[],
        _ => &[0],
    }
}

/// Random f16 bits of magnitude 2^-5..2^3 with either sign.
fn f16_scale(r: &mut Rng) -> u16 {
    let v = r.next_u64();
    ((v & 1) << 15) as u16 | (((10 + (v >> 1) % 9) as u16) << 10) | ((v >> 8) & 0x3ff) as u16
}

/// `nb` blocks of random bytes with finite f16 scales.
fn random_blocks(ty: GgmlType, nb: usize, r: &mut Rng) -> Vec<u8> {
    let bs = ty.type_size();
    let mut w: Vec<u8> = (0..nb * bs).map(|_| r.next_u64() as u8).collect();
    for b in w.chunks_exact_mut(bs) {
        for &o in scale_offsets(ty) {
            b[o..o + 2].copy_from_slice(&f16_scale(r).to_le_bytes());
        }
        if ty == GgmlType::IQ1M {
            // d's nibble k is the top nibble of scale word k (bytes 48..56).
            let d = f16_scale(r);
            for k in 0..4 {
                b[49 + 2 * k] = (b[49 + 2 * k] & 0x0f) | ((((d >> (4 * k)) & 0xf) as u8) << 4);
            }
        }
    }
    w
}

fn normals(n: usize, r: &mut Rng) -> Vec<f32> {
    (0..n).map(|_| r.normal() as f32).collect()
}

#[test]
fn capabilities() {
    for ty in READ_ONLY {
        assert!(ty.has_reference() && !ty.has_quantizer(), "{ty}");
        assert_eq!(ty.vec_dot_type(), GgmlType::Q8K, "{ty}");
    }
}

/// Integer sums inside a block, f32 scale products: within 2e-5 of Σ|w·a| of the f64 dot.
#[test]
fn vec_dot_matches_f64_dot_of_dequantized() {
    let n = 8 * 256;
    let mut r = Rng::new(36);
    for ty in READ_ONLY {
        for trial in 0..8 {
            let w = random_blocks(ty, n / 256, &mut r);
            let mut a = vec![0u8; GgmlType::Q8K.row_bytes(n).unwrap()];
            quantize_row(GgmlType::Q8K, &normals(n, &mut r), &mut a).unwrap();
            let (mut wd, mut ad) = (vec![0f32; n], vec![0f32; n]);
            dequantize_row(ty, &w, &mut wd).unwrap();
            dequantize_row(GgmlType::Q8K, &a, &mut ad).unwrap();
            let want: f64 = wd.iter().zip(&ad).map(|(&x, &y)| x as f64 * y as f64).sum();
            let mag: f64 = wd.iter().zip(&ad).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum();
            let got = vec_dot(ty, n, &w, &a).unwrap() as f64;
            assert!(
                (got - want).abs() <= 2e-5 * mag + 1e-30,
                "{ty} trial {trial}: vec_dot {got} vs f64 {want} (Σ|w·a| {mag})"
            );
        }
    }
}

#[test]
fn no_quantizer_and_bad_lengths_are_errors() {
    for ty in READ_ONLY {
        let bs = ty.type_size();
        let mut q = vec![0u8; bs];
        let mut y = vec![0f32; 256];
        assert_eq!(quantize_row(ty, &y, &mut q), Err(QuantError::Unsupported(ty)));
        assert!(matches!(dequantize_row(ty, &q, &mut y[..255]), Err(QuantError::BadLength { .. })));
        assert!(matches!(dequantize_row(ty, &q[..bs - 1], &mut y), Err(QuantError::BadLength { .. })));
        let a = vec![0u8; GgmlType::Q8K.type_size()];
        assert!(matches!(vec_dot(ty, 256, &q, &a[..10]), Err(QuantError::BadLength { .. })));
        assert!(matches!(vec_dot(ty, 128, &q, &a), Err(QuantError::BadLength { .. })));
        assert_eq!(vec_dot(ty, 256, &q, &a), Ok(0.0));
    }
}

/// Rows at odd addresses dequantize like aligned ones (blocks are read unaligned).
#[test]
fn misaligned_rows_work() {
    let mut r = Rng::new(7);
    for ty in READ_ONLY {
        let w = random_blocks(ty, 2, &mut r);
        let mut shifted = vec![0u8; w.len() + 1];
        shifted[1..].copy_from_slice(&w);
        let (mut a, mut b) = (vec![0f32; 512], vec![0f32; 512]);
        dequantize_row(ty, &w, &mut a).unwrap();
        dequantize_row(ty, &shifted[1..], &mut b).unwrap();
        assert_eq!(a, b, "{ty}");
    }
}
