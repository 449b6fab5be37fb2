//! Each qwen4exp layer type alone, on random weights, against a plain scalar f64 reference
//! written here from the formulas in `shared/reference/tiny-qwen4exp/README.md` (nothing is
//! shared with the engine code), plus the batching invariants: chunked GDN prefill equals the
//! token-by-token recurrence, a multi-token pass equals single-token passes, the GR fused read
//! of up to 8 tokens is bit-identical to single-token reads.
//!
//! Tolerance: the engine computes in f32, the reference in f64 from the same f32 weights; on
//! these sizes (≤ 256-long dots, O(1) values) f32 rounding gives ~1e-6 relative, so 1e-4
//! relative to the output's largest magnitude (`TOL_REL`) catches any formula error (a wrong
//! gate, scale or index changes outputs by O(1)).

use strata::model::qwen4exp::hparams::PleParams;
use strata::model::qwen4exp::{
    Gdn, GdnMode, HyperConn, Indexer, Mat, Moe, Ple, Qsa, QsaCache, SwiGlu, heap_select,
};

const TOL_REL: f64 = 1e-4;

// ------------------------------------------------------------------------------ test helpers

/// splitmix64: deterministic test data without a rand dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn uni(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// `n` values uniform in [-s, s).
    fn vec(&mut self, n: usize, s: f32) -> Vec<f32> {
        (0..n).map(|_| self.uni() * s).collect()
    }
    /// Gammas around 1.
    fn gamma(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| 1.0 + 0.2 * self.uni()).collect()
    }
}

/// A random F32 matrix plus its values (row-major `[rows][cols]`) for the reference.
fn rand_mat(rng: &mut Rng, rows: usize, cols: usize) -> (Mat, Vec<f32>) {
    let w = rng.vec(rows * cols, 1.0 / (cols as f32).sqrt() * 1.7);
    (Mat::from_f32(rows, cols, &w).unwrap(), w)
}

fn mv(w: &[f32], rows: usize, cols: usize, x: &[f64]) -> Vec<f64> {
    (0..rows).map(|r| (0..cols).map(|c| w[r * cols + c] as f64 * x[c]).sum()).collect()
}

fn rms64(x: &[f64], g: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(g).map(|(v, &g)| v * s * g as f64).collect()
}

fn sig(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn silu64(x: f64) -> f64 {
    x * sig(x)
}

fn to64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// max |got − want| ≤ TOL_REL · max |want|, reporting the first bad index.
fn assert_close(what: &str, got: &[f32], want: &[f64]) {
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

fn rand_hc(rng: &mut Rng, hc: usize, e: usize, lr: usize) -> (HyperConn, HcRef) {
    let norm = rng.gamma(hc * e);
    let (down, dv) = rand_mat(rng, lr, hc * e);
    let (up, uv) = rand_mat(rng, hc * e, lr);
    let (inj, iv) = rand_mat(rng, hc, hc * e);
    let m = HyperConn { hc, n_embd: e, eps: 1e-6, norm: norm.clone(), down, up, inject: Some(inj) };
    (m, HcRef { hc, e, lr, norm, down: dv, up: uv, inject: iv })
}

#[test]
fn gr_mix_and_combine_match_f64_reference() {
    let mut rng = Rng(1);
    let (hc, e, lr, n) = (4, 64, 16, 5);
    let (m, rf) = rand_hc(&mut rng, hc, e, lr);
    let r = rng.vec(n * hc * e, 2.0);
    let mut x = vec![0f32; n * e];
    let mut inj = vec![0f32; n * hc];
    m.mix(&r, n, &mut x, Some(&mut inj));
    let y = rng.vec(n * e, 1.0);
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
    let mut rng = Rng(2);
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
                    quant::quantize_row(ty, &vals[r * w.cols..(r + 1) * w.cols], &mut bytes[r * rb..(r + 1) * rb]).unwrap();
                }
                Mat::from_raw(ty, w.rows, w.cols, &bytes).unwrap()
            };
            m.down = requant(&m.down);
            m.up = requant(&m.up);
            m.inject = Some(requant(m.inject.as_ref().unwrap()));
        }
        for n in [1, 3, 8, 11] {
            let r = rng.vec(n * hc * e, 2.0);
            let (mut x, mut inj) = (vec![0f32; n * e], vec![0f32; n * hc]);
            m.mix(&r, n, &mut x, Some(&mut inj));
            for t in 0..n {
                let (mut x1, mut i1) = (vec![0f32; e], vec![0f32; hc]);
                m.mix(&r[t * hc * e..(t + 1) * hc * e], 1, &mut x1, Some(&mut i1));
                assert!(x1.iter().zip(&x[t * e..]).all(|(a, b)| a.to_bits() == b.to_bits()), "q8={q8} n={n} t={t}: x");
                assert!(i1.iter().zip(&inj[t * hc..]).all(|(a, b)| a.to_bits() == b.to_bits()), "q8={q8} n={n} t={t}: inj");
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
                let o: Vec<f64> = (0..s).map(|j| (0..s).map(|i| m[i][j] * q[i]).sum::<f64>() / (s as f64).sqrt()).collect();
                let on = rms64(&o, &self.norm, eps);
                o_all.extend((0..s).map(|j| on[j] * sig(z[h * s + j])));
            }
            y.extend(mv(&self.out, e, hv * s, &o_all));
        }
        y
    }
}

