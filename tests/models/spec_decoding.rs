//! Speculative decoding is lossless: greedy output with `--spec N` (N = 1..8, several
//! `--spec-min-p`) is token-for-token identical to plain greedy decoding (prompt in one call,
//! then one token per call), and so is the final sequence state, on every tiny qwen4exp model:
//! the llama.cpp fixtures (f32, q8_0 two-shard) and synthetic models whose greedy output
//! repeats, so that suffix drafts are accepted. An oracle drafter that is right for the first
//! j drafts of every window and wrong at j forces rejections mid-window (GDN/PLE rollback).
//! The plain greedy ids of the f32 fixture are also llama.cpp's (models_qwen4exp checks that),
//! so the speculative ids are checked against llama.cpp too. Sampled speculation on the f32
//! fixture is distributed as the model's sampling distribution (a chi-square test over 2000 seeds;
//! the toy-model tests with negative controls are in `strata::spec`'s unit tests).

use std::path::{Path, PathBuf};

use strata::cpu::CpuQwen4Exp;
use strata::cpu::prelude::*;
use strata::model::qwen4exp::{KvType, Qwen4Exp, SeqState};
use strata::sampler::{Sampler, SamplerConfig};
use strata::spec::{
    Draft, Drafter, SpecConfig, SpecStats, SuffixDrafter, VerifyModel, generate_greedy_spec, generate_spec,
};
use strata::synth::qwen4exp::{SynthConfig, write};

fn ref_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/reference/tiny-qwen4exp")
}

fn ref_tokens(variant: &str) -> Vec<(Vec<u32>, Vec<u32>)> {
    let j: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ref_dir().join("ref").join(variant).join("ref.json")).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    j["sequences"].as_array().unwrap().iter().map(|s| (ids(&s["token_ids"]), ids(&s["greedy_ids"]))).collect()
}

fn plain(m: &Qwen4Exp, kv: KvType, prompt: &[u32], n: usize) -> (Vec<u32>, SeqState) {
    let mut st = m.new_state(kv);
    let ids = m.generate_greedy(&mut st, prompt, n).unwrap();
    (ids, st)
}

fn spec<D: Drafter>(
    m: &CpuQwen4Exp,
    kv: KvType,
    prompt: &[u32],
    n: usize,
    d: &mut D,
    cfg: SpecConfig,
) -> (Vec<u32>, SeqState, SpecStats) {
    let mut st = crate::support::session(m, kv, prompt.len() + n);
    let (ids, stats) = generate_greedy_spec(m as &dyn strata::engine::LoadedModel, &mut st, prompt, n, d, cfg).unwrap();
    (ids, crate::support::qwen4exp_state(&*st).clone(), stats)
}

/// Checks every N in 1..=8 and min-p in `min_ps`; returns the summed stats.
fn check_all(m: &CpuQwen4Exp, kv: KvType, prompt: &[u32], n: usize, what: &str) -> SpecStats {
    let (want, want_st) = plain(&m.0, kv, prompt, n);
    eprintln!("{what}: greedy {want:?}");
    let mut total = SpecStats::default();
    for n_draft in 1..=8 {
        for min_p in [0.0f32, 0.5, 1.0] {
            let mut d = SuffixDrafter { min_match: 1, ..SuffixDrafter::default() };
            let cfg = SpecConfig { n_draft, min_p };
            let (got, st, s) = spec(m, kv, prompt, n, &mut d, cfg);
            assert_eq!(got, want, "{what}: N={n_draft} min_p={min_p}: ids differ ({s:?})");
            assert!(st == want_st, "{what}: N={n_draft} min_p={min_p}: final state differs");
            assert_eq!(s.decoded as usize, n - 1);
            eprintln!(
                "  {what} N={n_draft} min_p={min_p}: acceptance {:.3} tokens/verify {:.3} drafted {} rollbacks {}",
                s.acceptance_rate(),
                s.tokens_per_verify(),
                s.drafted,
                s.rollbacks
            );
            assert!(s.drafted >= s.accepted);
            assert_eq!(s.verify_steps + s.accepted, s.decoded);
            total.verify_steps += s.verify_steps;
            total.windows_with_drafts += s.windows_with_drafts;
            total.drafted += s.drafted;
            total.accepted += s.accepted;
            total.rollbacks += s.rollbacks;
            total.rollback_tokens += s.rollback_tokens;
            total.decoded += s.decoded;
        }
    }
    eprintln!(
        "{what}: acceptance {:.3}, tokens/verify {:.3}, {total:?}",
        total.acceptance_rate(),
        total.tokens_per_verify()
    );
    total
}

