//! Property tests of every format with a reference implementation, with a deterministic PRNG:
//! quantize → dequantize error bounds, `vec_dot` against an f64 dot of the dequantized
//! operands, format-validity checks, and length errors (never panics).

mod common;
use common::{Rng, rows};
use quant::{GgmlType, QuantError, dequantize_row, quantize_row, vec_dot};

/// Formats with a full reference (quantize, dequantize, vec_dot).
const TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8K,
    GgmlType::IQ3XXS,
    GgmlType::IQ4NL,
];

/// Largest accepted relative RMS error `sqrt(Σ(x-y)² / Σx²)` of quantize→dequantize on
/// gaussian/uniform data, per format. Derived from the step size: a uniform quantizer with
/// `2^b` levels over `±amax` has RMS error ≈ step/√12; these bounds are ~1.5× the values the
/// llama.cpp reference quantizers reach on N(0,1) data.
fn rmse_tol(ty: GgmlType) -> f64 {
    use GgmlType::*;
    match ty {
        F32 => 0.0,
        F16 => 5e-4,  // 11-bit significand
        BF16 => 4e-3, // 8-bit significand
        Q8_0 | Q8_1 | Q8K => 0.012,
        Q6K => 0.03,
        Q5_0 | Q5_1 | Q5K => 0.06,
        Q4_0 | Q4_1 | Q4K | IQ4NL => 0.12,
        IQ3XXS => 0.25,
        _ => unreachable!(),
    }
}

fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; ty.row_bytes(x.len()).unwrap()];
    quantize_row(ty, x, &mut q).unwrap();
    q
}

fn dequantize(ty: GgmlType, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(ty, q, &mut y).unwrap();
    y
}

fn rel_rmse(x: &[f32], y: &[f32]) -> f64 {
    let (mut e, mut s) = (0f64, 0f64);
    for (&a, &b) in x.iter().zip(y) {
        e += (a as f64 - b as f64).powi(2);
        s += (a as f64).powi(2);
    }
    if s == 0.0 { e.sqrt() } else { (e / s).sqrt() }
}

#[test]
fn roundtrip_error_bounds() {
    let n = 4096;
    for ty in TYPES {
        for (shape, x) in rows(0x5eed ^ ty as u64, n) {
            let y = dequantize(ty, &quantize(ty, &x), n);
            assert!(y.iter().all(|v| v.is_finite()), "{ty} {shape}: non-finite output");
            let err = rel_rmse(&x, &y);
            let tol = match shape {
                "zeros" => 0.0,
                // a constant row is (nearly) representable by every format but IQ3_XXS, whose
                // grid has few levels and 4-bit group scales
                "constant" if ty != GgmlType::IQ3XXS => 2e-3,
                "gaussian" | "uniform" | "constant" => rmse_tol(ty),
                // ~1% outliers of 50x: the block scale follows the outlier, so the small
                // values in the same block lose bits (worst for 256-wide blocks)
                "outliers" => 4.0 * rmse_tol(ty),
                _ => 2.0 * rmse_tol(ty),
            };
            assert!(err <= tol, "{ty} {shape}: relative RMSE {err:.5} > {tol}");
        }
    }
}

/// Reports the measured errors (run with --nocapture) so that tolerances can be reviewed.
#[test]
fn report_roundtrip_errors() {
    let mut r = Rng::new(7);
    let x: Vec<f32> = (0..65536).map(|_| r.normal() as f32).collect();
    for ty in TYPES {
        let y = dequantize(ty, &quantize(ty, &x), x.len());
        println!("{:8} gaussian rel-RMSE {:.5} (tol {})", ty.name(), rel_rmse(&x, &y), rmse_tol(ty));
    }
}

/// Per-block bound for the simple symmetric formats: every element within half a step
/// (plus f16 rounding of the scale) of the input.
#[test]
fn q8_0_elementwise_bound() {
    let mut r = Rng::new(11);
    let x: Vec<f32> = (0..32 * 64).map(|_| r.normal() as f32).collect();
    let y = dequantize(GgmlType::Q8_0, &quantize(GgmlType::Q8_0, &x), x.len());
    for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        for (i, (a, c)) in xb.iter().zip(yb).enumerate() {
            // half a step, plus |q| * (f16 relative rounding of d) <= 127 * d * 2^-11
            let bound = 0.5 * d + 127.0 * d * 4.9e-4 + 1e-7;
            assert!((a - c).abs() <= bound, "block {b} elem {i}: {a} vs {c} (bound {bound})");
        }
    }
}

/// f64 dot of the dequantized operands (independent of the block dot code).
fn ref_dot(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> (f64, f64) {
    let wd = dequantize(ty, w, n);
    let ad = dequantize(ty.vec_dot_type(), a, n);
    let mut s = 0f64;
    let mut mag = 0f64;
    for (x, y) in wd.iter().zip(&ad) {
        s += *x as f64 * *y as f64;
        mag += (*x as f64 * *y as f64).abs();
    }
    (s, mag)
}

/// Relative (to Σ|w·a|) tolerance of `vec_dot` vs the f64 dot of dequantized values.
/// Integer formats are exact inside a block, so only f32 scale products and accumulation
/// differ (~1e-6). Q4_1/Q5_1 use Q8_1's `s = f16(d·Σq)` instead of Σ of the dequantized
/// activations, which adds up to 2^-11 relative error on the min term.
fn dot_tol(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 => 2e-3,
        _ => 2e-5,
    }
}

