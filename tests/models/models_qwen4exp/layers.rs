//! Each qwen4exp layer type alone, on random weights, against a plain scalar f64 reference
//! written here from the formulas in `testdata/reference/tiny-qwen4exp/README.md` (nothing is
//! shared with the engine code), plus the batching invariants: chunked GDN prefill equals the
//! token-by-token recurrence, a multi-token pass equals single-token passes, the GR fused read
//! of up to 8 tokens is bit-identical to single-token reads.
//!
//! Tolerance: the engine computes in f32, the reference in f64 from the same f32 weights; on
//! these sizes (≤ 256-long dots, O(1) values) f32 rounding gives ~1e-6 relative, so 1e-4
//! relative to the output's largest magnitude (`TOL_REL`) catches any formula error (a wrong
//! gate, scale or index changes outputs by O(1)).

use strata::cpu::prelude::*;
use strata::model::Mat;
use strata::model::qwen4exp::{Gdn, GdnMode, HyperConn};

pub(super) const TOL_REL: f64 = 1e-4;

// ------------------------------------------------------------------------------ test helpers

pub(super) use strata::rng::SplitMix64;

/// Gammas around 1: `1 + 0.2 · U[-1, 1)`.
pub(super) fn gamma(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| 1.0 + 0.2 * rng.symmetric()).collect()
}

/// A random F32 matrix plus its values (row-major `[rows][cols]`) for the reference.
pub(super) fn rand_mat(rng: &mut SplitMix64, rows: usize, cols: usize) -> (Mat, Vec<f32>) {
    let w = rng.symmetric_vec(rows * cols, 1.0 / (cols as f32).sqrt() * 1.7);
    (Mat::from_f32(rows, cols, &w).unwrap(), w)
}

pub(super) fn mv(w: &[f32], rows: usize, cols: usize, x: &[f64]) -> Vec<f64> {
    (0..rows).map(|r| (0..cols).map(|c| w[r * cols + c] as f64 * x[c]).sum()).collect()
}

pub(super) fn rms64(x: &[f64], g: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(g).map(|(v, &g)| v * s * g as f64).collect()
}

