//! Test data for the property tests: the project's one RNG (`rng::SplitMix64`) with this
//! suite's distributions (uniform in [0, 1), Box–Muller normals).
#![allow(dead_code)]

pub struct Rng(rng::SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(rng::SplitMix64::new(seed))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal.
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// Test rows of `n` values in several shapes: gaussian, uniform, gaussian with outliers,
/// all-positive, tiny magnitudes, constant, zeros.
pub fn rows(seed: u64, n: usize) -> Vec<(&'static str, Vec<f32>)> {
    let mut r = Rng::new(seed);
    let mut out = Vec::new();
    out.push(("gaussian", (0..n).map(|_| r.normal() as f32).collect()));
    out.push(("uniform", (0..n).map(|_| (r.uniform() * 2.0 - 1.0) as f32 * 3.0).collect()));
    out.push((
        "outliers",
        (0..n)
            .map(|_| {
                let v = r.normal() as f32 * 0.02;
                if r.uniform() < 0.01 { v * 50.0 } else { v }
            })
            .collect(),
    ));
    out.push(("positive", (0..n).map(|_| (r.uniform() as f32) * 0.5 + 0.1).collect()));
    out.push(("tiny", (0..n).map(|_| r.normal() as f32 * 1e-3).collect()));
    out.push(("constant", vec![0.75f32; n]));
    out.push(("zeros", vec![0.0f32; n]));
    out
}
