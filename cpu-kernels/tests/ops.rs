//! Element-wise ops against plain f64 scalar formulas.

mod common;
use common::{Rng, assert_close};
use cpu_kernels::*;

fn f64v(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// f32 math (exp/tanh/powf) vs f64: a few ulp on values of order 1.
const OPS_TOL: f64 = 2e-6;

#[test]
fn rms_norm_matches_f64() {
    let mut rng = Rng::new(1);
    for n in [1usize, 7, 640, 2048, 4099] {
        let x = rng.vec(n);
        let w = rng.vec(n);
        let eps = 1e-6f32;
        let ms: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        let want: Vec<f64> = (0..n).map(|i| x[i] as f64 * inv * w[i] as f64).collect();
        let mut out = vec![0f32; n];
        rms_norm(&x, &w, eps, &mut out);
        assert_close(&format!("rms_norm n={n}"), &out, &want, OPS_TOL);
        let mut y = x.clone();
        rms_norm_inplace(&mut y, eps);
        let want: Vec<f64> = (0..n).map(|i| x[i] as f64 * inv).collect();
        assert_close(&format!("rms_norm_inplace n={n}"), &y, &want, OPS_TOL);
    }
}

/// f64 rope per ggml: theta_i = pos * freq_scale * base^(-2i/rot_dim).
#[allow(clippy::too_many_arguments)]
fn rope_ref(
    x: &[f32],
    n_heads: usize,
    hd: usize,
    rot: usize,
    pos: usize,
    base: f64,
    scale: f64,
    neox: bool,
) -> Vec<f64> {
    let mut y = f64v(x);
    for h in 0..n_heads {
        for i in 0..rot / 2 {
            let th = pos as f64 * scale * base.powf(-2.0 * i as f64 / rot as f64);
            let (a, b) = if neox { (h * hd + i, h * hd + i + rot / 2) } else { (h * hd + 2 * i, h * hd + 2 * i + 1) };
            let (xa, xb) = (x[a] as f64, x[b] as f64);
            y[a] = xa * th.cos() - xb * th.sin();
            y[b] = xa * th.sin() + xb * th.cos();
        }
    }
    y
}

#[test]
fn rope_matches_f64() {
    let mut rng = Rng::new(2);
    for (nh, hd, rot) in [(4usize, 256usize, 256usize), (3, 64, 32), (1, 128, 128), (2, 6, 4)] {
        for pos in [0usize, 1, 17, 1000, 32000] {
            for (base, scale) in [(10000.0f32, 1.0f32), (1_000_000.0, 0.125)] {
                let x = rng.vec(nh * hd);
                let mut a = x.clone();
                rope_neox(&mut a, nh, hd, rot, pos, base, scale);
                // Large angles: f32 output of cos/sin of an angle ~3e4 carries ~1e-7 relative
                // angle error per unit, i.e. absolute error ~pos·1e-7 / ... we compute the angle
                // in f64, so the only error is the final f32 rounding.
                let tol = 2e-6;
                assert_close(
                    &format!("neox {nh}x{hd} rot {rot} pos {pos}"),
                    &a,
                    &rope_ref(&x, nh, hd, rot, pos, base as f64, scale as f64, true),
                    tol,
                );
                let mut b = x.clone();
                rope_norm(&mut b, nh, hd, rot, pos, base, scale);
                assert_close(
                    &format!("norm {nh}x{hd} rot {rot} pos {pos}"),
                    &b,
                    &rope_ref(&x, nh, hd, rot, pos, base as f64, scale as f64, false),
                    tol,
                );
                // Dimensions past rot_dim are untouched.
                for h in 0..nh {
                    assert_eq!(&a[h * hd + rot..(h + 1) * hd], &x[h * hd + rot..(h + 1) * hd]);
                }
            }
        }
    }
}

#[test]
fn softmax_matches_f64() {
    let mut rng = Rng::new(3);
    for n in [1usize, 5, 300, 4096] {
        let x: Vec<f32> = rng.vec(n).iter().map(|v| v * 20.0).collect();
        let m = x.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
        let e: Vec<f64> = x.iter().map(|&v| (v as f64 - m).exp()).collect();
        let s: f64 = e.iter().sum();
        let want: Vec<f64> = e.iter().map(|v| v / s).collect();
        let mut y = x.clone();
        softmax(&mut y);
        assert_close(&format!("softmax n={n}"), &y, &want, OPS_TOL);
    }
    let mut all_masked = vec![f32::NEG_INFINITY; 4];
    softmax(&mut all_masked);
    assert_eq!(all_masked, vec![0.0; 4]);
}

#[test]
fn activations_match_f64() {
    let xs: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.01).collect();
    let silu_ref: Vec<f64> = xs
        .iter()
        .map(|&x| {
            let x = x as f64;
            x / (1.0 + (-x).exp())
        })
        .collect();
    let gelu_ref: Vec<f64> = xs
        .iter()
        .map(|&x| {
            let x = x as f64;
            0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x)).tanh())
        })
        .collect();
    let s: Vec<f32> = xs.iter().map(|&x| silu(x)).collect();
    let g: Vec<f32> = xs.iter().map(|&x| gelu_tanh(x)).collect();
    assert_close("silu", &s, &silu_ref, OPS_TOL);
    assert_close("gelu_tanh", &g, &gelu_ref, OPS_TOL);
    let up: Vec<f32> = xs.iter().map(|&x| 1.5 - x * 0.3).collect();
    let mut o = vec![0f32; xs.len()];
    swiglu(&xs, &up, &mut o);
    let want: Vec<f64> = silu_ref.iter().zip(&up).map(|(s, &u)| s * u as f64).collect();
    assert_close("swiglu", &o, &want, OPS_TOL);
    geglu(&xs, &up, &mut o);
    let want: Vec<f64> = gelu_ref.iter().zip(&up).map(|(g, &u)| g * u as f64).collect();
    assert_close("geglu", &o, &want, OPS_TOL);
}