pub(super) fn sig(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub(super) fn silu64(x: f64) -> f64 {
    x * sig(x)
}

pub(super) fn to64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// max |got − want| ≤ TOL_REL · max |want|, reporting the first bad index.
pub(super) fn assert_close(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    let mut worst = (0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{what}: non-finite at {i}");
        let d = (g as f64 - w).abs();
        if d > worst.0 {
            worst = (d, i);
        }
    }
    assert!(
        worst.0 <= TOL_REL * scale,
        "{what}: max |diff| {:.3e} at {} (got {}, want {}) > {TOL_REL} x {scale:.3e}",
        worst.0,
        worst.1,
        got[worst.1],
        want[worst.1]
    );
}

// ------------------------------------------------------------------------ hyper-connections

struct HcRef {
    hc: usize,
    e: usize,
    lr: usize,
    norm: Vec<f32>,
    down: Vec<f32>,
    up: Vec<f32>,
    inject: Vec<f32>,
}

impl HcRef {
    /// (x [E], inj [hc]) for one token's streams `r [hc][E]`.
    fn mix(&self, r: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>) {
        let (hc, e) = (self.hc, self.e);
        let mut f = Vec::new();
        for c in 0..hc {
            f.extend(rms64(&r[c * e..(c + 1) * e], &self.norm[c * e..(c + 1) * e], eps));
        }
        let a: Vec<f64> = mv(&self.down, self.lr, hc * e, &f).iter().map(|v| silu64(v / hc as f64)).collect();
        let g = mv(&self.up, hc * e, self.lr, &a);
        let x = (0..e).map(|i| (0..hc).map(|c| f[c * e + i] * sig(g[c * e + i])).sum::<f64>() / hc as f64).collect();
        (x, mv(&self.inject, hc, hc * e, &f))
    }
}

fn rand_hc(rng: &mut SplitMix64, hc: usize, e: usize, lr: usize) -> (HyperConn, HcRef) {
    let norm = gamma(rng, hc * e);
    let (down, dv) = rand_mat(rng, lr, hc * e);
    let (up, uv) = rand_mat(rng, hc * e, lr);
    let (inj, iv) = rand_mat(rng, hc, hc * e);
    let m = HyperConn { hc, n_embd: e, eps: 1e-6, norm: norm.clone(), down, up, inject: Some(inj) };
    (m, HcRef { hc, e, lr, norm, down: dv, up: uv, inject: iv })
}

#[test]
fn gr_mix_and_combine_match_f64_reference() {
    let mut rng = SplitMix64(1);
    let (hc, e, lr, n) = (4, 64, 16, 5);
    let (m, rf) = rand_hc(&mut rng, hc, e, lr);
    let r = rng.symmetric_vec(n * hc * e, 2.0);
    let mut x = vec![0f32; n * e];
    let mut inj = vec![0f32; n * hc];
    m.mix(&r, n, &mut x, Some(&mut inj));
    let y = rng.symmetric_vec(n * e, 1.0);
    let mut r2 = r.clone();
    m.combine(&mut r2, n, &y, &inj);
    for t in 0..n {
        let rt = to64(&r[t * hc * e..(t + 1) * hc * e]);
        let (xr, ir) = rf.mix(&rt, 1e-6);
        assert_close("hc mix x", &x[t * e..(t + 1) * e], &xr);
        assert_close("hc mix inj", &inj[t * hc..(t + 1) * hc], &ir);
        // R[c] += 2σ(inj_c/hc)·y, using the engine's inj so only the combine is under test.
        let want: Vec<f64> = (0..hc * e)
            .map(|i| rt[i] + 2.0 * sig(inj[t * hc + i / e] as f64 / hc as f64) * y[t * e + i % e] as f64)
            .collect();
        assert_close("hc combine", &r2[t * hc * e..(t + 1) * hc * e], &want);
    }
}

/// The batched mix reads every weight row once per group of up to 8 tokens; each output must
/// still be bit-identical to a single-token mix (F32 and Q8_0 weights, groups of 8 and a
/// ragged tail).
#[test]
fn gr_fused_read_is_bit_identical_to_single_token_reads() {
    let mut rng = SplitMix64(2);
    let (hc, e, lr) = (4, 64, 32);
    for q8 in [false, true] {
        let (mut m, _) = rand_hc(&mut rng, hc, e, lr);
        if q8 {
            let requant = |w: &Mat| {
                let mut vals = vec![0f32; w.rows * w.cols];
                for r in 0..w.rows {
                    w.get_row(r, &mut vals[r * w.cols..(r + 1) * w.cols]);
                }
                let ty = quant::GgmlType::Q8_0;
                let rb = ty.row_bytes(w.cols).unwrap();
                let mut bytes = vec![0u8; rb * w.rows];
                for r in 0..w.rows {
                    quant::quantize_row(ty, &vals[r * w.cols..(r + 1) * w.cols], &mut bytes[r * rb..(r + 1) * rb])
                        .unwrap();
                }
                Mat::from_raw(ty, w.rows, w.cols, &bytes).unwrap()
            };
            m.down = requant(&m.down);
            m.up = requant(&m.up);
            m.inject = Some(requant(m.inject.as_ref().unwrap()));
        }
        for n in [1, 3, 8, 11] {
            let r = rng.symmetric_vec(n * hc * e, 2.0);
            let (mut x, mut inj) = (vec![0f32; n * e], vec![0f32; n * hc]);
            m.mix(&r, n, &mut x, Some(&mut inj));
            for t in 0..n {
                let (mut x1, mut i1) = (vec![0f32; e], vec![0f32; hc]);
                m.mix(&r[t * hc * e..(t + 1) * hc * e], 1, &mut x1, Some(&mut i1));
                assert!(x1.iter().zip(&x[t * e..]).all(|(a, b)| a.to_bits() == b.to_bits()), "q8={q8} n={n} t={t}: x");
                assert!(
                    i1.iter().zip(&inj[t * hc..]).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "q8={q8} n={n} t={t}: inj"
                );
            }
        }
    }
}

// --------------------------------------------------------------------------- Gated DeltaNet

struct GdnRef {
    hk: usize,
    hv: usize,
    s: usize,
    k: usize,
    e: usize,
    qkv: Vec<f32>,
    gate: Vec<f32>,
    conv: Vec<f32>,
    dt: Vec<f32>,
    a: Vec<f32>,
    beta: Vec<f32>,
    alpha: Vec<f32>,
    norm: Vec<f32>,
    out: Vec<f32>,
}

impl GdnRef {
    /// The whole sequence from a zero state, token by token, in f64.
    fn run(&self, xs: &[f32], n: usize) -> Vec<f64> {
        let (hk, hv, s, e) = (self.hk, self.hv, self.s, self.e);
        let c = (2 * hk + hv) * s;
        let eps = 1e-6;
        let ms: Vec<Vec<f64>> = (0..n).map(|t| mv(&self.qkv, c, e, &to64(&xs[t * e..(t + 1) * e]))).collect();
        let mut state = vec![vec![vec![0f64; s]; s]; hv]; // [head][key][value]
        let mut y = Vec::new();
        for t in 0..n {
            let x = to64(&xs[t * e..(t + 1) * e]);
            let z = mv(&self.gate, hv * s, e, &x);
            let beta: Vec<f64> = mv(&self.beta, hv, e, &x).into_iter().map(sig).collect();
            let al = mv(&self.alpha, hv, e, &x);
            let u: Vec<f64> = (0..c)
                .map(|ch| {
                    let mut acc = 0.0;
                    for k in 0..self.k {
                        let tt = t as i64 - (self.k as i64 - 1) + k as i64;
                        if tt >= 0 {
                            acc += self.conv[ch * self.k + k] as f64 * ms[tt as usize][ch];
                        }
                    }
                    silu64(acc)
                })
                .collect();
            let l2 = |v: &[f64]| -> Vec<f64> {
                let n = (v.iter().map(|a| a * a).sum::<f64>() + eps).sqrt();
                v.iter().map(|a| a / n).collect()
            };
            let mut o_all = Vec::new();
            for h in 0..hv {
                let kh = h % hk;
                let q = l2(&u[kh * s..(kh + 1) * s]);
                let k = l2(&u[hk * s + kh * s..hk * s + (kh + 1) * s]);
                let v = &u[2 * hk * s + h * s..2 * hk * s + (h + 1) * s];
                let sp = (al[h] + self.dt[h] as f64).exp().ln_1p();
                let decay = (sp * self.a[h] as f64).exp();
                let m = &mut state[h];
                for row in m.iter_mut() {
                    row.iter_mut().for_each(|v| *v *= decay);
                }
                let delta: Vec<f64> =
                    (0..s).map(|j| beta[h] * (v[j] - (0..s).map(|i| m[i][j] * k[i]).sum::<f64>())).collect();
                for i in 0..s {
                    for j in 0..s {
                        m[i][j] += k[i] * delta[j];
                    }
                }
                let o: Vec<f64> =
                    (0..s).map(|j| (0..s).map(|i| m[i][j] * q[i]).sum::<f64>() / (s as f64).sqrt()).collect();
                let on = rms64(&o, &self.norm, eps);
                o_all.extend((0..s).map(|j| on[j] * sig(z[h * s + j])));
            }
            y.extend(mv(&self.out, e, hv * s, &o_all));
        }
        y
    }
}

fn rand_gdn(rng: &mut SplitMix64) -> (Gdn, GdnRef) {
    let (hk, hv, s, k, e) = (2, 4, 16, 4, 64);
    let c = (2 * hk + hv) * s;
    let (qkv, qv) = rand_mat(rng, c, e);
    let (gate, gv) = rand_mat(rng, hv * s, e);
    let (beta, bv) = rand_mat(rng, hv, e);
    let (alpha, av) = rand_mat(rng, hv, e);
    let (out, ov) = rand_mat(rng, e, hv * s);
    let conv = rng.symmetric_vec(c * k, 0.5);
    let dt: Vec<f32> = rng.symmetric_vec(hv, 0.5).into_iter().map(|v| v - 1.0).collect();
    let a: Vec<f32> = rng.symmetric_vec(hv, 1.0).into_iter().map(|v| -v.exp()).collect();
    let norm = gamma(rng, s);
    let g = Gdn {
        hk,
        hv,
        s,
        conv_k: k,
        eps: 1e-6,
        qkv,
        gate,
        conv: conv.clone(),
        dt_bias: dt.clone(),
        a: a.clone(),
        beta,
        alpha,
        norm: norm.clone(),
        out,
    };
    let r = GdnRef { hk, hv, s, k, e, qkv: qv, gate: gv, conv, dt, a, beta: bv, alpha: av, norm, out: ov };
    (g, r)
}

#[test]
fn gdn_matches_f64_recurrence() {
    let mut rng = SplitMix64(3);
    let (g, rf) = rand_gdn(&mut rng);
    let n = 37;
    let x = rng.symmetric_vec(n * 64, 1.5);
    let mut st = g.new_state();
    let mut y = vec![0f32; n * 64];
    g.forward(&x, n, &mut st, GdnMode::Recurrent, &mut y);
    assert_close("gdn recurrent vs f64", &y, &rf.run(&x, n));
}

/// Chunked prefill (several chunk sizes, including ragged last chunks and chunks longer than
/// the batch) gives the recurrence's outputs and final state, to f32 rounding.
#[test]
fn gdn_chunked_prefill_equals_recurrence() {
    let mut rng = SplitMix64(4);
    let (g, _) = rand_gdn(&mut rng);
    let n = 50;
    let x = rng.symmetric_vec(n * 64, 1.5);
    let mut st_r = g.new_state();
    let mut y_r = vec![0f32; n * 64];
    g.forward(&x, n, &mut st_r, GdnMode::Recurrent, &mut y_r);
    for cs in [1, 4, 7, 16, 64] {
        let mut st_c = g.new_state();
        let mut y_c = vec![0f32; n * 64];
        g.forward(&x, n, &mut st_c, GdnMode::Chunked(cs), &mut y_c);
        assert_close(&format!("chunk {cs}: y"), &y_c, &to64(&y_r));
        assert_close(&format!("chunk {cs}: state"), &st_c.m, &to64(&st_r.m));
        assert_eq!(st_c.conv, st_r.conv, "chunk {cs}: conv history");
        // A chunked prefill followed by recurrent decode continues correctly.
        let x2 = rng.symmetric_vec(3 * 64, 1.5);
        let (mut a, mut b) = (vec![0f32; 3 * 64], vec![0f32; 3 * 64]);
        let mut sr = st_r.clone();
        g.forward(&x2, 3, &mut sr, GdnMode::Recurrent, &mut a);
        g.forward(&x2, 3, &mut st_c, GdnMode::Recurrent, &mut b);
        assert_close(&format!("chunk {cs}: decode after"), &b, &to64(&a));
    }
}

/// Splitting a batch (conv history and delta state carried in `GdnState`) is bit-identical to
/// one pass.
#[test]
fn gdn_split_batches_are_bit_identical() {
    let mut rng = SplitMix64(5);
    let (g, _) = rand_gdn(&mut rng);
    let n = 20;
    let x = rng.symmetric_vec(n * 64, 1.5);
    let mut st = g.new_state();
    let mut y = vec![0f32; n * 64];
    g.forward(&x, n, &mut st, GdnMode::Recurrent, &mut y);
    let mut st2 = g.new_state();
    let mut y2 = vec![0f32; n * 64];
    let mut t = 0;
    for len in [1, 2, 5, 1, 11] {
        g.forward(&x[t * 64..(t + len) * 64], len, &mut st2, GdnMode::Recurrent, &mut y2[t * 64..(t + len) * 64]);
        t += len;
    }
    assert_eq!(y, y2);
    assert_eq!(st, st2);
}

// ------------------------------------------------------------------- weight types in Mat

/// K-quant matrices (routed to the SIMD kernels) against the f64 product with their exactly
/// dequantized weights; batched products equal single-token products bit for bit. The
/// activation is quantized to Q8_K (8-bit, one scale per 256), so 1 % of the output's range
/// is the expected error level, far below what a block-layout error gives.
#[test]
fn mat_kquant_products_match_dequantized_reference() {
    let mut rng = SplitMix64(30);
    let (rows, cols, n) = (48, 512, 5);
    for ty in [quant::GgmlType::Q4K, quant::GgmlType::Q6K] {
        let vals = rng.symmetric_vec(rows * cols, 1.0);
        let rb = ty.row_bytes(cols).unwrap();
        let mut bytes = vec![0u8; rows * rb];
        for r in 0..rows {
            quant::quantize_row(ty, &vals[r * cols..(r + 1) * cols], &mut bytes[r * rb..(r + 1) * rb]).unwrap();
        }
        let m = Mat::from_raw(ty, rows, cols, &bytes).unwrap();
        let mut deq = vec![0f32; rows * cols];
        for r in 0..rows {
            m.get_row(r, &mut deq[r * cols..(r + 1) * cols]);
        }
        let x = rng.symmetric_vec(n * cols, 1.0);
        let mut y = vec![0f32; n * rows];
        m.matmul(&x, n, &mut y);
        for t in 0..n {
            let want = mv(&deq, rows, cols, &to64(&x[t * cols..(t + 1) * cols]));
            let scale = want.iter().fold(0f64, |a, v| a.max(v.abs()));
            let got = &y[t * rows..(t + 1) * rows];
            let err = got.iter().zip(&want).fold(0f64, |a, (g, w)| a.max((*g as f64 - w).abs()));
            assert!(err <= 1e-2 * scale, "{ty:?} token {t}: max err {err} vs scale {scale}");
            let mut single = vec![0f32; rows];
            m.matvec(&x[t * cols..(t + 1) * cols], &mut single);
            assert_eq!(single, got, "{ty:?} token {t}: batched != single");
        }
    }
}