#[test]
fn spec_lossless_on_llama_cpp_fixtures() {
    for (file, variant, kv) in [
        ("tiny-qwen4exp-public-f32.gguf", "f32", KvType::F16),
        ("tiny-qwen4exp-public-f32.gguf", "f32-kvf32", KvType::F32),
        ("tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf", "q8_0-split", KvType::F16),
    ] {
        let m = CpuQwen4Exp(Qwen4Exp::open(&ref_dir().join(file)).unwrap());
        // seq1 (8 tokens) only on the f32 model; seq2 (64 tokens, an EOS inside) everywhere:
        // its suffix drafts exist and are rejected, which exercises the rollback.
        let seqs = ref_tokens(variant);
        let first = if variant == "f32" { 0 } else { 1 };
        for (i, (prompt, greedy)) in seqs.into_iter().enumerate().take(2).skip(first) {
            let n = greedy.len();
            check_all(&m, kv, &prompt, n, &format!("{variant} seq{}", i + 1));
            if variant != "q8_0-split" {
                // Plain greedy == llama.cpp's ids here, so speculative ids are llama.cpp's too.
                let (ids, _) = plain(&m.0, kv, &prompt, n);
                assert_eq!(ids, greedy);
            }
        }
    }
}

/// Proposes the true greedy continuation but corrupts the draft at window index `wrong_at`:
/// every window with more than `wrong_at` drafts is rejected there.
struct Oracle {
    truth: Vec<u32>,
    wrong_at: usize,
    n_vocab: u32,
}

impl Drafter for Oracle {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<Draft> {
        let at = history.len();
        (0..max)
            .filter_map(|i| self.truth.get(at + i).map(|&t| (i, t)))
            .map(|(i, t)| Draft { token: if i == self.wrong_at { (t + 1) % self.n_vocab } else { t }, p: 1.0 })
            .collect()
    }
}

#[test]
fn spec_rollback_mid_window_is_lossless() {
    for (file, kv) in [
        ("tiny-qwen4exp-public-f32.gguf", KvType::F16),
        ("tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf", KvType::F16),
    ] {
        let m = CpuQwen4Exp(Qwen4Exp::open(&ref_dir().join(file)).unwrap());
        // seq2 holds an EOS (PLE n-gram cut), and its continuation crosses a QSA block edge.
        let prompt = ref_tokens("f32")[1].0.clone();
        let n = 24;
        let (want, want_st) = plain(&m.0, kv, &prompt, n);
        let mut truth = prompt.clone();
        truth.extend_from_slice(&want);
        for n_draft in [1, 2, 3, 5, 8] {
            for wrong_at in 0..=n_draft {
                let mut d = Oracle { truth: truth.clone(), wrong_at, n_vocab: m.0.n_vocab() as u32 };
                let cfg = SpecConfig { n_draft, min_p: 0.0 };
                let (got, st, s) = spec(&m, kv, &prompt, n, &mut d, cfg);
                assert_eq!(got, want, "{file} N={n_draft} wrong_at={wrong_at}: {s:?}");
                assert!(st == want_st, "{file} N={n_draft} wrong_at={wrong_at}: state");
                if wrong_at < n_draft {
                    // Every full window accepts exactly wrong_at drafts, then rolls back.
                    assert!(s.rollbacks > 0, "{s:?}");
                    assert!(s.accepted <= s.windows_with_drafts * wrong_at as u64);
                    if wrong_at > 0 {
                        assert!(s.accepted > 0, "{s:?}");
                    }
                } else {
                    // The oracle is right: every draft accepted, no rollback.
                    assert_eq!((s.rollbacks, s.accepted), (0, s.drafted), "{s:?}");
                    let ideal = (n - 1).div_ceil(n_draft + 1) as u64;
                    assert_eq!(s.verify_steps, ideal, "{s:?}");
                }
            }
        }
    }
}