fn rand_gdn(rng: &mut Rng) -> (Gdn, GdnRef) {
    let (hk, hv, s, k, e) = (2, 4, 16, 4, 64);
    let c = (2 * hk + hv) * s;
    let (qkv, qv) = rand_mat(rng, c, e);
    let (gate, gv) = rand_mat(rng, hv * s, e);
    let (beta, bv) = rand_mat(rng, hv, e);
    let (alpha, av) = rand_mat(rng, hv, e);
    let (out, ov) = rand_mat(rng, e, hv * s);
    let conv = rng.vec(c * k, 0.5);
    let dt: Vec<f32> = rng.vec(hv, 0.5).into_iter().map(|v| v - 1.0).collect();
    let a: Vec<f32> = rng.vec(hv, 1.0).into_iter().map(|v| -v.exp()).collect();
    let norm = rng.gamma(s);
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
    let mut rng = Rng(3);
    let (g, rf) = rand_gdn(&mut rng);
    let n = 37;
    let x = rng.vec(n * 64, 1.5);
    let mut st = g.new_state();
    let mut y = vec![0f32; n * 64];
    g.forward(&x, n, &mut st, GdnMode::Recurrent, &mut y);
    assert_close("gdn recurrent vs f64", &y, &rf.run(&x, n));
}

