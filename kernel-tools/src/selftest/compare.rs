//! How a device result is held against its CPU reference: one [`Comparison`] per output,
//! with the metric, the largest error under it, the tolerance and the elements outside it.
//! Pure functions (no device), so the pass/fail logic itself is unit-tested.

/// What `max_error` and `tolerance` of a [`Comparison`] measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Bit-identical f32 (NaNs compare by bits); `max_error` = largest `|gpu - cpu|` (0 when
    /// identical), tolerance 0.
    BitExact,
    /// Byte-identical buffers (quantized blocks, KV rows); `max_error` = largest difference of
    /// one byte as an integer (0..255), tolerance 0.
    ByteExact,
    /// Identical u16 halves (f16 / bf16 bit patterns); `max_error` = largest difference of the
    /// values they encode.
    HalfExact,
    /// Identical u32 (expert ids); `max_error` = largest integer difference.
    IdExact,
    /// `|gpu - cpu| <= tolerance`.
    Abs,
    /// `|gpu - cpu| / max(1, |cpu|) <= tolerance`.
    RelFloor1,
    /// `|gpu - cpu| / scale_i <= tolerance`, `scale_i` = sum of `|w_j * a_j|` of the dot.
    RelDotMagnitude,
    /// `|gpu - cpu| / bound_i <= tolerance` (1): the largest error of a correct kernel per
    /// output (`reference::DotRef::bound`, `reference::glu_reference`).
    RelBound,
}

impl Metric {
    pub fn name(self) -> &'static str {
        match self {
            Metric::BitExact => "bit-exact (max |gpu-cpu|)",
            Metric::ByteExact => "byte-exact (max byte difference)",
            Metric::HalfExact => "f16/bf16 bit-exact (max |gpu-cpu| of the values)",
            Metric::IdExact => "exact ids (max difference)",
            Metric::Abs => "absolute |gpu-cpu|",
            Metric::RelFloor1 => "relative |gpu-cpu| / max(1, |cpu|)",
            Metric::RelDotMagnitude => "relative to sum |w*a| of the dot",
            Metric::RelBound => "relative to the error bound (1 = at the bound)",
        }
    }
    pub fn is_exact(self) -> bool {
        matches!(self, Metric::BitExact | Metric::ByteExact | Metric::HalfExact | Metric::IdExact)
    }
}

/// One device output against its CPU reference.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// What was compared, e.g. `"y (8 columns)"`.
    pub what: String,
    pub metric: Metric,
    /// Largest error under `metric` (`f64::INFINITY` for a non-finite mismatch).
    pub max_error: f64,
    pub tolerance: f64,
    /// Elements outside the tolerance (exact metrics: elements that differ).
    pub mismatches: usize,
    /// Elements compared.
    pub elements: usize,
    /// The first element outside the tolerance (or a length mismatch), for the report.
    pub first_failure: Option<String>,
}

impl Comparison {
    pub fn pass(&self) -> bool {
        self.mismatches == 0 && self.first_failure.is_none()
    }
    /// `max_error / tolerance` (exact metrics: 0 when passing, infinite when not): which of
    /// several comparisons is the closest to failing.
    pub fn severity(&self) -> f64 {
        if !self.pass() {
            return f64::INFINITY;
        }
        if self.tolerance > 0.0 { self.max_error / self.tolerance } else { 0.0 }
    }
    fn new(what: &str, metric: Metric, tolerance: f64) -> Comparison {
        Comparison {
            what: what.to_string(),
            metric,
            max_error: 0.0,
            tolerance,
            mismatches: 0,
            elements: 0,
            first_failure: None,
        }
    }
    fn length(mut self, got: usize, want: usize) -> Option<Comparison> {
        if got == want {
            return None;
        }
        self.first_failure = Some(format!("length: gpu {got} elements, cpu {want}"));
        self.max_error = f64::INFINITY;
        Some(self)
    }
    fn note(&mut self, i: usize, err: f64, fails: bool, detail: impl FnOnce() -> String) {
        self.elements += 1;
        let err = if err.is_nan() { f64::INFINITY } else { err };
        self.max_error = self.max_error.max(err);
        if fails {
            self.mismatches += 1;
            if self.first_failure.is_none() {
                self.first_failure = Some(format!("element {i}: {}", detail()));
            }
        }
    }
}