fn tmp(name: &str) -> PathBuf {
    crate::support::scratch_dir("spec").join(name)
}

/// Synthetic models (the public shape with a tied head). Their greedy output repeats the last
/// prompt token (the tied head favours the current token; untied random models do not repeat
/// at all), which the suffix drafter predicts after first proposing, and having rejected, the
/// prompt's own pattern: accepted drafts, long windows and rollbacks in one run.
#[test]
fn spec_lossless_with_accepted_drafts_on_synth_models() {
    for (i, (ty, split)) in [(quant::GgmlType::F32, false), (quant::GgmlType::Q8_0, true)].into_iter().enumerate() {
        let mut cfg = SynthConfig::public();
        cfg.matrix_type = ty;
        cfg.tied = true;
        let paths = write(&cfg, 11 + i as u64, &tmp(&format!("synth-{i}")), split).unwrap();
        let m = CpuQwen4Exp(Qwen4Exp::open(&paths[0]).unwrap());
        let base: Vec<u32> = (0..12).map(|k| (k * 37 + 5) % 1000).collect();
        let mut prompt = base.clone();
        prompt.extend_from_slice(&base);
        prompt.extend_from_slice(&base[..6]);
        let s = check_all(&m, KvType::F16, &prompt, 40, &format!("synth {ty:?}"));
        assert!(s.accepted > 0, "synth {ty:?}: no draft accepted: {s:?}");
        assert!(s.tokens_per_verify() > 1.0);
    }
}

#[test]
fn spec_suffix_drafter_probabilities() {
    let mut d = SuffixDrafter::default();
    // "1 2" occurred twice, followed by 3 both times: p = 1. Then "1 2 3" occurred twice,
    // followed by 9 and 7: tie, the most recent (7) with p = 1/2. Then "3 7" (as the longest
    // match "1 2 3 7") occurred once, followed by 1.
    let h = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2];
    let got = d.propose(&h, 3);
    let want = [(3, 1.0), (7, 0.5), (1, 1.0)];
    assert_eq!(got.iter().map(|x| (x.token, x.p)).collect::<Vec<_>>(), want.to_vec());
    // Nothing matched (every suffix of length ≥ 2 is new): no draft.
    assert!(d.propose(&[1, 2, 3, 4], 4).is_empty());
    // min_match 1 matches single tokens; the most frequent follower wins over the most recent.
    let d1 = SuffixDrafter { min_match: 1, ..SuffixDrafter::default() };
    let got = d1.predict(&[5, 6, 5, 6, 5, 8, 4, 5]).unwrap();
    assert_eq!((got.token, got.p), (6, 2.0 / 3.0));
    assert!(d.propose(&[], 4).is_empty());
}

/// A KV-only style model (rollback = truncation, nothing recomputed) whose next token is a
/// fixed function of the last token: checks the generic loop, `min_p` windows and the counters
/// against hand-derived values.
struct Cycle {
    next: Vec<u32>,
}

impl strata::spec::VerifyModel for Cycle {
    type State = Vec<u32>;
    type Checkpoint = usize;
    type Error = String;
    fn n_vocab(&self) -> usize {
        self.next.len()
    }
    fn position(&self, st: &Vec<u32>) -> usize {
        st.len()
    }
    fn forward(&self, st: &mut Vec<u32>, tokens: &[u32]) -> Result<Vec<f32>, String> {
        let v = self.next.len();
        let mut out = vec![0f32; tokens.len() * v];
        for (i, &t) in tokens.iter().enumerate() {
            st.push(t);
            out[i * v + self.next[t as usize] as usize] = 1.0;
        }
        Ok(out)
    }
    fn checkpoint(&self, st: &Vec<u32>) -> usize {
        st.len()
    }
    fn rollback(&self, st: &mut Vec<u32>, cp: usize, keep: &[u32]) -> Result<usize, String> {
        st.truncate(cp + keep.len());
        Ok(0)
    }
}