/// Chunked prefill (several chunk sizes, including ragged last chunks and chunks longer than
/// the batch) gives the recurrence's outputs and final state, to f32 rounding.
#[test]
fn gdn_chunked_prefill_equals_recurrence() {
    let mut rng = Rng(4);
    let (g, _) = rand_gdn(&mut rng);
    let n = 50;
    let x = rng.vec(n * 64, 1.5);
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
        let x2 = rng.vec(3 * 64, 1.5);
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
    let mut rng = Rng(5);
    let (g, _) = rand_gdn(&mut rng);
    let n = 20;
    let x = rng.vec(n * 64, 1.5);
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

// ------------------------------------------------------------------------- QSA / attention

/// libstdc++ `std::partial_sort(first, first + k, last, comp)` on indices, written out as the
/// heap operations of `std::__heap_select` (`make_heap` of the first k, then for each later
/// element that compares before the top, `__pop_heap` it into the heap).
fn ref_partial_sort_set(v: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    let before = |a: usize, b: usize| v[a] > v[b];
    fn adjust(idx: &mut [usize], hole0: usize, len: usize, value: usize, before: &dyn Fn(usize, usize) -> bool) {
        let mut hole = hole0;
        let mut child = hole0;
        while child < (len - 1) / 2 {
            child = 2 * child + 2;
            if before(idx[child], idx[child - 1]) {
                child -= 1;
            }
            idx[hole] = idx[child];
            hole = child;
        }
        if len % 2 == 0 && child == (len - 2) / 2 {
            child = 2 * child + 2;
            idx[hole] = idx[child - 1];
            hole = child - 1;
        }
        let mut parent = if hole > 0 { (hole - 1) / 2 } else { 0 };
        while hole > hole0 && before(idx[parent], value) {
            idx[hole] = idx[parent];
            hole = parent;
            parent = if hole > 0 { (hole - 1) / 2 } else { 0 };
        }
        idx[hole] = value;
    }
    if k == 0 {
        return vec![];
    }
    if k >= 2 {
        for p in (0..=(k - 2) / 2).rev() {
            let val = idx[p];
            adjust(&mut idx, p, k, val, &before);
        }
    }
    for i in k..v.len() {
        if before(idx[i], idx[0]) {
            let val = idx[i];
            idx[i] = idx[0];
            adjust(&mut idx, 0, k, val, &before);
        }
    }
    let mut s = idx[..k].to_vec();
    s.sort();
    s
}

#[test]
fn heap_select_matches_partial_sort_and_keeps_the_largest() {
    let mut rng = Rng(6);
    for case in 0..400 {
        let n = 1 + (rng.next() % 90) as usize;
        let k = (rng.next() % (n as u64 + 2)) as usize;
        // Heavy ties: values from a few blocks, like the indexer's per-block scores.
        let r = 1 + (rng.next() % 6) as usize;
        let blocks: Vec<f32> = (0..n.div_ceil(r)).map(|_| (rng.next() % 7) as f32).collect();
        let vals: Vec<f32> = (0..n).map(|j| blocks[j / r]).collect();
        let got = heap_select(&vals, k);
        let want = if k >= n { (0..n).collect() } else { ref_partial_sort_set(&to64(&vals), k) };
        assert_eq!(got, want, "case {case}: n={n} k={k} r={r} vals={vals:?}");
        // Whatever the tie order, every value above the k-th largest is kept.
        if k > 0 && k < n {
            let mut sorted = vals.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let kth = sorted[k - 1];
            assert!((0..n).filter(|&j| vals[j] > kth).all(|j| got.contains(&j)), "case {case}");
        }
    }
    // libstdc++ keeps the first k of an all-equal row (nothing beats the heap top).
    assert_eq!(heap_select(&[1.0; 10], 3), vec![0, 1, 2]);
}

struct QsaRef {
    h: usize,
    kv: usize,
    d: usize,
    n_rot: usize,
    base: f32,
    e: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    qn: Vec<f32>,
    kn: Vec<f32>,
    ki: usize,
    di: usize,
    top_k: usize,
    r: usize,
    iq: Vec<f32>,
    ik: Vec<f32>,
    iqn: Vec<f32>,
    ikn: Vec<f32>,
}

impl QsaRef {
    /// NEOX rope on the first n_rot dims; angles t·base^(−2i/n_rot) (in f64).
    fn rope(&self, x: &mut [f64], pos: usize) {
        let half = self.n_rot / 2;
        for i in 0..half {
            let th = pos as f64 * (self.base as f64).powf(-2.0 * i as f64 / self.n_rot as f64);
            let (a, b) = (x[i], x[i + half]);
            x[i] = a * th.cos() - b * th.sin();
            x[i + half] = a * th.sin() + b * th.cos();
        }
    }

    /// Whole sequence (F32 cache semantics); returns (y, selected cells per token).
    fn run(&self, xs: &[f32], n: usize) -> (Vec<f64>, Vec<Vec<usize>>) {
        let (h, kvh, d, e, eps) = (self.h, self.kv, self.d, self.e, 1e-6);
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut kap = Vec::new();
        for t in 0..n {
            let x = to64(&xs[t * e..(t + 1) * e]);
            let kp = mv(&self.k, kvh * d, e, &x);
            let mut kk = Vec::new();
            for j in 0..kvh {
                let mut hh = rms64(&kp[j * d..(j + 1) * d], &self.kn, eps);
                self.rope(&mut hh, t);
                kk.push(hh);
            }
            ks.push(kk);
            vs.push(mv(&self.v, kvh * d, e, &x));
            kap.push(mv(&self.ik, self.di, e, &x));
        }
        let nb = n / self.r;
        let bk: Vec<Vec<f64>> = (0..nb)
            .map(|b| {
                let mean: Vec<f64> =
                    (0..self.di).map(|i| (0..self.r).map(|j| kap[b * self.r + j][i]).sum::<f64>() / self.r as f64).collect();
                let mut kb = rms64(&mean, &self.ikn, eps);
                self.rope(&mut kb, b * self.r);
                kb
            })
            .collect();
        let budget = self.top_k + self.r - 1;
        let mut y = Vec::new();
        let mut sels = Vec::new();
        for t in 0..n {
            let x = to64(&xs[t * e..(t + 1) * e]);
            let qf = mv(&self.q, 2 * h * d, e, &x);
            let iqf = mv(&self.iq, self.ki * self.di, e, &x);
            let sel: Vec<usize> = if t + 1 <= budget {
                (0..=t).collect()
            } else {
                let iqs: Vec<Vec<f64>> = (0..self.ki)
                    .map(|hh| {
                        let mut q = rms64(&iqf[hh * self.di..(hh + 1) * self.di], &self.iqn, eps);
                        self.rope(&mut q, t);
                        q
                    })
                    .collect();
                let tail = (t + 1) / self.r * self.r;
                let vals: Vec<f64> = (0..=t)
                    .map(|j| {
                        let b = j / self.r;
                        let score = |b: usize| {
                            iqs.iter().map(|q| q.iter().zip(&bk[b]).map(|(a, c)| a * c).sum::<f64>().max(0.0)).sum::<f64>()
                        };
                        if j >= tail { 1e9 + if b < nb { score(b) } else { 0.0 } } else { score(b) }
                    })
                    .collect();
                ref_partial_sort_set(&vals, budget)
            };
            let mut att = Vec::new();
            for hh in 0..h {
                let mut q = rms64(&qf[hh * 2 * d..hh * 2 * d + d], &self.qn, eps);
                self.rope(&mut q, t);
                let kv = hh / (h / kvh);
                let sc: Vec<f64> =
                    sel.iter().map(|&j| q.iter().zip(&ks[j][kv]).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt()).collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
                let z: f64 = ex.iter().sum();
                for i in 0..d {
                    let o: f64 = sel.iter().zip(&ex).map(|(&j, p)| p / z * vs[j][kv * d + i]).sum();
                    att.push(o * sig(qf[hh * 2 * d + d + i]));
                }
            }
            y.extend(mv(&self.o, e, h * d, &att));
            sels.push(sel);
        }
        (y, sels)
    }
}

fn rand_qsa(rng: &mut Rng) -> (Qsa, QsaRef) {
    let (h, kv, d, n_rot, e, ki, di, top_k, r) = (4, 2, 32, 8, 64, 2, 16, 8, 4);
    let (q, qv) = rand_mat(rng, 2 * h * d, e);
    let (k, kvv) = rand_mat(rng, kv * d, e);
    let (v, vv) = rand_mat(rng, kv * d, e);
    let (o, ov) = rand_mat(rng, e, h * d);
    let (iq, iqv) = rand_mat(rng, ki * di, e);
    let (ik, ikv) = rand_mat(rng, di, e);
    let (qn, kn, iqn, ikn) = (rng.gamma(d), rng.gamma(d), rng.gamma(di), rng.gamma(di));
    let base = 10_000.0;
    let m = Qsa {
        n_head: h,
        n_head_kv: kv,
        head_dim: d,
        n_rot,
        rope_base: base,
        eps: 1e-6,
        q,
        k,
        v,
        o,
        q_norm: qn.clone(),
        k_norm: kn.clone(),
        indexer: Some(Indexer { heads: ki, dim: di, top_k, ratio: r, q: iq, k: ik, q_norm: iqn.clone(), k_norm: ikn.clone() }),
    };
    let rf = QsaRef {
        h,
        kv,
        d,
        n_rot,
        base,
        e,
        q: qv,
        k: kvv,
        v: vv,
        o: ov,
        qn,
        kn,
        ki,
        di,
        top_k,
        r,
        iq: iqv,
        ik: ikv,
        iqn,
        ikn,
    };
    (m, rf)
}

#[test]
fn qsa_matches_f64_reference_with_selection() {
    let mut rng = Rng(7);
    let (m, rf) = rand_qsa(&mut rng);
    let n = 45;
    let x = rng.vec(n * 64, 1.5);
    let mut cache = QsaCache::new(false);
    let mut y = vec![0f32; n * 64];
    let sel = m.forward(&x, n, 0, &mut cache, &mut y, true);
    let (yr, selr) = rf.run(&x, n);
    assert_eq!(sel, selr, "selected cells");
    assert!(sel.iter().enumerate().any(|(t, s)| s.len() < t + 1), "the test must drop cells");
    assert!(sel.iter().enumerate().any(|(t, s)| !s.contains(&t)), "a token can lose itself");
    assert_close("qsa y", &y, &yr);
}

/// Decoding one token at a time (K/V, raw indexer keys and block keys carried in the cache)
/// is bit-identical to one batched pass, for both cache types.
#[test]
fn qsa_decode_is_bit_identical_to_prefill() {
    let mut rng = Rng(8);
    let (m, _) = rand_qsa(&mut rng);
    let n = 30;
    let x = rng.vec(n * 64, 1.5);
    for f16 in [false, true] {
        let mut c1 = QsaCache::new(f16);
        let mut y1 = vec![0f32; n * 64];
        let s1 = m.forward(&x, n, 0, &mut c1, &mut y1, true);
        let mut c2 = QsaCache::new(f16);
        let mut y2 = vec![0f32; n * 64];
        let mut s2 = Vec::new();
        for t in 0..n {
            s2.extend(m.forward(&x[t * 64..(t + 1) * 64], 1, t, &mut c2, &mut y2[t * 64..(t + 1) * 64], true));
        }
        assert_eq!(s1, s2, "f16={f16}: selections");
        assert_eq!(y1, y2, "f16={f16}: outputs");
        assert_eq!(c1, c2, "f16={f16}: caches");
        if f16 {
            assert!(c1.k.iter().chain(&c1.v).chain(&c1.kappa).all(|&v| quant::f16_to_f32(quant::f32_to_f16(v)) == v));
        }
    }
}

// --------------------------------------------------------------------------------------- MoE

#[test]
fn moe_matches_f64_reference() {
    let mut rng = Rng(9);
    let (e, ff, ffs, ne, nu, n) = (64, 32, 48, 6, 2, 7);
    let (router, rv) = rand_mat(&mut rng, ne, e);
    let mut experts = Vec::new();
    let mut ev = Vec::new();
    for _ in 0..ne {
        let (g, gv) = rand_mat(&mut rng, ff, e);
        let (u, uv) = rand_mat(&mut rng, ff, e);
        let (d, dv) = rand_mat(&mut rng, e, ff);
        experts.push(SwiGlu { gate: g, up: u, down: d });
        ev.push((gv, uv, dv));
    }
    let (sg, sgv) = rand_mat(&mut rng, 1, e);
    let (g, gv) = rand_mat(&mut rng, ffs, e);
    let (u, uv) = rand_mat(&mut rng, ffs, e);
    let (d, dv) = rand_mat(&mut rng, e, ffs);
    let moe = Moe { n_used: nu, router, experts, shared_gate: sg, shared: SwiGlu { gate: g, up: u, down: d } };
    let x = rng.vec(n * e, 1.5);
    let mut y = vec![0f32; n * e];
    moe.forward(&x, n, &mut y);
    let swiglu = |gw: &[f32], uw: &[f32], dw: &[f32], f: usize, x: &[f64]| -> Vec<f64> {
        let a = mv(gw, f, e, x);
        let b = mv(uw, f, e, x);
        let h: Vec<f64> = a.iter().zip(&b).map(|(a, b)| silu64(*a) * b).collect();
        mv(dw, e, f, &h)
    };
    for t in 0..n {
        let xt = to64(&x[t * e..(t + 1) * e]);
        let lg = mv(&rv, ne, e, &xt);
        let mx = lg.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = lg.iter().map(|l| (l - mx).exp()).sum();
        let p: Vec<f64> = lg.iter().map(|l| (l - mx).exp() / z).collect();
        let mut order: Vec<usize> = (0..ne).collect();
        order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap());
        let chosen = &order[..nu];
        let wsum: f64 = chosen.iter().map(|&i| p[i]).sum::<f64>().max(6.103515625e-5);
        let mut want = vec![0f64; e];
        for &ex in chosen {
            let o = swiglu(&ev[ex].0, &ev[ex].1, &ev[ex].2, ff, &xt);
            want.iter_mut().zip(&o).for_each(|(w, o)| *w += p[ex] / wsum * o);
        }
        let gate = sig(mv(&sgv, 1, e, &xt)[0]);
        let sh = swiglu(&gv, &uv, &dv, ffs, &xt);
        want.iter_mut().zip(&sh).for_each(|(w, s)| *w += gate * s);
        assert_close(&format!("moe token {t}"), &y[t * e..(t + 1) * e], &want);
    }
}