fn diff(a: f64, b: f64) -> f64 {
    if a == b { 0.0 } else { (a - b).abs() }
}

/// f32 outputs that must be bit-identical.
pub fn bits_f32(what: &str, got: &[f32], want: &[f32]) -> Comparison {
    let mut c = Comparison::new(what, Metric::BitExact, 0.0);
    if let Some(c) = c.clone().length(got.len(), want.len()) {
        return c;
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let same = g.to_bits() == w.to_bits();
        let err = if same { 0.0 } else { diff(g as f64, w as f64) };
        c.note(i, err, !same, || format!("gpu {g:e} ({:#010x}), cpu {w:e} ({:#010x})", g.to_bits(), w.to_bits()));
    }
    c
}

/// Byte buffers that must be identical.
pub fn bytes(what: &str, got: &[u8], want: &[u8]) -> Comparison {
    let mut c = Comparison::new(what, Metric::ByteExact, 0.0);
    if let Some(c) = c.clone().length(got.len(), want.len()) {
        return c;
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        c.note(i, (g as f64 - w as f64).abs(), g != w, || format!("gpu byte {g:#04x}, cpu {w:#04x}"));
    }
    c
}

/// u16 halves (f16 when `bf16` is false, else bf16) that must be identical.
pub fn halves(what: &str, got: &[u16], want: &[u16], bf16: bool) -> Comparison {
    let mut c = Comparison::new(what, Metric::HalfExact, 0.0);
    if let Some(c) = c.clone().length(got.len(), want.len()) {
        return c;
    }
    let val = |h: u16| if bf16 { f32::from_bits((h as u32) << 16) as f64 } else { quant::f16_to_f32(h) as f64 };
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = if g == w { 0.0 } else { diff(val(g), val(w)) };
        c.note(i, err, g != w, || format!("gpu {g:#06x} ({}), cpu {w:#06x} ({})", val(g), val(w)));
    }
    c
}

/// u32 ids that must be identical.
pub fn ids(what: &str, got: &[u32], want: &[u32]) -> Comparison {
    let mut c = Comparison::new(what, Metric::IdExact, 0.0);
    if let Some(c) = c.clone().length(got.len(), want.len()) {
        return c;
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        c.note(i, (g as f64 - w as f64).abs(), g != w, || format!("gpu {g}, cpu {w}"));
    }
    c
}

/// `|gpu - cpu| <= tol`.
pub fn abs(what: &str, got: &[f32], want: &[f32], tol: f64) -> Comparison {
    scaled(what, Metric::Abs, got, want.iter().map(|&w| (w as f64, 1.0)), want.len(), tol)
}

/// `|gpu - cpu| / max(1, |cpu|) <= tol`.
pub fn rel_floor1(what: &str, got: &[f32], want: &[f32], tol: f64) -> Comparison {
    scaled(what, Metric::RelFloor1, got, want.iter().map(|&w| (w as f64, (w as f64).abs().max(1.0))), want.len(), tol)
}

/// `|gpu - cpu_i| / scale_i <= tol` for a reference in f64 with a per-element scale (sum
/// `|w*a|` of a dot: [`Metric::RelDotMagnitude`], or an error bound: [`Metric::RelBound`]).
pub fn rel_scaled(what: &str, metric: Metric, got: &[f32], want: &[f64], scale: &[f64], tol: f64) -> Comparison {
    if want.len() != scale.len() {
        let mut c = Comparison::new(what, metric, tol);
        c.first_failure = Some(format!("reference has {} values but {} scales", want.len(), scale.len()));
        c.max_error = f64::INFINITY;
        return c;
    }
    scaled(what, metric, got, want.iter().zip(scale).map(|(&w, &s)| (w, s + 1e-30)), want.len(), tol)
}

