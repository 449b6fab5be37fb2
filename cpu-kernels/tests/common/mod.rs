//! Shared test helpers: test data from the project's one RNG (`rng::SplitMix64`) and a
//! scale-aware comparison.
#![allow(dead_code)]

pub struct Rng(rng::SplitMix64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(rng::SplitMix64::new(seed))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// Roughly normal (sum of 4 uniforms), with occasional outliers like real weights.
    pub fn normalish(&mut self) -> f32 {
        let s = self.uniform() + self.uniform() + self.uniform() + self.uniform();
        if self.next_u64().is_multiple_of(97) { s * 4.0 } else { s * 0.5 }
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.normalish()).collect()
    }
}

/// Max |got - want| relative to max |want| (a scale-aware max error); panics naming the first
/// index over `tol`, the context and both values.
pub fn assert_close(ctx: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{ctx}: length");
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        let bad = !g.is_finite() || ((g - w).abs() / scale) > tol;
        assert!(
            !bad,
            "{ctx}: index {i}: got {g}, want {w} (rel err {:.3e} > tol {tol:.1e}, scale {scale:.3e})",
            (g - w).abs() / scale
        );
    }
}
