//! The MTP (NextN) head alone against a plain f64 reference written here from the published
//! layout (docs/qwen4exp.md, "MTP drafter"; nothing shared with the engine:
//! weights are read straight from the GGUF bytes, the GR mixers included), on F32 synthetic
//! heads: with the model's embedding and head, with its own tables, and without `hc_head`
//! (the trunk's output mixer). Inputs are the trunk's real wide residuals (`forward_hidden`),
//! pairs `(R_p, t_{p+1})` at positions 0.., as the drafter feeds them.
//!
//! Tolerance: f32 engine vs f64 reference from the same f32 weights: the block is a few
//! ≤ 256-long dots deep, so f32 rounding stays near 1e-5 of the logit scale; `TOL_REL` = 1e-4
//! relative to the largest |logit| catches any formula error (a swapped concat half, a missing
//! norm, a wrong rope position or head change logits by O(1)). Batch invariance (all pairs in
//! one call == one call per pair == truncate and redo) is checked bit for bit.

use std::path::PathBuf;

use gguf::GgufFile;
use strata::cpu::prelude::*;
use strata::model::qwen4exp::{KvType, Mtp, Qwen4Exp};
use strata::synth::qwen4exp::{SynthConfig, SynthMtp, write, write_mtp};

const TOL_REL: f64 = 1e-4;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-qwen4exp-mtp-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// An F32 tensor as f64, row-major (reversed ggml ne).
fn t64(g: &GgufFile, name: &str) -> Vec<f64> {
    let t = g.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
    assert_eq!(t.ty, quant::GgmlType::F32, "{name}");
    g.tensor_data(t).chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect()
}

fn rms(x: &[f64], g: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(g).map(|(v, g)| v * s * g).collect()
}

/// `W x` for W `[rows][cols]` row-major.
fn mv(w: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len()).map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum()).collect()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// NEOX rope of the first `n_rot` dims at position `pos`.
fn rope(x: &mut [f64], pos: usize, n_rot: usize, base: f64) {
    let half = n_rot / 2;
    for i in 0..half {
        let th = pos as f64 * base.powf(-2.0 * i as f64 / n_rot as f64);
        let (c, s) = (th.cos(), th.sin());
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * c - b * s;
        x[i + half] = a * s + b * c;
    }
}

/// SwiGLU FFN with stacked weights: expert `e` of `[n][rows][cols]` tensors.
fn swiglu(gate: &[f64], up: &[f64], down: &[f64], ff: usize, x: &[f64]) -> Vec<f64> {
    let d = x.len();
    let g = mv(gate, x);
    let u = mv(up, x);
    let a: Vec<f64> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
    assert_eq!(a.len(), ff);
    let y = mv(down, &a);
    assert_eq!(y.len(), d);
    y
}

/// A GR mixer `{prefix}{norm,down,up[,inject]}` read from `g`, as in gr.rs / the fixture README:
/// `X[c] = rms(R[c]; γ[c])`, `a = silu(W_down·flat(X) / hc)`, `G = W_up·a`,
/// `x = (1/hc) Σ_c X[c]·σ(G[c])`, `inj = W_inj·flat(X)`.
struct Gr {
    norm: Vec<f64>,
    down: Vec<f64>,
    up: Vec<f64>,
    inject: Option<Vec<f64>>,
}

impl Gr {
    fn read(g: &GgufFile, prefix: &str, inject: bool) -> Gr {
        Gr {
            norm: t64(g, &format!("{prefix}norm.weight")),
            down: t64(g, &format!("{prefix}down.weight")),
            up: t64(g, &format!("{prefix}up.weight")),
            inject: inject.then(|| t64(g, &format!("{prefix}inject.weight"))),
        }
    }

