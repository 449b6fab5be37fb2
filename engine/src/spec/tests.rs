//! Speculative sampling is distributed exactly as plain sampling: on a toy model whose logits
//! are a fixed function of (position, previous token), the histograms of the first token and of
//! the whole generated sequence over many seeds pass a chi-square test (p < 1e-4 critical value)
//! against the exact distribution, enumerated from the sampler's own [`Sampler::distribution`]
//! over every history. Plain sampling passes the same test (the reference is right), and the
//! same loop with wrong acceptance rules fails it (the test has power).

use std::collections::HashMap;

use super::*;

const V: usize = 5;
const PROMPT: [u32; 3] = [1, 3, 2];
const N_GEN: usize = 4;
const SEEDS: u64 = 20_000;

fn row(pos: usize, prev: u32) -> [f32; V] {
    std::array::from_fn(|j| ((pos * 7 + prev as usize * 3 + j * 5) % 11) as f32 * 0.3 - 1.0)
}

/// KV-only style: the state is the consumed tokens, rollback truncates.
struct Toy;

impl VerifyModel for Toy {
    type State = Vec<u32>;
    type Checkpoint = usize;
    type Error = String;
    fn n_vocab(&self) -> usize {
        V
    }
    fn position(&self, st: &Vec<u32>) -> usize {
        st.len()
    }
    fn forward(&self, st: &mut Vec<u32>, tokens: &[u32]) -> Result<Vec<f32>, String> {
        let mut out = Vec::with_capacity(tokens.len() * V);
        for &t in tokens {
            out.extend_from_slice(&row(st.len(), t));
            st.push(t);
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

/// Deterministic drafters: always the same token; the next ids cyclically; the toy model's
/// argmax chain (mostly accepted, so windows end in bonus tokens).
enum Toks {
    Fixed(u32),
    Cyclic,
    Argmax,
}

impl Drafter for Toks {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<Draft> {
        let mut prev = history[history.len() - 1];
        (0..max)
            .map(|i| {
                let t = match *self {
                    Toks::Fixed(t) => t,
                    Toks::Cyclic => (prev + 1) % V as u32,
                    Toks::Argmax => argmax(&row(history.len() - 1 + i, prev)),
                };
                prev = t;
                Draft { token: t, p: 1.0 }
            })
            .collect()
    }
}

fn configs() -> [SamplerConfig; 2] {
    let plain = SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 0,
        seed: 0,
    };
    // Every stage on: the penalty's history must hold the accepted drafts.
    let all = SamplerConfig {
        temperature: 0.7,
        top_k: 4,
        top_p: 0.95,
        min_p: 0.05,
        repeat_penalty: 1.6,
        repeat_last_n: 3,
        seed: 0,
    };
    [plain, all]
}

/// Exact probability of every generated sequence of `N_GEN` tokens.
fn exact(cfg: &SamplerConfig) -> HashMap<Vec<u32>, f64> {
    fn rec(cfg: &SamplerConfig, seq: &mut Vec<u32>, p: f64, out: &mut HashMap<Vec<u32>, f64>) {
        if seq.len() == N_GEN {
            out.insert(seq.clone(), p);
            return;
        }
        let mut s = Sampler::new(cfg.clone());
        let hist: Vec<u32> = PROMPT.iter().chain(seq.iter()).copied().collect();
        for &t in &hist {
            s.accept(t);
        }
        let d = s.distribution(&row(hist.len() - 1, hist[hist.len() - 1]));
        for (t, q) in d.cand {
            seq.push(t);
            rec(cfg, seq, p * q as f64, out);
            seq.pop();
        }
    }
    let mut out = HashMap::new();
    rec(cfg, &mut Vec::new(), 1.0, &mut out);
    out
}

/// Chi-square statistic of `obs` against probabilities `p` (cells with expected count < 5
/// pooled), its degrees of freedom, and the critical value at p = 1e-4 (Wilson–Hilferty).
/// An observation of probability 0 makes it infinite.
fn chi2(obs: &HashMap<Vec<u32>, u64>, p: &HashMap<Vec<u32>, f64>, n: u64) -> (f64, usize, f64) {
    // An observation of probability 0 is an infinite statistic.
    let impossible = obs.keys().filter(|k| !p.contains_key(*k)).count();
    let (mut stat, mut bins) = (if impossible > 0 { f64::INFINITY } else { 0.0 }, 0);
    let (mut pool_o, mut pool_e) = (0.0, 0.0);
    for (k, &pk) in p {
        let e = pk * n as f64;
        let o = *obs.get(k).unwrap_or(&0) as f64;
        if e < 5.0 {
            pool_o += o;
            pool_e += e;
        } else {
            stat += (o - e) * (o - e) / e;
            bins += 1;
        }
    }
    if pool_e > 0.0 {
        stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        bins += 1;
    }
    let df = bins - 1;
    let (k, z) = (df as f64, 3.719);
    let a = 2.0 / (9.0 * k);
    (stat, df, k * (1.0 - a + z * a.sqrt()).powi(3))
}

/// Histograms (first token, whole sequence) of `SEEDS` runs of `run(seed)`.
fn histograms(mut run: impl FnMut(u64) -> Vec<u32>) -> [HashMap<Vec<u32>, u64>; 2] {
    let mut h = [HashMap::new(), HashMap::new()];
    for seed in 0..SEEDS {
        let ids = run(seed);
        assert_eq!(ids.len(), N_GEN);
        *h[0].entry(ids[..1].to_vec()).or_insert(0) += 1;
        *h[1].entry(ids).or_insert(0) += 1;
    }
    h
}

fn first_marginal(p: &HashMap<Vec<u32>, f64>) -> HashMap<Vec<u32>, f64> {
    let mut m = HashMap::new();
    for (k, &q) in p {
        *m.entry(k[..1].to_vec()).or_insert(0.0) += q;
    }
    m
}

/// The largest (statistic / critical value) over the first-token and joint histograms.
fn worst(h: &[HashMap<Vec<u32>, u64>; 2], p: &HashMap<Vec<u32>, f64>, what: &str) -> f64 {
    let mut w: f64 = 0.0;
    for (name, obs, p) in [("first", &h[0], &first_marginal(p)), ("joint", &h[1], p)] {
        let (stat, df, crit) = chi2(obs, p, SEEDS);
        eprintln!("{what} {name}: chi2 {stat:.1} df {df} critical {crit:.1}");
        w = w.max(stat / crit);
    }
    w
}

fn spec_run(cfg: &SamplerConfig, d: &mut Toks, seed: u64, rule: fn(&mut Sampler, &[f32], u32) -> Verdict) -> Vec<u32> {
    let mut s = Sampler::new(SamplerConfig { seed, ..cfg.clone() });
    let (mut st, mut out) = (Vec::new(), Vec::new());
    let sc = SpecConfig { n_draft: 3, min_p: 0.0 };
    stream_spec_with(&Toy, &mut st, &PROMPT, N_GEN, d, sc, &mut s, rule, &mut |t| {
        out.push(t);
        true
    })
    .unwrap();
    out
}

fn plain_run(cfg: &SamplerConfig, seed: u64) -> Vec<u32> {
    let mut s = Sampler::new(SamplerConfig { seed, ..cfg.clone() });
    let mut hist = PROMPT.to_vec();
    for &t in &hist {
        s.accept(t);
    }
    for _ in 0..N_GEN {
        let t = s.sample(&row(hist.len() - 1, hist[hist.len() - 1]));
        s.accept(t);
        hist.push(t);
    }
    hist[PROMPT.len()..].to_vec()
}

#[test]
fn spec_sampling_matches_plain_sampling_chi_square() {
    for (ci, cfg) in configs().iter().enumerate() {
        let p = exact(cfg);
        let total: f64 = p.values().sum();
        assert!((total - 1.0).abs() < 1e-4, "{total}");
        let h = histograms(|seed| plain_run(cfg, seed));
        assert!(
            worst(&h, &p, &format!("cfg{ci} plain")) < 1.0,
            "cfg{ci}: plain sampling fails against the exact distribution"
        );
        for di in 0..3 {
            let mk = || match di {
                0 => Toks::Fixed(0),
                1 => Toks::Cyclic,
                _ => Toks::Argmax,
            };
            let mut stats = SpecStats::default();
            let h = histograms(|seed| {
                let mut s = Sampler::new(SamplerConfig { seed, ..cfg.clone() });
                let (mut st, mut d) = (Vec::new(), mk());
                let (ids, r) =
                    generate_spec(&Toy, &mut st, &PROMPT, N_GEN, &mut d, SpecConfig { n_draft: 3, min_p: 0.0 }, &mut s)
                        .unwrap();
                assert_eq!(st.len(), PROMPT.len() + N_GEN - 1);
                assert_eq!(st[PROMPT.len()..], ids[..N_GEN - 1]);
                stats.drafted += r.drafted;
                stats.accepted += r.accepted;
                stats.rollbacks += r.rollbacks;
                stats.windows_with_drafts += r.windows_with_drafts;
                ids
            });
            eprintln!("cfg{ci} drafter{di}: {stats:?}");
            // Both outcomes occur: rejections (rolled back) and windows accepted whole (bonus).
            assert!(stats.rollbacks > 0 && stats.windows_with_drafts > stats.rollbacks, "{stats:?}");
            assert!(stats.accepted > 0, "{stats:?}");
            let w = worst(&h, &p, &format!("cfg{ci} spec drafter{di}"));
            assert!(w < 1.0, "cfg{ci} drafter{di}: speculative sampling differs from the exact distribution");
        }
    }
}

/// Negative controls: the same loop with an acceptance rule that accepts every draft, or that
/// resamples a rejection from the full p (the draft included), is rejected by the statistic.
#[test]
fn spec_sampling_chi_square_rejects_wrong_rules() {
    fn accept_always(_: &mut Sampler, _: &[f32], _: u32) -> Verdict {
        Verdict::Accept
    }
    fn resample_full(s: &mut Sampler, row: &[f32], d: u32) -> Verdict {
        let p = s.distribution(row);
        if s.uniform() < p.prob(d) { Verdict::Accept } else { Verdict::Reject(p.draw(s.uniform())) }
    }
    for (ci, cfg) in configs().iter().enumerate() {
        let p = exact(cfg);
        for (name, rule) in [
            ("accept-always", accept_always as fn(&mut Sampler, &[f32], u32) -> Verdict),
            ("resample-full", resample_full),
        ] {
            let h = histograms(|seed| spec_run(cfg, &mut Toks::Cyclic, seed, rule));
            let w = worst(&h, &p, &format!("cfg{ci} {name}"));
            assert!(w > 1.0, "cfg{ci}: the wrong rule {name} passed the chi-square test");
        }
        // The right rule through the same entry point passes.
        let h = histograms(|seed| spec_run(cfg, &mut Toks::Cyclic, seed, verify_draft));
        assert!(worst(&h, &p, &format!("cfg{ci} verify_draft")) < 1.0);
    }
}

/// Greedy through the speculative loop equals plain greedy, whatever the drafter proposes, and
/// the counters add up.
#[test]
fn spec_greedy_equals_plain_greedy_on_toy() {
    let greedy = SamplerConfig { repeat_penalty: 1.3, repeat_last_n: 2, ..SamplerConfig::greedy() };
    for cfg in [SamplerConfig::greedy(), greedy] {
        let want = plain_run(&cfg, 0);
        for mut d in [Toks::Fixed(0), Toks::Fixed(4), Toks::Cyclic, Toks::Argmax] {
            for n_draft in 1..=4 {
                let mut st = Vec::new();
                let sc = SpecConfig { n_draft, min_p: 0.0 };
                let mut s = Sampler::new(cfg.clone());
                let (got, r) = generate_spec(&Toy, &mut st, &PROMPT, N_GEN, &mut d, sc, &mut s).unwrap();
                assert_eq!(got, want, "n_draft {n_draft}: {r:?}");
                assert_eq!(r.verify_steps + r.accepted, r.decoded);
            }
        }
    }
}