#[test]
fn vec_dot_matches_f64_dot_of_dequantized() {
    let n = 2048;
    for ty in TYPES {
        let at = ty.vec_dot_type();
        for (seed, (shape, x)) in rows(0xd07 ^ ty as u64, n).into_iter().enumerate() {
            let mut r = Rng::new(seed as u64 + 99);
            let act: Vec<f32> = (0..n).map(|_| r.normal() as f32).collect();
            let w = quantize(ty, &x);
            let a = quantize(at, &act);
            let got = vec_dot(ty, n, &w, &a).unwrap() as f64;
            let (want, mag) = ref_dot(ty, &w, &a, n);
            let tol = dot_tol(ty) * mag + 1e-30;
            assert!(
                (got - want).abs() <= tol,
                "{ty}·{at} {shape}: vec_dot {got} vs f64 {want} (diff {:e}, tol {tol:e})",
                (got - want).abs()
            );
        }
    }
}

#[test]
fn bad_lengths_are_errors_not_panics() {
    for ty in TYPES {
        let bs = ty.block_size();
        let at = ty.vec_dot_type();
        if bs > 1 {
            let n = bs + 1;
            let x = vec![0.5f32; n];
            let mut q = vec![0u8; ty.type_size() * 2];
            assert!(matches!(quantize_row(ty, &x, &mut q), Err(QuantError::BadLength { .. })), "{ty}");
            let mut y = vec![0f32; n];
            assert!(matches!(dequantize_row(ty, &q, &mut y), Err(QuantError::BadLength { .. })), "{ty}");
            assert!(matches!(vec_dot(ty, n, &q, &q), Err(QuantError::BadLength { .. })), "{ty}");
            assert_eq!(ty.row_bytes(n), None);
        }
        // right element count, wrong byte count (one byte short / long)
        let n = 256;
        let good = ty.row_bytes(n).unwrap();
        let x = vec![0.25f32; n];
        for bad in [good - 1, good + 1, 0] {
            let mut q = vec![0u8; bad];
            let e = quantize_row(ty, &x, &mut q).unwrap_err();
            assert_eq!(e, QuantError::BadLength { ty, what: "dst bytes", expected: good, got: bad });
            let mut y = vec![0f32; n];
            assert!(matches!(dequantize_row(ty, &q, &mut y), Err(QuantError::BadLength { .. })));
            let a = vec![0u8; at.row_bytes(n).unwrap()];
            assert!(matches!(vec_dot(ty, n, &q, &a), Err(QuantError::BadLength { .. })));
            let w = vec![0u8; good];
            assert!(matches!(vec_dot(ty, n, &w, &q[..bad.min(q.len())]), Err(QuantError::BadLength { .. })));
        }
        // empty rows are fine
        assert_eq!(vec_dot(ty, 0, &[], &[]), Ok(0.0));
    }
}

#[test]
fn unsupported_types_report_unsupported() {
    for v in 0..64u32 {
        let Some(ty) = GgmlType::from_u32(v) else {
            continue;
        };
        if ty.has_reference() {
            continue;
        }
        let n = ty.block_size();
        let mut q = vec![0u8; ty.type_size()];
        let mut y = vec![0f32; n];
        assert_eq!(dequantize_row(ty, &q, &mut y), Err(QuantError::Unsupported(ty)));
        assert_eq!(quantize_row(ty, &y, &mut q), Err(QuantError::Unsupported(ty)));
        assert_eq!(vec_dot(ty, n, &q, &q), Err(QuantError::Unsupported(ty)));
    }
}

#[test]
fn ggml_type_table() {
    let mut seen = 0;
    for v in 0..64u32 {
        if let Some(t) = GgmlType::from_u32(v) {
            seen += 1;
            assert_eq!(t as u32, v);
            assert_eq!(t.row_bytes(t.block_size() * 3), Some(t.type_size() * 3));
            assert!(
                t.vec_dot_type().block_size() == 1
                    || t.block_size() % t.vec_dot_type().block_size() == 0
                    || t.vec_dot_type().block_size() % t.block_size() == 0
            );
        }
    }
    assert_eq!(seen, 31);
    for v in [4u32, 5, 31, 32, 33, 36, 1000] {
        assert_eq!(GgmlType::from_u32(v), None);
    }
    assert_eq!(GgmlType::Q4K.name(), "q4_K");
    assert_eq!(GgmlType::IQ3XXS.name(), "iq3_xxs");
    assert_eq!(GgmlType::Q4K.vec_dot_type(), GgmlType::Q8K);
    assert_eq!(GgmlType::Q4_1.vec_dot_type(), GgmlType::Q8_1);
    assert_eq!(GgmlType::IQ4NL.vec_dot_type(), GgmlType::Q8_0);
    // ggml sizes (ggml.c type_traits), written out independently of the block structs
    let sizes = [
        (GgmlType::Q4_0, 18),
        (GgmlType::Q4_1, 20),
        (GgmlType::Q5_0, 22),
        (GgmlType::Q5_1, 24),
        (GgmlType::Q8_0, 34),
        (GgmlType::Q8_1, 36),
        (GgmlType::Q2K, 84),
        (GgmlType::Q3K, 110),
        (GgmlType::Q4K, 144),
        (GgmlType::Q5K, 176),
        (GgmlType::Q6K, 210),
        (GgmlType::Q8K, 292),
        (GgmlType::IQ2XXS, 66),
        (GgmlType::IQ2XS, 74),
        (GgmlType::IQ3XXS, 98),
        (GgmlType::IQ1S, 50),
        (GgmlType::IQ4NL, 18),
        (GgmlType::IQ3S, 110),
        (GgmlType::IQ2S, 82),
        (GgmlType::IQ4XS, 136),
        (GgmlType::IQ1M, 56),
        (GgmlType::TQ1_0, 54),
        (GgmlType::TQ2_0, 66),
    ];
    for (t, s) in sizes {
        assert_eq!(t.type_size(), s, "{t}");
    }
}

