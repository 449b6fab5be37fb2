//! Element-wise ops and attention against plain f64 scalar formulas.

mod common;
use common::{assert_close, Rng};
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
fn rope_ref(x: &[f32], n_heads: usize, hd: usize, rot: usize, pos: usize, base: f64, scale: f64, neox: bool) -> Vec<f64> {
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
                assert_close(&format!("neox {nh}x{hd} rot {rot} pos {pos}"), &a, &rope_ref(&x, nh, hd, rot, pos, base as f64, scale as f64, true), tol);
                let mut b = x.clone();
                rope_norm(&mut b, nh, hd, rot, pos, base, scale);
                assert_close(&format!("norm {nh}x{hd} rot {rot} pos {pos}"), &b, &rope_ref(&x, nh, hd, rot, pos, base as f64, scale as f64, false), tol);
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
    let silu_ref: Vec<f64> = xs.iter().map(|&x| { let x = x as f64; x / (1.0 + (-x).exp()) }).collect();
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

/// f64 attention over f64 copies of whatever the cache stores.
fn attn_ref(q: &[f32], k: &[Vec<f64>], v: &[Vec<f64>], scale: f64, cap: Option<f64>, mask: Option<&[f32]>) -> Vec<f64> {
    let mut s: Vec<f64> = k.iter().map(|kr| kr.iter().zip(q).map(|(a, &b)| a * b as f64).sum::<f64>() * scale).collect();
    if let Some(c) = cap {
        s.iter_mut().for_each(|x| *x = c * (*x / c).tanh());
    }
    if let Some(m) = mask {
        s.iter_mut().zip(m).for_each(|(x, &b)| *x += b as f64);
    }
    let mx = s.iter().cloned().fold(f64::MIN, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
    let z: f64 = e.iter().sum();
    let mut out = vec![0f64; q.len()];
    for (p, w) in e.iter().enumerate() {
        for (o, x) in out.iter_mut().zip(&v[p]) {
            *o += w / z * x;
        }
    }
    out
}

#[test]
fn attention_all_storage_types() {
    let mut rng = Rng::new(4);
    for (hd, n_kv, stride) in [(64usize, 1usize, 64usize), (256, 37, 512), (128, 300, 128), (8, 5, 24)] {
        let q = rng.vec(hd);
        let kf = rng.vec(n_kv * stride);
        let vf = rng.vec(n_kv * stride);
        let rows = |d: &[f32]| -> Vec<Vec<f64>> { (0..n_kv).map(|p| f64v(&d[p * stride..p * stride + hd])).collect() };
        let mask: Vec<f32> = (0..n_kv).map(|p| if p % 7 == 3 { f32::NEG_INFINITY } else { 0.0 }).collect();
        for (cap, m) in [(None, None), (Some(50.0f32), Some(&mask[..]))] {
            let params = AttnParams { scale: 1.0 / (hd as f32).sqrt(), softcap: cap, mask: m };
            let mut scores = Vec::new();
            let mut out = vec![0f32; hd];
            let ctx = format!("hd={hd} n_kv={n_kv} cap={cap:?}");
            // f32 cache
            attention_one(&q, &KvRows::F32 { data: &kf, stride }, &KvRows::F32 { data: &vf, stride }, n_kv, &params, &mut scores, &mut out).unwrap();
            let want = attn_ref(&q, &rows(&kf), &rows(&vf), params.scale as f64, cap.map(|c| c as f64), m);
            assert_close(&format!("f32 {ctx}"), &out, &want, 1e-5);
            // f16 cache: the reference reads the same f16 values
            let kh: Vec<u16> = kf.iter().map(|&x| quant::f32_to_f16(x)).collect();
            let vh: Vec<u16> = vf.iter().map(|&x| quant::f32_to_f16(x)).collect();
            let back = |h: &[u16]| -> Vec<f32> { h.iter().map(|&x| quant::f16_to_f32(x)).collect() };
            attention_one(&q, &KvRows::F16 { data: &kh, stride }, &KvRows::F16 { data: &vh, stride }, n_kv, &params, &mut scores, &mut out).unwrap();
            let want = attn_ref(&q, &rows(&back(&kh)), &rows(&back(&vh)), params.scale as f64, cap.map(|c| c as f64), m);
            assert_close(&format!("f16 {ctx}"), &out, &want, 1e-5);
            // int8 cache with a per-row scale
            let quant_rows = |d: &[f32]| -> (Vec<i8>, Vec<f32>) {
                let mut qv = vec![0i8; d.len()];
                let mut sc = vec![0f32; n_kv];
                for p in 0..n_kv {
                    let r = &d[p * stride..p * stride + hd];
                    let amax = r.iter().fold(0f32, |m, v| m.max(v.abs()));
                    sc[p] = amax / 127.0;
                    for i in 0..hd {
                        qv[p * stride + i] = if amax > 0.0 { (r[i] / sc[p]).round() as i8 } else { 0 };
                    }
                }
                (qv, sc)
            };
            let (kq, ks) = quant_rows(&kf);
            let (vq, vs) = quant_rows(&vf);
            let deq = |qv: &[i8], sc: &[f32]| -> Vec<Vec<f64>> {
                (0..n_kv).map(|p| (0..hd).map(|i| qv[p * stride + i] as f64 * sc[p] as f64).collect()).collect()
            };
            attention_one(
                &q,
                &KvRows::I8 { data: &kq, scales: &ks, stride, scale_stride: 1 },
                &KvRows::I8 { data: &vq, scales: &vs, stride, scale_stride: 1 },
                n_kv,
                &params,
                &mut scores,
                &mut out,
            )
            .unwrap();
            let want = attn_ref(&q, &deq(&kq, &ks), &deq(&vq, &vs), params.scale as f64, cap.map(|c| c as f64), m);
            assert_close(&format!("i8 {ctx}"), &out, &want, 1e-5);
            let psum: f32 = scores.iter().sum();
            assert!((psum - 1.0).abs() < 1e-5, "probabilities sum to {psum}");
        }
    }
    // Bad shapes are errors, not panics.
    let mut scores = Vec::new();
    let mut out = vec![0f32; 4];
    let k = [0f32; 7];
    let r = attention_one(&[0.0; 4], &KvRows::F32 { data: &k, stride: 4 }, &KvRows::F32 { data: &k, stride: 4 }, 2, &AttnParams { scale: 1.0, softcap: None, mask: None }, &mut scores, &mut out);
    assert!(r.is_err());
}

#[test]
fn attention_causal_matches_f64() {
    let mut rng = Rng::new(9);
    for (hd, n_q, pos0, window, stride) in [(64usize, 20usize, 0usize, None, 64usize), (256, 37, 5, Some(16usize), 256), (32, 9, 100, Some(1000), 96), (12, 11, 3, None, 12)] {
        let total = pos0 + n_q;
        let q_stride = hd + 3;
        let q = rng.vec(n_q * q_stride);
        let kf = rng.vec(total * stride);
        let vf = rng.vec(total * stride);
        let kh: Vec<u16> = kf.iter().map(|&x| quant::f32_to_f16(x)).collect();
        let vh: Vec<u16> = vf.iter().map(|&x| quant::f32_to_f16(x)).collect();
        let back = |h: &[u16]| -> Vec<f32> { h.iter().map(|&x| quant::f16_to_f32(x)).collect() };
        let (kb, vb) = (back(&kh), back(&vh));
        let params = AttnParams { scale: 0.125, softcap: Some(30.0), mask: None };
        let out_stride = hd + 1;
        let mut out = vec![f32::NAN; n_q * out_stride];
        attention_causal(&q, q_stride, hd, n_q, pos0, &KvRows::F16 { data: &kh, stride }, &KvRows::F16 { data: &vh, stride }, &params, window, &mut out, out_stride).unwrap();
        for i in 0..n_q {
            let pos = pos0 + i;
            let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let rows = |d: &[f32]| -> Vec<Vec<f64>> { (lo..=pos).map(|p| f64v(&d[p * stride..p * stride + hd])).collect() };
            let want = attn_ref(&q[i * q_stride..i * q_stride + hd], &rows(&kb), &rows(&vb), 0.125, Some(30.0), None);
            assert_close(&format!("causal hd={hd} i={i} window={window:?}"), &out[i * out_stride..i * out_stride + hd], &want, 1e-5);
        }
    }
}

#[test]
fn attention_shared_kv_matches_f64() {
    let mut rng = Rng::new(10);
    for (hd, n_q, n_kv, window) in [(256usize, 4usize, 300usize, None), (64, 11, 40, Some(7usize)), (12, 3, 5, None), (16, 2, 1, None)] {
        let q = rng.vec(n_q * hd);
        let kf = rng.vec(n_kv * hd);
        let vf = rng.vec(n_kv * hd);
        let (kq, ks): (Vec<i8>, Vec<f32>) = {
            let mut qv = vec![0i8; kf.len()];
            let mut sc = vec![0f32; n_kv];
            for p in 0..n_kv {
                let r = &kf[p * hd..(p + 1) * hd];
                sc[p] = r.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                for i in 0..hd {
                    qv[p * hd + i] = (r[i] / sc[p]).round() as i8;
                }
            }
            (qv, sc)
        };
        let params = AttnParams { scale: 0.2, softcap: None, mask: None };
        let mut out = vec![f32::NAN; n_q * hd];
        let kr = KvRows::I8 { data: &kq, scales: &ks, stride: hd, scale_stride: 1 };
        attention_shared_kv(&q, hd, hd, n_q, n_kv, &kr, &KvRows::F32 { data: &vf, stride: hd }, &params, window, &mut out, hd).unwrap();
        let lo = window.map_or(0, |w| n_kv.saturating_sub(w));
        let krows: Vec<Vec<f64>> = (lo..n_kv).map(|p| (0..hd).map(|i| kq[p * hd + i] as f64 * ks[p] as f64).collect()).collect();
        let vrows: Vec<Vec<f64>> = (lo..n_kv).map(|p| f64v(&vf[p * hd..(p + 1) * hd])).collect();
        for h in 0..n_q {
            let want = attn_ref(&q[h * hd..(h + 1) * hd], &krows, &vrows, 0.2, None, None);
            assert_close(&format!("shared_kv hd={hd} head={h}"), &out[h * hd..(h + 1) * hd], &want, 1e-5);
        }
    }
}