// --------------------------------------------------------------------------------------- PLE

struct PleRef {
    p: PleParams,
    hc: usize,
    e: usize,
    table: Vec<f32>,
    key: Vec<f32>,
    value: Vec<f32>,
    nk: Vec<f32>,
    nq: Vec<f32>,
    nc: Vec<f32>,
    conv: Vec<f32>,
}

impl PleRef {
    /// Table rows of token t of `toks` (the whole sequence from its start).
    fn rows(&self, toks: &[u32], t: usize) -> Vec<u64> {
        let p = &self.p;
        let mut ctx = vec![toks[t] as u128];
        let mut reset = false;
        for s in 1..p.ngram {
            if t < s || toks[t - s] == p.eos {
                reset = true;
            }
            ctx.push(if reset { p.eos as u128 } else { toks[t - s] as u128 });
        }
        let mut rows = Vec::new();
        for n in 2..=p.ngram {
            let mut h: u128 = 0;
            for j in 0..n {
                h ^= (ctx[j] * p.multipliers[j] as u128) % (1u128 << 64);
            }
            for g in 0..p.heads_per_ngram {
                let i = (n - 2) * p.heads_per_ngram + g;
                rows.push((h % p.head_vocab_sizes[i] as u128) as u64 + p.head_offsets[i]);
            }
        }
        rows
    }

