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

/// `nb` blocks of a type without a quantizer (`quant` reads them only): random bytes with
/// finite f16 scales of magnitude 2^-5..2^3 (any other byte pattern is a valid block).
pub fn random_blocks(ty: quant::GgmlType, nb: usize, r: &mut Rng) -> Vec<u8> {
    use quant::GgmlType::*;
    let scale = |r: &mut Rng| {
        let v = r.next_u64();
        ((v & 1) << 15) as u16 | (((10 + (v >> 1) % 9) as u16) << 10) | ((v >> 8) & 0x3ff) as u16
    };
    let offsets: &[usize] = match ty {
        Q2K => &[80, 82],
        Q3K => &[108],
        IQ1M => &[],
        _ => &[0],
    };
    let bs = ty.type_size();
    let mut w: Vec<u8> = (0..nb * bs).map(|_| r.next_u64() as u8).collect();
    for b in w.chunks_exact_mut(bs) {
        for &o in offsets {
            b[o..o + 2].copy_from_slice(&scale(r).to_le_bytes());
        }
        if ty == IQ1M {
            // IQ1_M's f16 scale: nibble k is the top nibble of scale word k (bytes 48..56).
            let d = scale(r);
            for k in 0..4 {
                b[49 + 2 * k] = (b[49 + 2 * k] & 0x0f) | ((((d >> (4 * k)) & 0xf) as u8) << 4);
            }
        }
    }
    w
}