fn scaled(
    what: &str,
    metric: Metric,
    got: &[f32],
    want: impl Iterator<Item = (f64, f64)>,
    n: usize,
    tol: f64,
) -> Comparison {
    let mut c = Comparison::new(what, metric, tol);
    if let Some(c) = c.clone().length(got.len(), n) {
        return c;
    }
    for (i, (&g, (w, s))) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        // A non-finite result where the reference is finite (or the other way) always fails.
        let err = if g.is_finite() && w.is_finite() {
            diff(g, w) / s
        } else if g.to_bits() == w.to_bits() {
            0.0
        } else {
            f64::INFINITY
        };
        c.note(i, err, err.is_nan() || err > tol, || {
            format!("gpu {g:e}, cpu {w:e} (error {err:.3e}, tolerance {tol:.1e})")
        });
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_comparisons_pass_on_equal_and_fail_on_one_bit() {
        let a = [1.0f32, -0.0, f32::NAN, 3.5];
        assert!(bits_f32("x", &a, &a).pass());
        let mut b = a;
        b[3] = f32::from_bits(a[3].to_bits() + 1);
        let c = bits_f32("x", &b, &a);
        assert!(!c.pass() && c.mismatches == 1 && c.max_error > 0.0, "{c:?}");
        assert!(c.first_failure.as_deref().unwrap().starts_with("element 3"), "{c:?}");
        // -0.0 vs +0.0 differ in bits.
        assert!(!bits_f32("z", &[0.0], &[-0.0]).pass());
        assert!(!bytes("q", &[1, 2, 3], &[1, 2, 4]).pass());
        assert_eq!(bytes("q", &[1, 2, 3], &[1, 2, 4]).max_error, 1.0);
        assert!(!ids("i", &[3, 1], &[1, 3]).pass());
        assert!(!halves("h", &[0x3c00], &[0x3c01], false).pass());
        assert!(halves("h", &[0x3c00], &[0x3c00], true).pass());
    }

    #[test]
    fn tolerance_comparisons_hold_the_stated_bound() {
        let want = [1.0f32, 2.0, -4.0];
        let got = [1.0f32, 2.0 + 1e-7, -4.0];
        assert!(abs("x", &got, &want, 1e-6).pass());
        // A deliberately wrong expected value: off by 1e-3 against a 1e-6 tolerance.
        let wrong = [1.0f32, 2.001, -4.0];
        let c = abs("x", &got, &wrong, 1e-6);
        assert!(!c.pass() && c.mismatches == 1 && c.max_error > 9e-4, "{c:?}");
        assert!(c.severity().is_infinite());
        // Relative with a floor of 1: 1e-6 on 1000 is 1e-9 relative.
        assert!(rel_floor1("x", &[1000.001], &[1000.0], 2e-6).pass());
        assert!(!rel_floor1("x", &[0.001], &[0.0], 2e-6).pass());
        // Dot magnitude: the error is scaled by sum |w a|.
        let c = rel_scaled("y", Metric::RelDotMagnitude, &[1.5], &[1.0], &[1000.0], 1e-3);
        assert!(c.pass() && (c.max_error - 5e-4).abs() < 1e-12, "{c:?}");
        assert!(!rel_scaled("y", Metric::RelDotMagnitude, &[1.5], &[1.0], &[100.0], 1e-3).pass());
    }

    #[test]
    fn non_finite_and_length_mismatches_fail() {
        assert!(!abs("x", &[f32::NAN], &[1.0], 1.0).pass());
        assert!(!abs("x", &[f32::INFINITY], &[1.0], 1e30).pass());
        assert!(abs("x", &[f32::NEG_INFINITY], &[f32::NEG_INFINITY], 0.0).pass());
        let c = abs("x", &[1.0], &[1.0, 2.0], 1.0);
        assert!(!c.pass() && c.first_failure.as_deref().unwrap().contains("length"), "{c:?}");
        assert!(!bits_f32("x", &[], &[1.0]).pass());
        assert!(!rel_scaled("y", Metric::RelBound, &[1.0], &[1.0], &[], 1.0).pass());
    }
}
