//! Token sampling in llama.cpp's default order: repetition penalty (over the last n tokens)
//! → top-k → top-p → min-p → temperature → draw from the softmax with a seeded RNG.
//! Temperature <= 0 is greedy: argmax after penalties, first index on ties.

use std::collections::VecDeque;

/// Sampling parameters (validated by the CLI layer).
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub struct SamplerConfig {
    /// <= 0: greedy.
    pub temperature: f32,
    /// 0: disabled.
    pub top_k: usize,
    /// 1.0: disabled.
    pub top_p: f32,
    /// 0.0: disabled.
    pub min_p: f32,
    /// 1.0: disabled.
    pub repeat_penalty: f32,
    /// How many previous tokens the penalty looks at (0: none).
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    pub fn greedy() -> Self {
        SamplerConfig { temperature: 0.0, ..Default::default() }
    }
}

/// xoshiro256** seeded through splitmix64: small, fast, reproducible across platforms.
#[derive(Clone, Debug)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }
    /// Uniform in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

pub struct Sampler {
    pub cfg: SamplerConfig,
    rng: Rng,
    history: VecDeque<u32>,
    cand: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let rng = Rng::new(cfg.seed);
        Sampler { cfg, rng, history: VecDeque::new(), cand: Vec::new() }
    }

    /// Records a token (prompt or generated) for the repetition penalty.
    pub fn accept(&mut self, tok: u32) {
        if self.cfg.repeat_last_n == 0 {
            return;
        }
        if self.history.len() == self.cfg.repeat_last_n {
            self.history.pop_front();
        }
        self.history.push_back(tok);
    }

    /// Whether this sampler is greedy (temperature <= 0: a point mass on the argmax).
    pub fn is_greedy(&self) -> bool {
        self.cfg.temperature <= 0.0
    }

    /// A uniform draw in [0, 1) from this sampler's RNG (speculative decoding's acceptance
    /// test draws here, so one seed reproduces a whole speculative run).
    pub fn uniform(&mut self) -> f32 {
        self.rng.next_f32()
    }

    /// The distribution [`Sampler::sample`] draws from for `logits` (not modified) given the
    /// recorded history: the candidates left after repetition penalty → top-k → top-p → min-p,
    /// with their softmax probabilities at the temperature, most likely first (lowest id on
    /// ties). Greedy: a point mass on the argmax after penalties (first index on ties).
    pub fn distribution(&mut self, logits: &[f32]) -> Distribution {
        let c = &self.cfg;
        let penalise = c.repeat_penalty != 1.0 && !self.history.is_empty();
        let adj = |id: usize, l: f32, hist: &VecDeque<u32>| -> f32 {
            if penalise && hist.contains(&(id as u32)) {
                if l > 0.0 { l / c.repeat_penalty } else { l * c.repeat_penalty }
            } else {
                l
            }
        };
        if c.temperature <= 0.0 {
            let mut best = (0usize, f32::NEG_INFINITY);
            for (i, &l) in logits.iter().enumerate() {
                let l = if penalise { adj(i, l, &self.history) } else { l };
                if l > best.1 {
                    best = (i, l);
                }
            }
            return Distribution { cand: vec![(best.0 as u32, 1.0)] };
        }
        self.cand.clear();
        self.cand.extend(
            logits.iter().enumerate().map(|(i, &l)| (i as u32, if penalise { adj(i, l, &self.history) } else { l })),
        );
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        // top-k
        if c.top_k > 0 && c.top_k < self.cand.len() {
            self.cand.select_nth_unstable_by(c.top_k - 1, by_logit);
            self.cand.truncate(c.top_k);
        }
        self.cand.sort_unstable_by(by_logit);
        // Probabilities at temperature 1 (llama.cpp applies top-p / min-p before temperature).
        let probs = |cand: &[(u32, f32)]| -> Vec<f32> {
            let m = cand[0].1;
            let e: Vec<f32> = cand.iter().map(|x| (x.1 - m).exp()).collect();
            let s: f32 = e.iter().sum();
            e.into_iter().map(|x| x / s).collect()
        };
        if c.top_p < 1.0 {
            let p = probs(&self.cand);
            let mut cum = 0.0;
            let mut keep = p.len();
            for (i, pi) in p.iter().enumerate() {
                cum += pi;
                if cum >= c.top_p {
                    keep = i + 1;
                    break;
                }
            }
            self.cand.truncate(keep.max(1));
        }
        if c.min_p > 0.0 {
            // p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p)
            let thr = self.cand[0].1 + c.min_p.ln();
            let keep = self.cand.iter().take_while(|x| x.1 >= thr).count();
            self.cand.truncate(keep.max(1));
        }
        for x in self.cand.iter_mut() {
            x.1 /= c.temperature;
        }
        let p = probs(&self.cand);
        Distribution { cand: self.cand.iter().zip(p).map(|(x, p)| (x.0, p)).collect() }
    }

    /// Picks the next token from `logits` (not modified): one draw from
    /// [`Sampler::distribution`] (greedy draws nothing from the RNG).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let d = self.distribution(logits);
        if self.is_greedy() { d.cand[0].0 } else { d.draw(self.rng.next_f32()) }
    }
}

