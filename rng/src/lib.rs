//! The project's one small deterministic RNG (SplitMix64), below every other crate: synthetic
//! models, routing traces, the emulator's race schedules and the tests' random data are
//! reproducible from a seed. Not for sampling tokens (that is the engine's `sampler`).

/// SplitMix64 (Steele, Lea, Flood 2014): 64-bit state, passes BigCrush, trivially seedable.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1), never 0 (so `ln` of it is finite).
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    /// Uniform in `0..n` (n > 0; the modulo bias is negligible for the small n used here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in `0..n` (n > 0) by multiply-shift (the high word of `next · n`, no division).
    /// A different draw from [`Self::below`]'s, which synthetic models' bytes depend on.
    pub fn below_u64(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// Uniform in [-1, 1) in steps of 2^-23 (the top 24 bits): exact f32 test data.
    pub fn symmetric(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// `n` values uniform in [-scale, scale) ([`Self::symmetric`] times `scale`).
    pub fn symmetric_vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.symmetric() * scale).collect()
    }
    /// A normal sample (Box–Muller).
    pub fn normal(&mut self, mean: f64, std: f64) -> f32 {
        let (u, v) = (self.unit(), self.unit());
        (mean + std * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
    pub fn normals(&mut self, n: usize, mean: f64, std: f64) -> Vec<f32> {
        (0..n).map(|_| self.normal(mean, std)).collect()
    }
}

#[cfg(test)]
mod tests {
    /// The published SplitMix64 outputs for seed 1234567 (the reference implementation's test
    /// vector).
    #[test]
    fn splitmix64_reference_vector() {
        let mut r = super::SplitMix64(1234567);
        let got: Vec<u64> = (0..5).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            vec![
                6457827717110365317,
                3203168211198807973,
                9817491932198370423,
                4593380528125082431,
                16408922859458223821
            ]
        );
    }
}