    fn mix(&self, r: &[f64], hc: usize, eps: f64) -> (Vec<f64>, Vec<f64>) {
        let e = r.len() / hc;
        let flat: Vec<f64> =
            (0..hc).flat_map(|c| rms(&r[c * e..(c + 1) * e], &self.norm[c * e..(c + 1) * e], eps)).collect();
        let a: Vec<f64> = mv(&self.down, &flat)
            .iter()
            .map(|v| {
                let v = v / hc as f64;
                v / (1.0 + (-v).exp())
            })
            .collect();
        let gate = mv(&self.up, &a);
        let x = (0..e)
            .map(|i| (0..hc).map(|c| flat[c * e + i] * sigmoid(gate[c * e + i])).sum::<f64>() / hc as f64)
            .collect();
        let inj = self.inject.as_ref().map(|w| mv(w, &flat)).unwrap_or_default();
        (x, inj)
    }
}

/// `R[c] += 2·σ(inj[c]/hc)·y`.
fn combine(r: &mut [f64], inj: &[f64], y: &[f64]) {
    let (hc, e) = (inj.len(), y.len());
    for c in 0..hc {
        let w = 2.0 * sigmoid(inj[c] / hc as f64);
        for i in 0..e {
            r[c * e + i] += w * y[i];
        }
    }
}

