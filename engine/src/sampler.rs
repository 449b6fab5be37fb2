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

    /// Picks the next token from `logits` (not modified).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
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
            return best.0 as u32;
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
        let r = self.rng.next_f32();
        let mut cum = 0.0;
        for (i, pi) in p.iter().enumerate() {
            cum += pi;
            if r < cum {
                return self.cand[i].0;
            }
        }
        self.cand[self.cand.len() - 1].0
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
}