#[test]
fn spec_generic_loop_min_p_and_counters() {
    // 0→1→2→3→0 cycle.
    let m = Cycle { next: vec![1, 2, 3, 0] };
    let prompt = [0, 1, 2, 3, 0, 1];
    let n = 13;
    let want: Vec<u32> = (0..n as u32).map(|i| (i + 2) % 4).collect();
    for (n_draft, min_p) in [(1, 0.0), (3, 0.0), (8, 0.0), (8, 1.0)] {
        let mut st = Vec::new();
        let mut d = SuffixDrafter::default();
        let cfg = SpecConfig { n_draft, min_p };
        let (got, s) = generate_greedy_spec(&m, &mut st, &prompt, n, &mut d, cfg).unwrap();
        assert_eq!(got, want);
        assert_eq!(st.len(), prompt.len() + n - 1);
        // The cycle is fully predictable (p = 1): every draft accepted, windows full.
        assert_eq!((s.accepted, s.rollbacks), (s.drafted, 0));
        assert_eq!(s.verify_steps, (n as u64 - 1).div_ceil(n_draft as u64 + 1));
    }
    // After "0 1" this history continued once with 3, once with 2: the suffix drafter gives
    // the newer follower 2 with p = 1/2, so min_p 0.5 admits it and 0.6 does not.
    let m = Cycle { next: vec![1, 2, 3, 0, 0, 0, 0, 0] };
    let h = [5, 0, 1, 3, 6, 0, 1, 2, 7, 0, 1];
    let d = SuffixDrafter::default();
    let p = d.predict(&h).unwrap();
    assert_eq!((p.token, p.p), (2, 0.5));
    let prompt = &h[..h.len() - 1]; // ends in 0: the prompt pass yields 1
    for (min_p, drafted, steps) in [(0.0f32, 1, 1), (0.5, 1, 1), (0.6, 0, 2)] {
        let mut st = Vec::new();
        let mut d = SuffixDrafter::default();
        let cfg = SpecConfig { n_draft: 1, min_p };
        let (got, s) = generate_greedy_spec(&m, &mut st, prompt, 3, &mut d, cfg).unwrap();
        assert_eq!(got, vec![1, 2, 3]);
        assert_eq!((s.drafted, s.accepted, s.verify_steps), (drafted, drafted, steps), "{min_p}");
    }
}

/// `generate --spec N` runs on the engine's own session, so `--ordered` (and every other run
/// option) applies to it: on a prompt where the ordered numerics change the greedy text of the
/// Q8_0 MoE model, `--spec 4 --ordered` prints the `--ordered` text, not the default one.
#[test]
fn cli_spec_honours_ordered() {
    let m =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/reference/tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf");
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
            .args([
                "generate",
                "-m",
                m.to_str().unwrap(),
                "-p",
                "Hello, my name is",
                "-n",
                "48",
                "--temp",
                "0",
                "--device",
                "cpu",
            ])
            .args(extra)
            .output()
            .expect("running strata");
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (fast, ordered) = (run(&[]), run(&["--ordered"]));
    assert_ne!(fast, ordered, "premise: the two modes give different greedy text on this prompt");
    assert_eq!(run(&["--ordered", "--spec", "4"]), ordered);
    assert_eq!(run(&["--spec", "4"]), fast);
}

