//! `matmul_ggml` (llama.cpp's x86 summation order) against a plain f64 reference: dequantized
//! weights times the dequantized activations each kernel pairs them with. The order differs
//! from f64 only in rounding, so the results agree to float precision relative to Σ|w·x|.
//! (Bit-exactness against llama.cpp itself is checked end to end in tests/models/models_gemma3.rs.)

use cpu_kernels::{QTensor, matmul_ggml};
use quant::GgmlType;

/// xorshift, so the test needs no dependencies.
fn rng(seed: &mut u64) -> f32 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

#[test]
fn ggml_order_matches_f64_reference() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for ty in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4K, GgmlType::Q6K] {
        let (rows, cols) = (16, 512);
        let rb = ty.row_bytes(cols).unwrap();
        let mut w = vec![0u8; rows * rb];
        let mut wf = vec![0f32; rows * cols];
        for r in 0..rows {
            let src: Vec<f32> = (0..cols).map(|_| rng(&mut seed)).collect();
            quant::quantize_row(ty, &src, &mut w[r * rb..(r + 1) * rb]).unwrap();
            quant::dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut wf[r * cols..(r + 1) * cols]).unwrap();
        }
        let t = QTensor::new(ty, &w, rows, cols).unwrap();
        for n in [1usize, 3, 4, 6] {
            // Activations with Gemma-like outliers.
            let x: Vec<f32> = (0..n * cols).map(|i| rng(&mut seed) * if i % 97 == 0 { 300.0 } else { 2.0 }).collect();
            let mut y = vec![0f32; n * rows];
            matmul_ggml(&t, &x, n, &mut y);
            let aty = ty.vec_dot_type();
            let ab = aty.row_bytes(cols).unwrap();
            for c in 0..n {
                let mut aq = vec![0u8; ab];
                quant::quantize_row(aty, &x[c * cols..(c + 1) * cols], &mut aq).unwrap();
                let mut xf = vec![0f32; cols];
                quant::dequantize_row(aty, &aq, &mut xf).unwrap();
                for r in 0..rows {
                    let wr = &wf[r * cols..(r + 1) * cols];
                    let want: f64 = wr.iter().zip(&xf).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let scale: f64 = wr.iter().zip(&xf).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                    let got = y[c * rows + r] as f64;
                    // 1e-3: the x86 Q8_0 activation rounding may differ from the reference
                    // quantizer in a few quants; everything else is float rounding (~1e-6).
                    assert!((got - want).abs() <= 1e-3 * scale, "{ty:?} n={n} col {c} row {r}: {got} vs {want}");
                }
            }
        }
    }
}

/// Every available path (portable scalar, AVX2, AVX-512) of `matmul_ggml` gives the very same
/// bits as the scalar kernels that define the order: random weights/activations (with outliers,
/// an all-zero column, a huge column), edge shapes (1-3 rows, odd row counts, one block, odd
/// block counts) and every batch size that takes the exact path.
#[test]
fn ggml_order_paths_bit_identical() {
    use cpu_kernels::{Path, try_matmul_ggml_with};
    let paths = Path::all_available();
    eprintln!("paths: {paths:?}");
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for ty in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4K, GgmlType::Q6K] {
        let colset: &[usize] = if ty.block_size() == 32 { &[32, 96, 640, 2048] } else { &[256, 768, 2048] };
        for &cols in colset {
            for rows in [1usize, 2, 3, 5, 8, 13, 33] {
                let rb = ty.row_bytes(cols).unwrap();
                let mut w = vec![0u8; rows * rb];
                for r in 0..rows {
                    let amp = if r % 3 == 1 { 0.01 } else { 1.0 };
                    let src: Vec<f32> = (0..cols).map(|_| rng(&mut seed) * amp).collect();
                    quant::quantize_row(ty, &src, &mut w[r * rb..(r + 1) * rb]).unwrap();
                }
                let t = QTensor::new(ty, &w, rows, cols).unwrap();
                let ns: &[usize] = if ty.block_size() == 32 {
                    &[1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 21, 77]
                } else {
                    &[1, 2, 3, 4, 5, 6, 7]
                };
                for &n in ns {
                    let x: Vec<f32> = (0..n * cols)
                        .map(|i| {
                            let c = i / cols;
                            if c == 1 {
                                0.0
                            } else if c == 2 {
                                rng(&mut seed) * 3e4
                            } else {
                                rng(&mut seed) * if i % 89 == 0 { 400.0 } else { 3.0 }
                            }
                        })
                        .collect();
                    let mut want = vec![0f32; n * rows];
                    try_matmul_ggml_with(Path::Portable, &t, &x, n, &mut want).unwrap();
                    for &p in &paths {
                        let mut got = vec![f32::NAN; n * rows];
                        try_matmul_ggml_with(p, &t, &x, n, &mut got).unwrap();
                        for i in 0..n * rows {
                            assert_eq!(
                                got[i].to_bits(),
                                want[i].to_bits(),
                                "{ty:?} {p:?} rows {rows} cols {cols} n {n} (col {}, row {}): {} vs scalar {}",
                                i / rows,
                                i % rows,
                                got[i],
                                want[i]
                            );
                        }
                    }
                }
            }
        }
    }
}