/// A sampler's final distribution over the next token (see [`Sampler::distribution`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Distribution {
    /// (token, probability), most likely first; at least one entry, probabilities sum to ~1.
    pub cand: Vec<(u32, f32)>,
}

impl Distribution {
    /// The probability of `tok` (0 outside the candidates).
    pub fn prob(&self, tok: u32) -> f32 {
        self.cand.iter().find(|x| x.0 == tok).map_or(0.0, |x| x.1)
    }

    /// The token whose cumulative probability first exceeds `u` ∈ [0, 1) (the last candidate
    /// when rounding leaves the sum below `u`).
    pub fn draw(&self, u: f32) -> u32 {
        let mut cum = 0.0;
        for &(t, p) in &self.cand {
            cum += p;
            if u < cum {
                return t;
            }
        }
        self.cand[self.cand.len() - 1].0
    }

    /// A draw with uniform `u` ∈ [0, 1) from this distribution with `tok` removed and the rest
    /// renormalised (speculative sampling's residual for a point-mass draft `tok`); `tok` itself
    /// when nothing else has probability.
    pub fn draw_without(&self, tok: u32, u: f32) -> u32 {
        let total: f32 = self.cand.iter().filter(|x| x.0 != tok).map(|x| x.1).sum();
        if !(total > 0.0) {
            return tok;
        }
        let target = u * total;
        let mut cum = 0.0;
        let mut last = tok;
        for &(t, p) in self.cand.iter().filter(|x| x.0 != tok) {
            cum += p;
            last = t;
            if target < cum {
                return t;
            }
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_first_max() {
        let mut s = Sampler::new(SamplerConfig::greedy());
        assert_eq!(s.sample(&[0.0, 3.0, 3.0, 1.0]), 1);
    }

    #[test]
    fn penalty_changes_choice() {
        let mut s = Sampler::new(SamplerConfig { repeat_penalty: 2.0, ..SamplerConfig::greedy() });
        s.accept(1);
        assert_eq!(s.sample(&[0.0, 3.0, 2.0]), 2);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_respects_top_k() {
        let logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.5).collect();
        let cfg = SamplerConfig { temperature: 1.0, top_k: 5, top_p: 1.0, min_p: 0.0, seed: 42, ..Default::default() };
        let (mut a, mut b) = (Sampler::new(cfg.clone()), Sampler::new(cfg));
        for _ in 0..50 {
            let (x, y) = (a.sample(&logits), b.sample(&logits));
            assert_eq!(x, y);
            assert_eq!(x % 7, 6, "top-5 are all logit-3.0 tokens");
        }
    }

    /// `sample` as it was before [`Sampler::distribution`] existed (inlined), for
    /// [`sample_is_unchanged_for_a_seed`].
    fn old_sample(cfg: &SamplerConfig, rng: &mut Rng, history: &VecDeque<u32>, logits: &[f32]) -> u32 {
        let c = cfg;
        let penalise = c.repeat_penalty != 1.0 && !history.is_empty();
        let adj = |id: usize, l: f32| -> f32 {
            if penalise && history.contains(&(id as u32)) {
                if l > 0.0 { l / c.repeat_penalty } else { l * c.repeat_penalty }
            } else {
                l
            }
        };
        if c.temperature <= 0.0 {
            let mut best = (0usize, f32::NEG_INFINITY);
            for (i, &l) in logits.iter().enumerate() {
                let l = adj(i, l);
                if l > best.1 {
                    best = (i, l);
                }
            }
            return best.0 as u32;
        }
        let mut cand: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, adj(i, l))).collect();
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if c.top_k > 0 && c.top_k < cand.len() {
            cand.select_nth_unstable_by(c.top_k - 1, by_logit);
            cand.truncate(c.top_k);
        }
        cand.sort_unstable_by(by_logit);
        let probs = |cand: &[(u32, f32)]| -> Vec<f32> {
            let m = cand[0].1;
            let e: Vec<f32> = cand.iter().map(|x| (x.1 - m).exp()).collect();
            let s: f32 = e.iter().sum();
            e.into_iter().map(|x| x / s).collect()
        };
        if c.top_p < 1.0 {
            let p = probs(&cand);
            let mut cum = 0.0;
            let mut keep = p.len();
            for (i, pi) in p.iter().enumerate() {
                cum += pi;
                if cum >= c.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if c.min_p > 0.0 {
            let thr = cand[0].1 + c.min_p.ln();
            let keep = cand.iter().take_while(|x| x.1 >= thr).count();
            cand.truncate(keep.max(1));
        }
        for x in cand.iter_mut() {
            x.1 /= c.temperature;
        }
        let p = probs(&cand);
        let r = rng.next_f32();
        let mut cum = 0.0;
        for (i, pi) in p.iter().enumerate() {
            cum += pi;
            if r < cum {
                return cand[i].0;
            }
        }
        cand[cand.len() - 1].0
    }

    /// One definition of the distribution did not change what a seed samples: over random
    /// logits and configs (every stage on and off, penalties, greedy) the tokens equal the
    /// former implementation's, draw for draw.
    #[test]
    fn sample_is_unchanged_for_a_seed() {
        let mut r = Rng::new(5);
        for case in 0..200u64 {
            let pick = |r: &mut Rng, xs: &[f32]| xs[(r.next_u64() % xs.len() as u64) as usize];
            let cfg = SamplerConfig {
                temperature: pick(&mut r, &[0.0, 0.3, 0.8, 1.0, 1.7]),
                top_k: [0, 1, 3, 40][(r.next_u64() % 4) as usize],
                top_p: pick(&mut r, &[1.0, 0.95, 0.5, 0.1]),
                min_p: pick(&mut r, &[0.0, 0.05, 0.3]),
                repeat_penalty: pick(&mut r, &[1.0, 1.1, 1.5]),
                repeat_last_n: [0, 4, 64][(r.next_u64() % 3) as usize],
                seed: case,
            };
            let v = 2 + (r.next_u64() % 60) as usize;
            let mut s = Sampler::new(cfg.clone());
            let (mut rng, mut hist) = (Rng::new(cfg.seed), VecDeque::new());
            for _ in 0..30 {
                let logits: Vec<f32> = (0..v).map(|_| (r.next_f32() - 0.5) * 8.0).collect();
                let want = old_sample(&cfg, &mut rng, &hist, &logits);
                let got = s.sample(&logits);
                assert_eq!(got, want, "{cfg:?}");
                s.accept(got);
                if cfg.repeat_last_n > 0 {
                    if hist.len() == cfg.repeat_last_n {
                        hist.pop_front();
                    }
                    hist.push_back(got);
                }
            }
        }
    }

    #[test]
    fn distribution_is_what_sample_draws_from() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, 0.0];
        let cfg = SamplerConfig { temperature: 0.9, top_k: 4, top_p: 0.9, min_p: 0.0, seed: 3, ..Default::default() };
        let mut s = Sampler::new(cfg.clone());
        let d = s.distribution(&logits);
        // Most likely first, lowest id on ties; top-k dropped id 2.
        assert_eq!(d.cand.iter().map(|x| x.0).collect::<Vec<_>>()[..2], [1, 3]);
        assert!((d.cand.iter().map(|x| x.1).sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(d.prob(2), 0.0);
        let mut rng = Rng::new(3);
        for _ in 0..100 {
            assert_eq!(s.sample(&logits), d.draw(rng.next_f32()));
        }
        // Greedy: a point mass on the argmax; the residual without the draft is what remains.
        let mut g = Sampler::new(SamplerConfig::greedy());
        let d = g.distribution(&logits);
        assert_eq!(d.cand, vec![(1, 1.0)]);
        assert_eq!(d.draw_without(3, 0.9), 1);
        let d = Distribution { cand: vec![(4, 0.5), (2, 0.3), (7, 0.2)] };
        assert_eq!(d.draw_without(4, 0.0), 2);
        assert_eq!(d.draw_without(4, 0.59), 2);
        assert_eq!(d.draw_without(4, 0.61), 7);
        assert_eq!(d.draw_without(2, 0.7), 4);
        assert_eq!(d.draw_without(2, 0.72), 7);
        assert_eq!(Distribution { cand: vec![(4, 1.0)] }.draw_without(4, 0.3), 4);
    }
}
