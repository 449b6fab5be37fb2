//! Every weight type × every available kernel path against `quant`'s scalar reference
//! (`quant::vec_dot` on the same `quant::quantize_row` activations), for matvec and matmul
//! (n = 1..9) over edge shapes: one row, odd row counts, K = one block, K = 4096.

mod common;
use common::{Rng, assert_close, random_blocks};
use cpu_kernels::{
    Gemm, GgmlType, Path, QTensor, SUPPORTED_TYPES, prepare_acts_with, try_get_row, try_matmul_gemm,
    try_matmul_prepared, try_matmul_with,
};

/// Allowed max error relative to the largest output, per weight type.
/// The integer kernels compute exactly the reference's integer block sums; what differs is
/// only the f32 summation order of the per-block terms (lane-parallel here, sequential in the
/// reference), ~1e-7 per term: 1e-5 leaves room for K = 4096 (128-512 terms). Q4_K/Q5_K
/// subtract the min term after summing the whole row instead of per block: still ~1e-6.
/// Float types: f32 FMA chains vs the reference's order, same bound.
fn tolerance(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::Q4K | GgmlType::Q5K => 2e-5,
        _ => 1e-5,
    }
}

fn make_weights(ty: GgmlType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    if !ty.has_quantizer() {
        return random_blocks(ty, rows * k / ty.block_size(), rng);
    }
    let rb = ty.row_bytes(k).unwrap();
    let mut w = vec![0u8; rows * rb];
    for r in 0..rows {
        let row = rng.vec(k);
        quant::quantize_row(ty, &row, &mut w[r * rb..(r + 1) * rb]).unwrap();
    }
    w
}

/// Reference: y[c][r] = quant::vec_dot(w_r, quantize(x_c)).
fn reference(ty: GgmlType, w: &[u8], rows: usize, k: usize, x: &[f32], n: usize) -> Vec<f64> {
    reference_with(ty, w, rows, k, x, n, |at, x, act| quant::quantize_row(at, x, act).unwrap())
}

/// [`reference`] with Q8_0 activations rounded like llama.cpp's x86 quantizer
/// (`cpu_kernels::quantize_q8_0_x86`), which the llama.cpp-order kernels of Q8_0/Q5_0 use (also
/// for the fast products of fewer than 16 columns on AVX-512): it flips a quant now and then
/// against the reference quantizer, which moves an output by ~1e-4 of the largest.
fn reference_x86(ty: GgmlType, w: &[u8], rows: usize, k: usize, x: &[f32], n: usize) -> Option<Vec<f64>> {
    (ty.vec_dot_type() == GgmlType::Q8_0)
        .then(|| reference_with(ty, w, rows, k, x, n, |_, x, act| cpu_kernels::quantize_q8_0_x86(x, act)))
}

/// Checks `y` against the reference, or against [`reference_x86`] where the kernels may have
/// quantized the activations that way.
fn assert_close_ref(ctx: &str, y: &[f32], want: &[f64], want_x86: Option<&[f64]>, tol: f64) {
    let within = |w: &[f64]| {
        let scale = w.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
        y.iter().zip(w).all(|(&g, &w)| (g as f64).is_finite() && ((g as f64 - w).abs() / scale) <= tol)
    };
    match want_x86 {
        Some(x86) if !within(want) && within(x86) => {}
        _ => assert_close(ctx, y, want, tol),
    }
}

fn reference_with(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    k: usize,
    x: &[f32],
    n: usize,
    quantize: impl Fn(GgmlType, &[f32], &mut [u8]),
) -> Vec<f64> {
    let rb = ty.row_bytes(k).unwrap();
    let at = ty.vec_dot_type();
    let ab = at.row_bytes(k).unwrap();
    let mut y = vec![0f64; n * rows];
    for c in 0..n {
        let mut act = vec![0u8; ab];
        quantize(at, &x[c * k..(c + 1) * k], &mut act);
        for r in 0..rows {
            y[c * rows + r] = quant::vec_dot(ty, k, &w[r * rb..(r + 1) * rb], &act).unwrap() as f64;
        }
    }
    y
}