/// IQ3_XXS blocks from our quantizer are valid: every 8-sign pattern has even parity by
/// construction (bit 7 is implied), scales are 4-bit, and at most one weight per 8 has its
/// sign changed (the parity fix-up), which must be the smallest one.
#[test]
fn iq3_xxs_quantizer_makes_valid_blocks() {
    use quant::iq3_xxs::{BlockIQ3XXS, quantize_ref};
    let mut r = Rng::new(3);
    for _ in 0..32 {
        let x: [f32; 256] = std::array::from_fn(|_| r.normal() as f32);
        let b: BlockIQ3XXS = quantize_ref(&x);
        let mut y = [0f32; 256];
        quant::iq3_xxs::dequantize_ref(&b, &mut y);
        for g in 0..32 {
            let xs = &x[8 * g..8 * g + 8];
            let ys = &y[8 * g..8 * g + 8];
            let flips: Vec<usize> = (0..8).filter(|&j| (xs[j] < 0.0) != (ys[j] < 0.0) && ys[j] != 0.0).collect();
            assert!(flips.len() <= 1, "group {g}: {} sign flips", flips.len());
            if let Some(&j) = flips.first() {
                let minabs = xs.iter().fold(f32::MAX, |m, v| m.min(v.abs()));
                assert_eq!(xs[j].abs(), minabs, "group {g}: flipped a weight that is not the smallest");
            }
        }
    }
}

/// Q8_K bsums are the sums of 16 quants.
#[test]
fn q8_k_bsums_consistent() {
    use quant::q8_k::quantize_ref;
    let mut r = Rng::new(5);
    let x: [f32; 256] = std::array::from_fn(|_| r.normal() as f32);
    let b = quantize_ref(&x);
    for k in 0..16 {
        let s: i32 = b.qs[16 * k..16 * k + 16].iter().map(|&q| q as i32).sum();
        assert_eq!(b.bsums[k] as i32, s);
    }
}

/// Rows at any byte alignment give the same results (GGUF offsets are 32-aligned, but slices
/// of rows handed around by callers need not be).
#[test]
fn misaligned_rows_work() {
    use quant::block::Block;
    let mut r = Rng::new(21);
    let x: Vec<f32> = (0..512).map(|_| r.normal() as f32).collect();
    for ty in [GgmlType::Q8K, GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q4_0, GgmlType::Q5_1] {
        let q = quantize(ty, &x);
        let mut buf = vec![0u8; q.len() + 8];
        let want = dequantize(ty, &q, x.len());
        for off in 1..4 {
            buf[off..off + q.len()].copy_from_slice(&q);
            let got = dequantize(ty, &buf[off..off + q.len()], x.len());
            assert_eq!(got, want, "{ty} at offset {off}");
        }
    }
    // zero-copy view when aligned (heap buffers of this size are, in practice), never a
    // view of a partial block
    let q = quantize(GgmlType::Q8K, &x);
    if (q.as_ptr() as usize).is_multiple_of(4) {
        let blocks = quant::q8_k::BlockQ8K::slice_from_bytes(&q).expect("aligned view");
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[1].as_bytes(), &q[292..]);
    }
    assert!(quant::q8_k::BlockQ8K::slice_from_bytes(&q[4..]).is_none());
    assert!(quant::q8_k::BlockQ8K::slice_from_bytes(&q[..291]).is_none());
    assert!(quant::q8_k::BlockQ8K::read(&q[..291]).is_none());
}

#[test]
fn errors_display_their_context() {
    let e = quantize_row(GgmlType::Q4K, &[0.0; 100], &mut [0u8; 144]).unwrap_err();
    let s = e.to_string();
    assert!(s.contains("q4_K") && s.contains("256") && s.contains("100"), "{s}");
    assert_eq!(
        QuantError::Unsupported(GgmlType::IQ2XS).to_string(),
        "ggml type iq2_xs has no reference implementation"
    );
}