/// `geglu_ggml` (table lookup) equals the per-element definition (f16-rounded gate, GELU with
/// `tanh`, f16-rounded result) bit for bit, over every f16 gate value and random ones.
#[test]
fn geglu_ggml_table_matches_definition() {
    fn def(g: f32, u: f32) -> f32 {
        const S: f32 = 0.797_884_6;
        const A: f32 = 0.044715;
        if g <= -10.0 {
            0.0
        } else if g >= 10.0 {
            g * u
        } else {
            let h = quant::f16_to_f32(quant::f32_to_f16(g));
            let ge = 0.5 * h * (1.0 + (S * h * (A * h).mul_add(h, 1.0)).tanh());
            quant::f16_to_f32(quant::f32_to_f16(ge)) * u
        }
    }
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut gate: Vec<f32> = (0..=u16::MAX).map(quant::f16_to_f32).filter(|v| !v.is_nan()).collect();
    gate.extend((0..100_000).map(|_| rng(&mut seed) * 12.0));
    let up: Vec<f32> = gate.iter().map(|_| rng(&mut seed) * 4.0).collect();
    let mut out = vec![0f32; gate.len()];
    cpu_kernels::geglu_ggml(&gate, &up, &mut out);
    for i in 0..gate.len() {
        assert_eq!(out[i].to_bits(), def(gate[i], up[i]).to_bits(), "gate {} up {}", gate[i], up[i]);
    }
}

/// `rope_neox_ggml` with precomputed angles (`rope_cs_ggml` + `rope_neox_ggml_cs`, the forward
/// pass's form) equals the definition: f32 angle recurrence, `fma(a, c, -(b s))`, `fma(a, s, b c)`.
#[test]
fn rope_neox_ggml_matches_definition() {
    let mut seed = 0x0bad_cafe_f00d_1234u64;
    for (nh, hd, rot) in [(4usize, 256usize, 256usize), (1, 64, 32), (3, 128, 128)] {
        for pos in [0usize, 1, 7, 511, 4095, 31999] {
            for (base, scale) in [(10000f32, 1f32), (1e6, 0.25)] {
                let x: Vec<f32> = (0..nh * hd).map(|_| rng(&mut seed) * 50.0).collect();
                let mut want = x.clone();
                let half = rot / 2;
                let ts = base.powf(-2.0 / rot as f32);
                for h in want.chunks_exact_mut(hd) {
                    let mut theta = pos as f32;
                    for i in 0..half {
                        let t = scale * theta;
                        let (c, s) = (t.cos(), t.sin());
                        let (a, b) = (h[i], h[i + half]);
                        h[i] = a.mul_add(c, -(b * s));
                        h[i + half] = a.mul_add(s, b * c);
                        theta *= ts;
                    }
                }
                let mut got = x.clone();
                cpu_kernels::rope_neox_ggml(&mut got, nh, hd, rot, pos, base, scale);
                let mut cs = Vec::new();
                cpu_kernels::rope_cs_ggml(rot, pos, base, scale, &mut cs);
                let mut got2 = x.clone();
                cpu_kernels::rope_neox_ggml_cs(&mut got2, nh, hd, &cs);
                for i in 0..x.len() {
                    assert_eq!(got[i].to_bits(), want[i].to_bits(), "rope nh {nh} hd {hd} pos {pos} [{i}]");
                    assert_eq!(got2[i].to_bits(), want[i].to_bits(), "rope_cs nh {nh} hd {hd} pos {pos} [{i}]");
                }
            }
        }
    }
}

/// `try_matmul_ggml_multi` and `try_matmul_multi` (several matrices, one parallel region)
/// equal separate `try_matmul_ggml` / `try_matmul` calls bit for bit, for mixed weight types
/// sharing the activations and for batches on both sides of 8.
#[test]
fn multi_matches_separate_calls() {
    use cpu_kernels::{try_matmul, try_matmul_ggml, try_matmul_ggml_multi, try_matmul_multi};
    type Multi = fn(&[QTensor], &[f32], usize, &mut [&mut [f32]]) -> Result<(), cpu_kernels::KernelError>;
    type Single = fn(&QTensor, &[f32], usize, &mut [f32]) -> Result<(), cpu_kernels::KernelError>;
    let pairs: [(&str, Multi, Single); 2] =
        [("ggml", try_matmul_ggml_multi, try_matmul_ggml), ("fast", try_matmul_multi, try_matmul)];
    let mut seed = 0x5851_f42d_4c95_7f2du64;
    for (cols, specs) in [
        (640usize, vec![(GgmlType::Q5_0, 1024usize), (GgmlType::Q5_0, 256), (GgmlType::Q8_0, 256)]),
        (512, vec![(GgmlType::Q4K, 300), (GgmlType::Q6K, 77), (GgmlType::Q8_0, 5)]),
        (576, vec![(GgmlType::Q4_1, 576), (GgmlType::Q4_1, 192), (GgmlType::Q4_1, 192)]),
    ] {
        let data: Vec<Vec<u8>> = specs
            .iter()
            .map(|&(ty, rows)| {
                let rb = ty.row_bytes(cols).unwrap();
                let mut w = vec![0u8; rows * rb];
                for r in 0..rows {
                    let src: Vec<f32> = (0..cols).map(|_| rng(&mut seed)).collect();
                    quant::quantize_row(ty, &src, &mut w[r * rb..(r + 1) * rb]).unwrap();
                }
                w
            })
            .collect();
        let ts: Vec<QTensor> =
            specs.iter().zip(&data).map(|(&(ty, rows), w)| QTensor::new(ty, w, rows, cols).unwrap()).collect();
        for (name, multi, single) in pairs {
            for n in [1usize, 3, 9, 20] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng(&mut seed) * 4.0).collect();
                let mut outs: Vec<Vec<f32>> = ts.iter().map(|t| vec![f32::NAN; n * t.rows]).collect();
                let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
                multi(&ts, &x, n, &mut refs).unwrap();
                for (t, got) in ts.iter().zip(&outs) {
                    let mut want = vec![0f32; n * t.rows];
                    single(t, &x, n, &mut want).unwrap();
                    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{name} {:?} n {n}", t.ty);
                }
            }
        }
    }
}
