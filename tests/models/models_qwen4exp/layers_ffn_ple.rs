//! MoE and the PLE n-gram block alone against plain f64 references; see `layers.rs` for the
//! tolerance.

use strata::cpu::prelude::*;
use strata::model::Mat;
use strata::model::qwen4exp::hparams::PleParams;
use strata::model::qwen4exp::{Moe, Ple, SwiGlu};

use super::layers::{SplitMix64, assert_close, gamma, mv, rand_mat, rms64, sig, silu64, to64};

// --------------------------------------------------------------------------------------- MoE

#[test]
fn moe_matches_f64_reference() {
    let mut rng = SplitMix64(9);
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
    let spec = strata::model::qwen4exp::moe::spec(ne, nu, ff, ffs);
    let moe = Moe { spec, router, experts, shared_gate: sg, shared: SwiGlu { gate: g, up: u, down: d } };
    let x = rng.symmetric_vec(n * e, 1.5);
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
            for (c, &mult) in ctx.iter().zip(&p.multipliers).take(n) {
                h ^= (c * mult as u128) % (1u128 << 64);
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

fn rand_ple(rng: &mut SplitMix64, table_ty: quant::GgmlType) -> (Ple, PleRef) {
    let (hc, e, ngram, hpn, kp) = (3, 128, 3, 2, 3); // Dp = 32: quantized tables need whole blocks
    let nph = (ngram - 1) * hpn;
    let dp = e / nph;
    let sizes: Vec<u64> = vec![101, 103, 107, 109];
    let offsets: Vec<u64> = sizes
        .iter()
        .scan(0, |acc, &s| {
            let o = *acc;
            *acc += s;
            Some(o)
        })
        .collect();
    let rows: usize = sizes.iter().sum::<u64>() as usize;
    let params = PleParams {
        layer: 0,
        ngram,
        heads_per_ngram: hpn,
        conv_kernel: kp,
        eos: 2,
        head_dim: dp,
        multipliers: (0..ngram).map(|_| (rng.next_u64() >> 19) | 1).collect(),
        head_offsets: offsets,
        head_vocab_sizes: sizes,
    };
    // Table in the requested block type; the reference sees the dequantized values.
    let vals = rng.symmetric_vec(rows * dp, 1.0);
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
    let (nk, nq, nc) = (gamma(rng, hc * e), gamma(rng, hc * e), gamma(rng, hc * e));
    let conv = rng.symmetric_vec(hc * e * kp, 0.6);
    let m = Ple {
        params: params.clone(),
        hc,
        n_embd: e,
        eps: 1e-6,
        table: table.into(),
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
        let mut rng = SplitMix64(10 + i as u64);
        let (m, rf) = rand_ple(&mut rng, ty);
        // EOS (2) inside the sequence resets the n-gram window for the following tokens.
        let toks: Vec<u32> = vec![5, 9, 2, 7, 7, 1000, 3, 2, 2, 11, 12, 13, 14, 15, 16, 17, 5, 9];
        let n = toks.len();
        let r = rng.symmetric_vec(n * 3 * 128, 1.0);
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
    let mut rng = SplitMix64(20);
    let (m, _) = rand_ple(&mut rng, quant::GgmlType::Q8_0);
    let toks: Vec<u32> = vec![4, 2, 8, 15, 16, 23, 42, 2, 2, 4, 8, 15, 16, 23];
    let n = toks.len();
    let r = rng.symmetric_vec(n * 3 * 128, 1.0);
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