fn shapes(ty: GgmlType) -> Vec<(usize, usize)> {
    let bs = ty.block_size();
    let mut v = vec![(1, bs.max(32)), (7, bs.max(32)), (13, 4096), (3, 1024), (33, 512)];
    if bs == 1 {
        v.push((5, 37)); // float rows of any length exercise the scalar tail
        v.push((2, 1));
    }
    v
}

fn check_type_path(ty: GgmlType, path: Path) {
    let mut rng = Rng::new(ty as u64 * 31 + 7);
    for (rows, k) in shapes(ty) {
        let w = make_weights(ty, rows, k, &mut rng);
        let t = QTensor { ty, data: &w, rows, cols: k };
        // 16+ columns: the batch kernels that decode each weight row once per column block.
        for n in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 16, 21, 67] {
            if k >= 4096 && !matches!(n, 1 | 5 | 9 | 21) || k > 1024 && n == 67 {
                continue; // keep the run short; 1, 5, 9, 21 cover the tiles and tails
            }
            let x = rng.vec(n * k);
            let want = reference(ty, &w, rows, k, &x, n);
            let want_x86 = reference_x86(ty, &w, rows, k, &x, n);
            let mut y = vec![f32::NAN; n * rows];
            try_matmul_with(path, &t, &x, n, &mut y).unwrap();
            assert_close_ref(
                &format!("{} {path:?} rows={rows} k={k} n={n}", ty.name()),
                &y,
                &want,
                want_x86.as_deref(),
                tolerance(ty),
            );
            // The row tiles (prompt products of the signed formats, `Gemm::Tiles`).
            let mut y = vec![f32::NAN; n * rows];
            try_matmul_gemm(path, Gemm::Tiles, &t, &x, n, &mut y).unwrap();
            assert_close_ref(
                &format!("{} {path:?} tiles rows={rows} k={k} n={n}", ty.name()),
                &y,
                &want,
                want_x86.as_deref(),
                tolerance(ty),
            );
        }
    }
}

fn check_type(ty: GgmlType) {
    for path in Path::all_available() {
        check_type_path(ty, path);
    }
}

macro_rules! parity_tests {
    ($($name:ident => $ty:expr),* $(,)?) => {
        $( #[test] fn $name() { check_type($ty); } )*
    };
}

parity_tests! {
    parity_q8_0 => GgmlType::Q8_0,
    parity_q4_0 => GgmlType::Q4_0,
    parity_q4_1 => GgmlType::Q4_1,
    parity_q5_0 => GgmlType::Q5_0,
    parity_q5_1 => GgmlType::Q5_1,
    parity_q4_k => GgmlType::Q4K,
    parity_q5_k => GgmlType::Q5K,
    parity_q6_k => GgmlType::Q6K,
    parity_iq3_xxs => GgmlType::IQ3XXS,
    parity_iq4_nl => GgmlType::IQ4NL,
    parity_f16 => GgmlType::F16,
    parity_bf16 => GgmlType::BF16,
    parity_f32 => GgmlType::F32,
    parity_q2_k => GgmlType::Q2K,
    parity_q3_k => GgmlType::Q3K,
    parity_iq4_xs => GgmlType::IQ4XS,
    parity_iq3_s => GgmlType::IQ3S,
    parity_iq2_xxs => GgmlType::IQ2XXS,
    parity_iq2_xs => GgmlType::IQ2XS,
    parity_iq2_s => GgmlType::IQ2S,
    parity_iq1_s => GgmlType::IQ1S,
    parity_iq1_m => GgmlType::IQ1M,
}

#[test]
fn paths_reported() {
    let paths = Path::all_available();
    eprintln!("available paths: {paths:?}, cpu_features() = {}", cpu_features_name());
    assert!(paths.contains(&Path::Portable));
    assert_eq!(SUPPORTED_TYPES.len(), 22);
}

fn cpu_features_name() -> &'static str {
    cpu_kernels::cpu_features()
}