    /// The updated streams for the whole sequence `r [n][hc][E]`.
    fn run(&self, r: &[f32], toks: &[u32]) -> Vec<f64> {
        let (hc, e, n, dp) = (self.hc, self.e, toks.len(), self.p.head_dim);
        let eps = 1e-6;
        let mut gvs = Vec::new();
        let mut nns = Vec::new();
        for t in 0..n {
            let mut emb = Vec::new();
            for row in self.rows(toks, t) {
                emb.extend(to64(&self.table[row as usize * dp..(row as usize + 1) * dp]));
            }
            let key = mv(&self.key, hc * e, e, &emb);
            let val = mv(&self.value, e, e, &emb);
            let mut gv = Vec::new();
            let mut nn = Vec::new();
            for c in 0..hc {
                let kc = rms64(&key[c * e..(c + 1) * e], &self.nk[c * e..(c + 1) * e], eps);
                let qc = rms64(&to64(&r[(t * hc + c) * e..(t * hc + c + 1) * e]), &self.nq[c * e..(c + 1) * e], eps);
                let s = kc.iter().zip(&qc).map(|(a, b)| a * b).sum::<f64>() / (e as f64).sqrt();
                let gate = sig(s.signum() * s.abs().max(1e-6).sqrt());
                let g: Vec<f64> = val.iter().map(|v| gate * v).collect();
                nn.extend(rms64(&g, &self.nc[c * e..(c + 1) * e], eps));
                gv.extend(g);
            }
            gvs.push(gv);
            nns.push(nn);
        }
        let (kp, dil) = (self.p.conv_kernel, self.p.ngram);
        let mut out = Vec::new();
        for t in 0..n {
            for ch in 0..hc * e {
                let mut acc = 0.0;
                for k in 0..kp {
                    let back = (kp - 1 - k) * dil;
                    if t >= back {
                        acc += self.conv[ch * kp + k] as f64 * nns[t - back][ch];
                    }
                }
                out.push(r[t * hc * e + ch] as f64 + gvs[t][ch] + silu64(acc));
            }
        }
        out
    }
}