/// The reference head: logits `[n][V]` and output residuals `[n][hc][E]` of the pairs
/// `(wide[p], tokens[p])` at positions `0..n`, from the MTP file `mg` and the model file `tg`,
/// following docs/qwen4exp.md ("MTP drafter").
fn reference(cfg: &SynthConfig, mg: &GgufFile, tg: &GgufFile, tokens: &[u32], wide: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let (e, v, nl, eps) = (cfg.n_embd, cfg.n_vocab, cfg.layers.len(), cfg.eps as f64);
    let hc = cfg.hc;
    let b = |s: &str| format!("blk.{nl}.{s}");
    let nx = |s: &str| format!("blk.{nl}.nextn.{s}");
    let own = mg.tensor(&nx("embed_tokens.weight")).is_some();
    let embd = if own { t64(mg, &nx("embed_tokens.weight")) } else { t64(tg, "token_embd.weight") };
    let head = if mg.tensor(&nx("shared_head_head.weight")).is_some() {
        t64(mg, &nx("shared_head_head.weight"))
    } else if tg.tensor("output.weight").is_some() {
        t64(tg, "output.weight")
    } else {
        t64(tg, "token_embd.weight")
    };
    let (enorm, hnorm, eh) =
        (t64(mg, &nx("enorm.weight")), t64(mg, &nx("hnorm.weight")), t64(mg, &nx("eh_proj.weight")));
    assert_eq!(hnorm.len(), hc * e, "hnorm covers the wide residual");
    let gr_attn = Gr::read(mg, &b("hc_attn_"), true);
    let gr_ffn = Gr::read(mg, &b("hc_ffn_"), true);
    let gr_head = if mg.tensor(&nx("hc_head_norm.weight")).is_some() {
        Gr::read(mg, &nx("hc_head_"), false)
    } else {
        Gr::read(tg, "output_hc_", false)
    };
    let (wq, wk, wv, wo) = (
        t64(mg, &b("attn_q.weight")),
        t64(mg, &b("attn_k.weight")),
        t64(mg, &b("attn_v.weight")),
        t64(mg, &b("attn_output.weight")),
    );
    let (qn, kn) = (t64(mg, &b("attn_q_norm.weight")), t64(mg, &b("attn_k_norm.weight")));
    let router = t64(mg, &b("ffn_gate_inp.weight"));
    let (ge, ue, de) =
        (t64(mg, &b("ffn_gate_exps.weight")), t64(mg, &b("ffn_up_exps.weight")), t64(mg, &b("ffn_down_exps.weight")));
    let shg = t64(mg, &b("ffn_gate_inp_shexp.weight"));
    let (gs, us, ds) = (
        t64(mg, &b("ffn_gate_shexp.weight")),
        t64(mg, &b("ffn_up_shexp.weight")),
        t64(mg, &b("ffn_down_shexp.weight")),
    );
    let (nh, nkv, hd) = (cfg.n_head, cfg.n_head_kv, cfg.head_dim);
    let (ff, ffs, ne) = (cfg.n_ff_exp, cfg.n_ff_shexp, cfg.n_expert);
    let base = cfg.rope_base as f64;

    let mut ks: Vec<Vec<f64>> = Vec::new(); // per position [KV·D]
    let mut vs: Vec<Vec<f64>> = Vec::new();
    let mut out = Vec::new();
    let mut res = Vec::new();
    for (p, &tok) in tokens.iter().enumerate() {
        let emb = &embd[tok as usize * e..(tok as usize + 1) * e];
        let en = rms(emb, &enorm, eps);
        // Every stream c: eh_proj([enorm(emb) ‖ hnorm_c(R_p[c])]).
        let mut r: Vec<f64> = Vec::with_capacity(hc * e);
        for c in 0..hc {
            let h: Vec<f64> = wide[(p * hc + c) * e..][..e].iter().map(|&x| x as f64).collect();
            let mut cat = en.clone();
            cat.extend(rms(&h, &hnorm[c * e..(c + 1) * e], eps));
            r.extend(mv(&eh, &cat));
        }
        // GR(attention).
        let (u, inj) = gr_attn.mix(&r, hc, eps);
        let qf = mv(&wq, &u);
        let kf = mv(&wk, &u);
        let vf = mv(&wv, &u);
        let mut kp = Vec::new();
        for g in 0..nkv {
            let mut k = rms(&kf[g * hd..(g + 1) * hd], &kn, eps);
            rope(&mut k, p, cfg.n_rot, base);
            kp.extend(k);
        }
        ks.push(kp);
        vs.push(vf);
        let mut o = vec![0f64; nh * hd];
        for hh in 0..nh {
            let src = &qf[hh * 2 * hd..(hh + 1) * 2 * hd];
            let mut q = rms(&src[..hd], &qn, eps);
            rope(&mut q, p, cfg.n_rot, base);
            let g = hh / (nh / nkv);
            let sc: Vec<f64> = (0..=p)
                .map(|j| {
                    q.iter().zip(&ks[j][g * hd..(g + 1) * hd]).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = sc.iter().map(|s| (s - m).exp()).sum();
            for (j, s) in sc.iter().enumerate() {
                let pj = (s - m).exp() / z;
                for i in 0..hd {
                    o[hh * hd + i] += pj * vs[j][g * hd + i];
                }
            }
            for i in 0..hd {
                o[hh * hd + i] *= sigmoid(src[hd + i]);
            }
        }
        let y = mv(&wo, &o);
        combine(&mut r, &inj, &y);
        // GR(MoE with shared expert).
        let (u, inj) = gr_ffn.mix(&r, hc, eps);
        let lg = mv(&router, &u);
        let m = lg.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = lg.iter().map(|l| (l - m).exp()).sum();
        let pr: Vec<f64> = lg.iter().map(|l| (l - m).exp() / z).collect();
        let mut idx: Vec<usize> = (0..ne).collect();
        idx.sort_by(|&a, &b| pr[b].partial_cmp(&pr[a]).unwrap().then(a.cmp(&b)));
        idx.truncate(cfg.n_expert_used);
        let wsum: f64 = idx.iter().map(|&i| pr[i]).sum();
        let mut y = vec![0f64; e];
        for &ex in &idx {
            let ye = swiglu(
                &ge[ex * ff * e..(ex + 1) * ff * e],
                &ue[ex * ff * e..(ex + 1) * ff * e],
                &de[ex * e * ff..(ex + 1) * e * ff],
                ff,
                &u,
            );
            y.iter_mut().zip(&ye).for_each(|(a, b)| *a += pr[ex] / wsum * b);
        }
        let sg = sigmoid(shg.iter().zip(&u).map(|(a, b)| a * b).sum());
        let ysh = swiglu(&gs, &us, &ds, ffs, &u);
        y.iter_mut().zip(&ysh).for_each(|(a, b)| *a += sg * b);
        combine(&mut r, &inj, &y);
        // The head's output mixer, then the output matrix.
        let (zed, _) = gr_head.mix(&r, hc, eps);
        let l = mv(&head, &zed);
        assert_eq!(l.len(), v);
        out.extend(l);
        res.extend(r);
    }
    (out, res)
}

/// A tiny trunk (seed 21) and an F32 head (seed 5) written as `head` describes.
fn setup(tag: &str, tied: bool, head: &SynthMtp) -> (SynthConfig, Qwen4Exp, PathBuf) {
    let mut cfg = SynthConfig::tiny();
    cfg.tied = tied;
    let paths = write(&cfg, 21, &tmp(&format!("trunk-{tag}")), false).unwrap();
    let m = Qwen4Exp::open(&paths[0]).unwrap();
    let mp = tmp(&format!("mtp-{tag}.gguf"));
    write_mtp(&cfg, head, 5, &mp).unwrap();
    (cfg, m, mp)
}

/// Largest |a − b| over the largest |b| (at least 1).
fn rel_err(got: &[f32], want: &[f64]) -> (f64, usize) {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(1f64, |a, b| a.max(b.abs()));
    let (mut worst, mut at) = (0f64, 0);
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(a.is_finite(), "value {i} is {a}");
        let d = (*a as f64 - b).abs();
        if d > worst {
            (worst, at) = (d, i);
        }
    }
    (worst / scale, at)
}

/// The trunk hands the MTP head its wide residual: `forward_hidden` returns `[n][hc][E]`,
/// and the output mixer of that times the output matrix is exactly the logits it returned.
#[test]
fn mtp_trunk_hands_off_the_wide_residual() {
    let (cfg, m, _) = setup("handoff", false, &SynthMtp::default());
    let seq: Vec<u32> = (0..9).map(|k| (k * 41 + 2) % 300).collect();
    let mut st = m.new_state(KvType::F16);
    let (logits, wide) = m.forward_hidden(&mut st, &seq, 0).unwrap();
    assert_eq!(wide.len(), seq.len() * cfg.hc * cfg.n_embd);
    let mut x = vec![0f32; seq.len() * cfg.n_embd];
    m.out_hc.mix(&wide, seq.len(), &mut x, None);
    let mut again = vec![0f32; logits.len()];
    m.output.matmul(&x, seq.len(), &mut again);
    assert!(again == logits, "wide residual is not what the head mixer reads");
    let mut plain = m.new_state(KvType::F16);
    assert!(m.forward(&mut plain, &seq, 0).unwrap() == logits);
}

#[test]
fn mtp_forward_matches_scalar_reference() {
    let own = SynthMtp { own_tables: true, ..SynthMtp::default() };
    let trunk_mixer = SynthMtp { hc_head: false, ..SynthMtp::default() };
    for (tag, tied, sm) in [
        ("shared", false, SynthMtp::default()),
        ("tied", true, SynthMtp::default()),
        ("own", false, own),
        ("trunk-mixer", false, trunk_mixer),
    ] {
        let (cfg, m, mp) = setup(tag, tied, &sm);
        let head = Mtp::open(&m, &mp).unwrap();
        assert_eq!(head.block, 4);
        assert_eq!(head.width(), cfg.hc * cfg.n_embd);
        let own = sm.own_tables;
        assert_eq!((head.embed.is_some(), head.head.is_some()), (own, own));
        assert_eq!(head.hc_head.is_some(), sm.hc_head, "{tag}");
        let seq: Vec<u32> = (0..14).map(|k| (k * 53 + 7) % 300).collect();
        let mut st = m.new_state(KvType::F32);
        let (_, hidden) = m.forward_hidden(&mut st, &seq[..13], 0).unwrap();
        // Pairs (R_p, t_{p+1}), p = 0..13.
        let toks = &seq[1..];
        let mut ms = head.new_state(KvType::F32);
        let got = head.forward(&m, &mut ms, toks, &hidden, true).unwrap();
        let mg = GgufFile::open(&mp).unwrap();
        let (want, want_r) = reference(&cfg, &mg, &m.file, toks, &hidden);
        let (worst, at) = rel_err(&got.logits, &want);
        eprintln!("{tag}: max |Δlogit| / scale {worst:.3e} at {at}");
        assert!(
            worst <= TOL_REL,
            "{tag}: max |Δlogit| {worst} (relative) at position {} token {} > {TOL_REL}",
            at / cfg.n_vocab,
            at % cfg.n_vocab
        );
        let (worst, _) = rel_err(&got.hidden, &want_r);
        assert!(worst <= TOL_REL, "{tag}: output residual off by {worst}");

        // A chained step: the head's own output residual is the next pair's input.
        let w = head.width();
        let d = 17u32;
        let r_last = got.hidden[got.hidden.len() - w..].to_vec();
        let mut chained = ms.clone();
        let o = head.forward(&m, &mut chained, &[d], &r_last, false).unwrap();
        let mut toks2 = toks.to_vec();
        toks2.push(d);
        let mut wide2 = hidden.clone();
        wide2.extend_from_slice(&r_last);
        let (want2, _) = reference(&cfg, &mg, &m.file, &toks2, &wide2);
        let (worst, _) = rel_err(&o.logits, &want2[toks.len() * cfg.n_vocab..]);
        assert!(worst <= TOL_REL, "{tag}: chained step off by {worst}");

        // Batch invariance: one pair per call gives the same bits, and so does truncating the
        // last 5 cells and running them again (the drafter's rollback).
        let mut one = head.new_state(KvType::F32);
        let mut rows = Vec::new();
        for p in 0..toks.len() {
            let o = head.forward(&m, &mut one, &toks[p..p + 1], &hidden[p * w..(p + 1) * w], false).unwrap();
            rows.extend(o.logits);
        }
        assert!(rows == got.logits, "{tag}: single-pair calls differ from one batch");
        assert!(one == ms, "{tag}: cache differs");
        head.truncate(&mut one, 9);
        assert_eq!(head.cells(&one), 9);
        let o = head.forward(&m, &mut one, &toks[9..], &hidden[9 * w..], true).unwrap();
        assert!(o.logits[..] == got.logits[9 * cfg.n_vocab..], "{tag}: redo after truncate");
        assert!(one == ms, "{tag}: cache after truncate + redo");
    }
}

/// Misuse gives typed errors, not panics: a hidden input of the wrong length, a token outside
/// the vocabulary, a different model than the one the head was loaded for.
#[test]
fn mtp_forward_rejects_bad_inputs() {
    use strata::EngineError;
    let (cfg, m, mp) = setup("misuse", true, &SynthMtp::default());
    let head = Mtp::open(&m, &mp).unwrap();
    let e = cfg.n_embd;
    let mut st = head.new_state(KvType::F16);
    let r = head.forward(&m, &mut st, &[1, 2], &vec![0.5; e], false);
    assert!(matches!(r, Err(EngineError::MtpInput { got, tokens: 2, .. }) if got == e), "{r:?}");
    let r = head.forward(&m, &mut st, &[300], &vec![0.5; e], false);
    assert!(matches!(r, Err(EngineError::BadTokenAt { token: 300, .. })), "{r:?}");
    let other = write(&SynthConfig::public(), 1, &tmp("misuse-public"), false).unwrap();
    let other = Qwen4Exp::open(&other[0]).unwrap();
    let r = head.forward(&other, &mut st, &[1], &vec![0.5; e], false);
    assert!(matches!(r, Err(EngineError::MtpMismatch { .. })), "{r:?}");
    assert_eq!(head.cells(&st), 0, "failed calls must not touch the cache");
}

/// The head also runs on an F16 cache with Q8_0 weights, finite and batch-invariant; a file
/// that carries the published heads' `indexer.*` tensors (and a compress ratio) loads, with
/// the attention dense as llama.cpp runs it; a model file that stores the NextN block itself
/// serves as its own MTP file.
#[test]
fn mtp_sparse_f16_and_embedded_block() {
    let mut cfg = SynthConfig::tiny();
    cfg.tied = true;
    let paths = write(&cfg, 22, &tmp("trunk-sparse"), false).unwrap();
    let m = Qwen4Exp::open(&paths[0]).unwrap();
    let mp = tmp("mtp-sparse.gguf");
    let sm = SynthMtp { ratio: 2, matrix_type: quant::GgmlType::Q8_0, ..SynthMtp::default() };
    write_mtp(&cfg, &sm, 6, &mp).unwrap();
    let head = Mtp::open(&m, &mp).unwrap();
    assert!(head.attn.indexer.is_none(), "the head attends densely");
    assert!(head.file.tensor("blk.4.indexer.q_proj.weight").is_some());
    let seq: Vec<u32> = (0..40).map(|k| (k * 31 + 3) % 300).collect();
    let mut st = m.new_state(KvType::F16);
    let (_, hidden) = m.forward_hidden(&mut st, &seq[..39], 0).unwrap();
    let w = head.width();
    let mut a = head.new_state(KvType::F16);
    let all = head.forward(&m, &mut a, &seq[1..], &hidden, true).unwrap();
    assert!(all.logits.iter().all(|x| x.is_finite()));
    let mut b = head.new_state(KvType::F16);
    for p in 0..39 {
        let o = head.forward(&m, &mut b, &seq[p + 1..p + 2], &hidden[p * w..(p + 1) * w], false).unwrap();
        assert!(o.logits[..] == all.logits[p * cfg.n_vocab..(p + 1) * cfg.n_vocab], "pair {p}");
    }
    assert!(a == b);
    head.truncate(&mut b, 25);
    head.forward(&m, &mut b, &seq[26..], &hidden[25 * w..], false).unwrap();
    assert!(a == b, "cache after truncate + redo");

    // Trunk + NextN block in one file (as the real checkpoints ship): loads as a model (the
    // block is skipped) and as its own MTP file.
    let g = GgufFile::open(&paths[0]).unwrap();
    let hg = GgufFile::open(&mp).unwrap();
    let mut w = gguf::GgufWriter::new();
    for (k, v) in g.metadata() {
        let v = match k.as_str() {
            "qwen4exp.block_count" => gguf::Value::U32(5),
            "qwen4exp.attention.recurrent_layers" | "qwen4exp.attention.compress_ratios" => hg.get(k).unwrap().clone(),
            _ => v.clone(),
        };
        w.add_metadata(k.clone(), v);
    }
    w.add_metadata("qwen4exp.nextn_predict_layers", gguf::Value::U32(1));
    for t in g.tensors().iter().chain(hg.tensors()) {
        let src = if g.tensor(&t.name).is_some() { &g } else { &hg };
        w.add_tensor(t.name.clone(), &t.dims, t.ty, src.tensor_data(t).to_vec());
    }
    let both = tmp("trunk-with-nextn.gguf");
    w.write(&both).unwrap();
    let m2 = Qwen4Exp::open(&both).unwrap();
    assert_eq!((m2.hp.n_layer, m2.hp.n_nextn), (4, 1));
    let head2 = Mtp::open(&m2, &both).unwrap();
    let mut c = head2.new_state(KvType::F16);
    let again = head2.forward(&m2, &mut c, &seq[1..], &hidden, true).unwrap();
    assert!(again == all, "embedded NextN block differs from the separate file");
}