/// Large matrices go through the rayon split (the small ones above run on one thread).
#[test]
fn parallel_split_matches() {
    let mut rng = Rng::new(99);
    for ty in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4K, GgmlType::Q6K, GgmlType::IQ3XXS, GgmlType::F32] {
        let (rows, k) = (1031, 1024);
        let w = make_weights(ty, rows, k, &mut rng);
        let t = QTensor { ty, data: &w, rows, cols: k };
        // 40 columns: prompt-sized, the row tiles of the GEMM kernels split over the threads.
        for n in [1, 6, 40] {
            let x = rng.vec(n * k);
            let want = reference(ty, &w, rows, k, &x, n);
            let want_x86 = reference_x86(ty, &w, rows, k, &x, n);
            for path in Path::all_available() {
                let mut y = vec![f32::NAN; n * rows];
                try_matmul_with(path, &t, &x, n, &mut y).unwrap();
                assert_close_ref(
                    &format!("{} {path:?} parallel n={n}", ty.name()),
                    &y,
                    &want,
                    want_x86.as_deref(),
                    tolerance(ty),
                );
                let mut y = vec![f32::NAN; n * rows];
                try_matmul_gemm(path, Gemm::Tiles, &t, &x, n, &mut y).unwrap();
                assert_close_ref(
                    &format!("{} {path:?} tiles parallel n={n}", ty.name()),
                    &y,
                    &want,
                    want_x86.as_deref(),
                    tolerance(ty),
                );
            }
        }
    }
}

#[test]
fn get_row_matches_dequantize() {
    let mut rng = Rng::new(5);
    for &ty in SUPPORTED_TYPES {
        let k = 512;
        let w = make_weights(ty, 3, k, &mut rng);
        let t = QTensor { ty, data: &w, rows: 3, cols: k };
        let rb = ty.row_bytes(k).unwrap();
        let mut want = vec![0f32; k];
        quant::dequantize_row(ty, &w[2 * rb..3 * rb], &mut want).unwrap();
        let mut got = vec![0f32; k];
        try_get_row(&t, 2, &mut got).unwrap();
        assert_eq!(got, want, "{}", ty.name());
        assert!(try_get_row(&t, 3, &mut got).is_err());
    }
}

#[test]
fn bad_shapes_are_errors() {
    let w = vec![0u8; 34 * 2];
    let t = QTensor { ty: GgmlType::Q8_0, data: &w, rows: 2, cols: 32 };
    let mut y = vec![0f32; 2];
    assert!(try_matmul_with(Path::Portable, &t, &[0.0; 31], 1, &mut y).is_err());
    assert!(try_matmul_with(Path::Portable, &t, &[0.0; 32], 1, &mut y[..1]).is_err());
    let t = QTensor { ty: GgmlType::Q8_0, data: &w, rows: 3, cols: 32 };
    assert!(try_matmul_with(Path::Portable, &t, &[0.0; 32], 1, &mut [0.0; 3]).is_err());
    let t = QTensor { ty: GgmlType::Q8_0, data: &w, rows: 1, cols: 40 };
    assert!(try_matmul_with(Path::Portable, &t, &[0.0; 40], 1, &mut [0.0; 1]).is_err());
    let t = QTensor { ty: GgmlType::TQ1_0, data: &w, rows: 1, cols: 256 };
    assert!(try_matmul_with(Path::Portable, &t, &[0.0; 256], 1, &mut [0.0; 1]).is_err());
}

/// Activations prepared once serve several matrices of the same type (and are rejected for
/// another type or row length).
#[test]
fn prepared_activations_match() {
    let mut rng = Rng::new(77);
    for &ty in SUPPORTED_TYPES {
        let k = 512;
        let n = 6;
        let x = rng.vec(n * k);
        for path in Path::all_available() {
            let acts = prepare_acts_with(path, ty, &x, n, k).unwrap();
            for rows in [5usize, 40] {
                let w = make_weights(ty, rows, k, &mut rng);
                let t = QTensor { ty, data: &w, rows, cols: k };
                let mut y = vec![f32::NAN; n * rows];
                try_matmul_prepared(&t, &acts, &mut y).unwrap();
                let want = reference(ty, &w, rows, k, &x, n);
                assert_close(&format!("{} {path:?} prepared rows={rows}", ty.name()), &y, &want, tolerance(ty));
            }
            let other = if ty == GgmlType::F32 { GgmlType::F16 } else { GgmlType::F32 };
            let w = make_weights(other, 2, k, &mut rng);
            let t = QTensor { ty: other, data: &w, rows: 2, cols: k };
            assert!(try_matmul_prepared(&t, &acts, &mut [0.0; 12]).is_err());
        }
    }
}