fn rand_ple(rng: &mut Rng, table_ty: quant::GgmlType) -> (Ple, PleRef) {
    let (hc, e, ngram, hpn, kp) = (3, 128, 3, 2, 3); // Dp = 32: quantized tables need whole blocks
    let nph = (ngram - 1) * hpn;
    let dp = e / nph;
    let sizes: Vec<u64> = vec![101, 103, 107, 109];
    let offsets: Vec<u64> = sizes.iter().scan(0, |acc, &s| {
        let o = *acc;
        *acc += s;
        Some(o)
    }).collect();
    let rows: usize = sizes.iter().sum::<u64>() as usize;
    let params = PleParams {
        layer: 0,
        ngram,
        heads_per_ngram: hpn,
        conv_kernel: kp,
        eos: 2,
        head_dim: dp,
        multipliers: (0..ngram).map(|_| (rng.next() >> 19) | 1).collect(),
        head_offsets: offsets,
        head_vocab_sizes: sizes,
    };
    // Table in the requested block type; the reference sees the dequantized values.
    let vals = rng.vec(rows * dp, 1.0);
    let rb = table_ty.row_bytes(dp).unwrap();
    let mut bytes = vec![0u8; rows * rb];
    for r in 0..rows {
        quant::quantize_row(table_ty, &vals[r * dp..(r + 1) * dp], &mut bytes[r * rb..(r + 1) * rb]).unwrap();
    }
    let table = Mat::from_raw(table_ty, rows, dp, &bytes).unwrap();
    let mut deq = vec![0f32; rows * dp];
    for r in 0..rows {
        quant::dequantize_row(table_ty, &bytes[r * rb..(r + 1) * rb], &mut deq[r * dp..(r + 1) * dp]).unwrap();
    }
    let (key, kv) = rand_mat(rng, hc * e, e);
    let (value, vv) = rand_mat(rng, e, e);
    let (nk, nq, nc) = (rng.gamma(hc * e), rng.gamma(hc * e), rng.gamma(hc * e));
    let conv = rng.vec(hc * e * kp, 0.6);
    let m = Ple {
        params: params.clone(),
        hc,
        n_embd: e,
        eps: 1e-6,
        table,
        key,
        value,
        norm_key: nk.clone(),
        norm_query: nq.clone(),
        norm_conv: nc.clone(),
        conv: conv.clone(),
    };
    (m, PleRef { p: params, hc, e, table: deq, key: kv, value: vv, nk, nq, nc, conv })
}