/// Speculative sampling on a real model (the f32 llama.cpp fixture, top-k 3 at temperature 1,
/// repeat penalty on): over 2000 seeds the joint histogram of the first 3 generated tokens
/// (27 cells) passes a chi-square test (p < 1e-4 critical value) against the exact
/// distribution, computed from the model's logits for every prefix through
/// `Sampler::distribution`. The oracle drafter proposes the greedy continuation by position,
/// so both accepted drafts (bonus tokens) and rejections (GDN/PLE rollback) occur.
#[test]
fn spec_sampling_distribution_on_llama_cpp_fixture() {
    let m = CpuQwen4Exp(Qwen4Exp::open(&ref_dir().join("tiny-qwen4exp-public-f32.gguf")).unwrap());
    let loaded = &m as &dyn strata::engine::LoadedModel;
    let v = VerifyModel::n_vocab(loaded);
    let prompt = ref_tokens("f32")[0].0.clone();
    let n = 3;
    let cfg = SamplerConfig {
        temperature: 1.0,
        top_k: 3,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.3,
        repeat_last_n: 64,
        seed: 0,
    };
    // Exact probabilities of every 3-token continuation.
    let mut exact: Vec<(Vec<u32>, f64)> = vec![(Vec::new(), 1.0)];
    for _ in 0..n {
        let mut next = Vec::new();
        for (seq, p) in exact {
            let toks: Vec<u32> = prompt.iter().chain(&seq).copied().collect();
            let mut st = crate::support::session(loaded, KvType::F16, toks.len() + 1);
            let l = VerifyModel::forward(loaded, &mut st, &toks).unwrap();
            let mut s = Sampler::new(cfg.clone());
            for &t in &toks {
                s.accept(t);
            }
            for (t, q) in s.distribution(&l[l.len() - v..]).cand {
                let mut seq = seq.clone();
                seq.push(t);
                next.push((seq, p * q as f64));
            }
        }
        exact = next;
    }
    assert_eq!(exact.len(), 27);
    let (want, _) = plain(&m.0, KvType::F16, &prompt, n + 2);
    let mut truth = prompt.clone();
    truth.extend_from_slice(&want);
    let seeds = 2000u64;
    let mut hist = std::collections::HashMap::<Vec<u32>, u64>::new();
    let mut total = SpecStats::default();
    for seed in 0..seeds {
        let mut st = crate::support::session(loaded, KvType::F16, prompt.len() + n);
        let mut d = Oracle { truth: truth.clone(), wrong_at: usize::MAX, n_vocab: v as u32 };
        let mut s = Sampler::new(SamplerConfig { seed, ..cfg.clone() });
        let sc = SpecConfig { n_draft: 2, min_p: 0.0 };
        let (ids, r) = generate_spec(loaded, &mut st, &prompt, n, &mut d, sc, &mut s).unwrap();
        total.drafted += r.drafted;
        total.accepted += r.accepted;
        total.rollbacks += r.rollbacks;
        total.windows_with_drafts += r.windows_with_drafts;
        *hist.entry(ids).or_insert(0) += 1;
    }
    eprintln!("{total:?}");
    assert!(total.accepted > 0 && total.rollbacks > 0 && total.windows_with_drafts > total.rollbacks, "{total:?}");
    // Cells expected fewer than 5 times are pooled.
    let (mut stat, mut bins, mut pool) = (0.0, 0, (0.0, 0.0));
    for (seq, p) in &exact {
        let e = p * seeds as f64;
        let o = *hist.get(seq).unwrap_or(&0) as f64;
        if e < 5.0 {
            pool = (pool.0 + o, pool.1 + e);
        } else {
            stat += (o - e) * (o - e) / e;
            bins += 1;
        }
    }
    if pool.1 > 0.0 {
        stat += (pool.0 - pool.1) * (pool.0 - pool.1) / pool.1;
        bins += 1;
    }
    assert_eq!(hist.keys().filter(|k| !exact.iter().any(|(s, _)| s == *k)).count(), 0, "impossible sequences");
    // The critical value at p = 1e-4 (Wilson–Hilferty; 59.0 for df 26).
    let df = (bins - 1) as f64;
    let a = 2.0 / (9.0 * df);
    let crit = df * (1.0 - a + 3.719 * a.sqrt()).powi(3);
    eprintln!("chi2 {stat:.1} df {df} critical {crit:.1}");
    assert!(stat < crit, "speculative sampling differs from the model's distribution: chi2 {stat:.1} >= {crit:.1}");
}
