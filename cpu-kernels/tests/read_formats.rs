//! The weight types `quant` reads but does not write (Q2_K, Q3_K, IQ4_XS, IQ3_S, IQ2_XXS/XS/S,
//! IQ1_S/M), on every path (`fam_lowbit` on AVX2 / AVX-512), against dequantize-then-dot:
//! * with the same Q8_K activations dequantized, the f64 dot must agree within 2e-5 of
//!   Σ|w·a| (the block dots are integer; only f32 scale products and sums round);
//! * with the f32 activations themselves, within Σ|w|·amax/254 (+1%): Q8_K's rounding moves
//!   each activation by at most half a step, 1/254 of its block's largest |x|.

mod common;
use common::{Rng, random_blocks};
use cpu_kernels::{GgmlType, Path, QTensor, SUPPORTED_TYPES, try_matmul_with};

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

fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    quant::dequantize_row(ty, bytes, &mut out).unwrap();
    out
}

#[test]
fn read_only_types_are_supported() {
    for ty in &READ_ONLY {
        assert!(SUPPORTED_TYPES.contains(ty) && ty.has_reference(), "{ty}");
    }
}

#[test]
fn dots_match_dequantized_dots() {
    let mut rng = Rng::new(36);
    for ty in READ_ONLY {
        for (rows, k) in [(1usize, 256usize), (7, 1024), (33, 2048)] {
            let w = random_blocks(ty, rows * k / 256, &mut rng);
            let wd = dequantize(ty, &w, rows * k);
            let t = QTensor::new(ty, &w, rows, k).unwrap();
            for n in [1usize, 3, 8] {
                let x = rng.vec(n * k);
                for path in Path::all_available() {
                    let mut y = vec![f32::NAN; n * rows];
                    try_matmul_with(path, &t, &x, n, &mut y).unwrap();
                    for c in 0..n {
                        let xc = &x[c * k..(c + 1) * k];
                        let mut q = vec![0u8; GgmlType::Q8K.row_bytes(k).unwrap()];
                        quant::quantize_row(GgmlType::Q8K, xc, &mut q).unwrap();
                        let a = dequantize(GgmlType::Q8K, &q, k);
                        let amax: Vec<f64> = xc
                            .chunks_exact(256)
                            .map(|b| b.iter().fold(0f64, |m, &v| m.max((v as f64).abs())))
                            .collect();
                        for r in 0..rows {
                            let wr = &wd[r * k..(r + 1) * k];
                            let got = y[c * rows + r] as f64;
                            let dot = |v: &[f32]| wr.iter().zip(v).map(|(&p, &q)| p as f64 * q as f64).sum::<f64>();
                            let mag =
                                |v: &[f32]| wr.iter().zip(v).map(|(&p, &q)| (p as f64 * q as f64).abs()).sum::<f64>();
                            let ctx = format!("{ty} {path:?} rows={rows} k={k} n={n} col {c} row {r}");
                            assert!((got - dot(&a)).abs() <= 2e-5 * mag(&a) + 1e-30, "{ctx}: {got} vs {}", dot(&a));
                            let step: f64 =
                                wr.iter().enumerate().map(|(i, &p)| (p as f64).abs() * amax[i / 256] / 254.0).sum();
                            let tol = 1.01 * step + 2e-5 * mag(&a) + 1e-30;
                            assert!((got - dot(xc)).abs() <= tol, "{ctx}: {got} vs f32 {} (tol {tol})", dot(xc));
                        }
                    }
                }
            }
        }
    }
}