#[test]
fn ple_matches_f64_reference_for_every_table_type() {
    use quant::GgmlType::*;
    for (i, ty) in [Q8_0, Q5_0, Q5_1, IQ4NL, F32].into_iter().enumerate() {
        let mut rng = Rng(10 + i as u64);
        let (m, rf) = rand_ple(&mut rng, ty);
        // EOS (2) inside the sequence resets the n-gram window for the following tokens.
        let toks: Vec<u32> = vec![5, 9, 2, 7, 7, 1000, 3, 2, 2, 11, 12, 13, 14, 15, 16, 17, 5, 9];
        let n = toks.len();
        let r = rng.vec(n * 3 * 128, 1.0);
        let mut got = r.clone();
        let mut st = m.new_state();
        m.forward(&mut got, &toks, &mut st).unwrap();
        assert_close(&format!("ple {ty:?}"), &got, &rf.run(&r, &toks));
        for t in 0..n {
            let ctx: Vec<Option<u32>> = (0..3).map(|s| if t >= s { Some(toks[t - s]) } else { None }).collect();
            assert_eq!(m.rows(&ctx), rf.rows(&toks, t), "{ty:?} rows of token {t}");
        }
    }
}

/// Token predecessors and the dilated-conv history carried in `PleState` make split batches
/// bit-identical to one pass (the EOS reset included).
#[test]
fn ple_split_batches_are_bit_identical() {
    let mut rng = Rng(20);
    let (m, _) = rand_ple(&mut rng, quant::GgmlType::Q8_0);
    let toks: Vec<u32> = vec![4, 2, 8, 15, 16, 23, 42, 2, 2, 4, 8, 15, 16, 23];
    let n = toks.len();
    let r = rng.vec(n * 3 * 128, 1.0);
    let mut a = r.clone();
    let mut sa = m.new_state();
    m.forward(&mut a, &toks, &mut sa).unwrap();
    let mut b = r.clone();
    let mut sb = m.new_state();
    let mut t = 0;
    for len in [1, 1, 3, 2, 6, 1] {
        m.forward(&mut b[t * 384..(t + len) * 384], &toks[t..t + len], &mut sb).unwrap();
        t += len;
    }
    assert_eq!(a, b);
    assert_eq!(sa, sb);
}
