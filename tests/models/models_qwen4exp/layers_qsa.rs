//! QSA alone (cell selection with libstdc++'s heap order, attention, decode == prefill)
//! against a plain f64 reference; see `layers.rs` for the tolerance.

use strata::cpu::prelude::*;
use strata::cpu::qwen4exp::heap_select;
use strata::model::KvRows;
use strata::model::qwen4exp::{Indexer, KvType, Qsa, QsaCache};

use super::layers::{SplitMix64, assert_close, gamma, mv, rand_mat, rms64, sig, to64};

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
        if len.is_multiple_of(2) && child == (len - 2) / 2 {
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
    let mut rng = SplitMix64(6);
    for case in 0..400 {
        let n = 1 + (rng.next_u64() % 90) as usize;
        let k = (rng.next_u64() % (n as u64 + 2)) as usize;
        // Heavy ties: values from a few blocks, like the indexer's per-block scores.
        let r = 1 + (rng.next_u64() % 6) as usize;
        let blocks: Vec<f32> = (0..n.div_ceil(r)).map(|_| (rng.next_u64() % 7) as f32).collect();
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
                let mean: Vec<f64> = (0..self.di)
                    .map(|i| (0..self.r).map(|j| kap[b * self.r + j][i]).sum::<f64>() / self.r as f64)
                    .collect();
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
            let sel: Vec<usize> = if t < budget {
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
                            iqs.iter()
                                .map(|q| q.iter().zip(&bk[b]).map(|(a, c)| a * c).sum::<f64>().max(0.0))
                                .sum::<f64>()
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
                let sc: Vec<f64> = sel
                    .iter()
                    .map(|&j| q.iter().zip(&ks[j][kv]).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt())
                    .collect();
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

fn rand_qsa(rng: &mut SplitMix64) -> (Qsa, QsaRef) {
    let (h, kv, d, n_rot, e, ki, di, top_k, r) = (4, 2, 32, 8, 64, 2, 16, 8, 4);
    let (q, qv) = rand_mat(rng, 2 * h * d, e);
    let (k, kvv) = rand_mat(rng, kv * d, e);
    let (v, vv) = rand_mat(rng, kv * d, e);
    let (o, ov) = rand_mat(rng, e, h * d);
    let (iq, iqv) = rand_mat(rng, ki * di, e);
    let (ik, ikv) = rand_mat(rng, di, e);
    let (qn, kn, iqn, ikn) = (gamma(rng, d), gamma(rng, d), gamma(rng, di), gamma(rng, di));
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
        indexer: Some(Indexer {
            heads: ki,
            dim: di,
            top_k,
            ratio: r,
            q: iq,
            k: ik,
            q_norm: iqn.clone(),
            k_norm: ikn.clone(),
        }),
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
    let mut rng = SplitMix64(7);
    let (m, rf) = rand_qsa(&mut rng);
    let n = 45;
    let x = rng.symmetric_vec(n * 64, 1.5);
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
    let mut rng = SplitMix64(8);
    let (m, _) = rand_qsa(&mut rng);
    let n = 30;
    let x = rng.symmetric_vec(n * 64, 1.5);
    for kv in [KvType::F32, KvType::F16, KvType::Int8] {
        let f16 = kv == KvType::F16;
        let mut c1 = m.new_cache(kv);
        let mut y1 = vec![0f32; n * 64];
        let s1 = m.forward(&x, n, 0, &mut c1, &mut y1, true);
        let mut c2 = m.new_cache(kv);
        let mut y2 = vec![0f32; n * 64];
        let mut s2 = Vec::new();
        for t in 0..n {
            s2.extend(m.forward(&x[t * 64..(t + 1) * 64], 1, t, &mut c2, &mut y2[t * 64..(t + 1) * 64], true));
        }
        assert_eq!(s1, s2, "{kv:?}: selections");
        assert_eq!(y1, y2, "{kv:?}: outputs");
        assert_eq!(c1, c2, "{kv:?}: caches");
        assert_eq!(c1.is_f16(), f16);
    }
}

/// The int8 QSA cache stores each K/V head row and each indexer key as the engine's one int8
/// format (`quantize_row_i8`: the decoders' `KvLayer` bytes), reads back `q · scale`, and
/// truncates by whole rows; a layer on it stays close to the f32 cache (int8's rounding, about
/// 1/254 of a row's largest value) with the same kept cells on this input.
#[test]
fn qsa_int8_cache_stores_the_engine_int8_rows() {
    let mut rng = SplitMix64(9);
    let (m, _) = rand_qsa(&mut rng);
    let n = 30;
    let x = rng.symmetric_vec(n * 64, 1.5);
    let (mut c8, mut c32) = (m.new_cache(KvType::Int8), m.new_cache(KvType::F32));
    let (mut y8, mut y32) = (vec![0f32; n * 64], vec![0f32; n * 64]);
    let s8 = m.forward(&x, n, 0, &mut c8, &mut y8, true);
    let s32 = m.forward(&x, n, 0, &mut c32, &mut y32, true);
    assert_eq!(s8, s32, "kept cells");
    let worst = y8.iter().zip(&y32).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0f32, f32::max);
    assert!(worst > 0.0 && worst < 0.05, "int8 vs f32 cache outputs: worst relative {worst}");
    // Every row of the f32 cache, quantized by the one int8 writer, is what the int8 cache holds.
    let d = m.head_dim;
    for (name, buf8, buf32, row) in [
        ("K", &c8.k, &c32.k, d),
        ("V", &c8.v, &c32.v, d),
        ("kappa", &c8.kappa, &c32.kappa, m.indexer.as_ref().unwrap().dim),
    ] {
        let KvRows::F32(exact) = buf32 else { panic!("f32 cache") };
        let KvRows::Int8 { q, scale, row: r } = buf8 else { panic!("{name}: not an int8 cache") };
        assert_eq!(*r, row, "{name}: row length");
        assert_eq!((q.len(), scale.len()), (exact.len(), exact.len() / row), "{name}: sizes");
        let mut back = vec![0f32; exact.len()];
        buf8.read(0, &mut back);
        for (i, src) in exact.chunks(row).enumerate() {
            let mut want = vec![0i8; row];
            let s = strata::model::quantize_row_i8(src, &mut want);
            assert_eq!((&q[i * row..(i + 1) * row], scale[i]), (&want[..], s), "{name}: row {i}");
            for (j, &w) in want.iter().enumerate() {
                assert_eq!(back[i * row + j], w as f32 * s, "{name}: read of row {i} value {j}");
            }
        }
    }
    // Truncation keeps whole rows (speculative rollback).
    let cells = m.cells(&c8);
    c8.truncate(cells - 3, cells, m.indexer.as_ref().map(|ix| (ix.ratio, ix.dim)));
    assert_eq!(m.cells(&c8), cells - 3);
    let KvRows::Int8 { q, scale, row } = &c8.k else { panic!("int8") };
    assert_eq!(q.len(), scale.len() * row);
}