/// Where `Gemm::Tiles` also changes decode-sized products (`Gemm::tiles_apply(ty, 1)`), a
/// column computed alone or in a window of a few gets the same bits as inside a prompt-sized
/// product (the same tiles, built in registers instead of a scratch), so speculative windows
/// and prompts equal one-token steps in that mode. Rows 37 and 1031: partial tiles at the end,
/// and the parallel split.
#[test]
fn small_tiles_equal_prompt_tiles_bitwise() {
    let path = cpu_kernels::best_path();
    let mut rng = Rng::new(17);
    let mut checked = 0;
    for &ty in SUPPORTED_TYPES {
        if !Gemm::tiles_apply(ty, 1) {
            continue;
        }
        for (rows, k) in [(37usize, 576usize), (1031, 1536)] {
            let w = make_weights(ty, rows, k, &mut rng);
            let t = QTensor { ty, data: &w, rows, cols: k };
            let n = 21;
            let x = rng.vec(n * k);
            let mut prompt = vec![f32::NAN; n * rows];
            try_matmul_gemm(path, Gemm::Tiles, &t, &x, n, &mut prompt).unwrap();
            for (c0, width) in [(0usize, 1usize), (3, 1), (5, 5), (10, 9)] {
                let mut y = vec![f32::NAN; width * rows];
                try_matmul_gemm(path, Gemm::Tiles, &t, &x[c0 * k..(c0 + width) * k], width, &mut y).unwrap();
                for (i, (a, b)) in y.iter().zip(&prompt[c0 * rows..(c0 + width) * rows]).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{} rows={rows} k={k} columns {c0}+{width}: output {i}: {a} vs {b}",
                        ty.name()
                    );
                }
            }
            checked += 1;
        }
    }
    if cpu_kernels::Gemm::tiles_apply(GgmlType::Q4_1, 1) {
        assert!(checked > 0);
    } else {
        eprintln!("no type has decode-sized tiles on this CPU ({path:?}): nothing to compare");
    }
}

/// Activations prepared once as an entry point prepares them (`prepare_acts_as`) give that
/// entry point's products bit for bit, for every supported type, 1 to 8 columns and several
/// matrices: the CPU pool's experts share one quantized activation without changing a bit.
#[test]
fn activations_prepared_as_an_entry_point_give_its_bits() {
    use cpu_kernels::{ActsFor, prepare_acts_as, try_matmul, try_matmul_ggml};
    let mut rng = Rng::new(91);
    for &ty in SUPPORTED_TYPES {
        let k = 512;
        for n in [1usize, 2, 3, 8] {
            let x = rng.vec(n * k);
            for entry in [ActsFor::Fast, ActsFor::Ggml] {
                let acts = prepare_acts_as(entry, ty, &x, n, k).unwrap();
                for rows in [7usize, 64] {
                    let w = make_weights(ty, rows, k, &mut rng);
                    let t = QTensor { ty, data: &w, rows, cols: k };
                    let (mut got, mut want) = (vec![f32::NAN; n * rows], vec![f32::NAN; n * rows]);
                    try_matmul_prepared(&t, &acts, &mut got).unwrap();
                    match entry {
                        ActsFor::Fast => try_matmul(&t, &x, n, &mut want).unwrap(),
                        ActsFor::Ggml => try_matmul_ggml(&t, &x, n, &mut want).unwrap(),
                    }
                    let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                    assert_eq!(differ, 0, "{} {entry:?} n={n} rows={rows}: {differ} outputs differ", ty.name());
                }
            }
        }
    }
}
