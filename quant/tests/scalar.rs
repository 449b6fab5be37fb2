//! Scalar helpers against independent references from `std`: f16/bf16 conversions (checked
//! by exhaustive round trips and nearest-value search in f64), `sqrtf` against `f32::sqrt`,
//! `nearest_int` against `round_ties_even`, `roundf_i32` against `f32::round`.

mod common;
use common::Rng;
use quant::half::f16_to_f32_soft;
use quant::util::{nearest_int, roundf_i32, sqrtf};
use quant::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

#[test]
fn f16_exhaustive_roundtrip() {
    for h in 0..=u16::MAX {
        let f = f16_to_f32(h);
        assert_eq!(f.to_bits(), f16_to_f32_soft(h).to_bits());
        if f.is_nan() {
            assert!(f16_to_f32(f32_to_f16(f)).is_nan(), "{h:#06x}");
            continue;
        }
        assert_eq!(f32_to_f16(f), h, "{h:#06x} -> {f:e}");
    }
    // known values
    assert_eq!(f16_to_f32(0x3c00), 1.0);
    assert_eq!(f16_to_f32(0x7bff), 65504.0);
    assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    assert_eq!(f16_to_f32(0xc000), -2.0);
}

/// The f16 that is nearest to `x` (ties to even), found by brute-force scan in f64.
fn nearest_f16(x: f32) -> u16 {
    let xd = x as f64;
    let mut best = (f64::INFINITY, 0u16);
    for h in 0..=0x7c00u16 {
        // 0x7c00 = inf stands for "overflow": ggml rounds |x| >= 65520 to inf
        let v = if h == 0x7c00 { 65536.0 } else { f16_to_f32(h) as f64 };
        let e = (v - xd.abs()).abs();
        if e < best.0 || (e == best.0 && h & 1 == 0) {
            best = (e, h);
        }
    }
    best.1 | if x.is_sign_negative() { 0x8000 } else { 0 }
}

#[test]
fn f32_to_f16_rounds_to_nearest_even() {
    let mut r = Rng::new(1);
    for i in 0..3000 {
        // magnitudes spanning subnormal..overflow, plus exact ties between halves
        let e = (r.uniform() * 44.0 - 28.0) as i32;
        let mut x = (r.uniform() as f32 + 1.0) * 2f32.powi(e);
        if i % 3 == 0 {
            let h = (r.next_u64() % 0x7bff) as u16;
            x = ((f16_to_f32(h) as f64 + f16_to_f32(h + 1) as f64) / 2.0) as f32; // tie
        }
        if r.next_u64() & 1 == 1 {
            x = -x;
        }
        assert_eq!(f32_to_f16(x), nearest_f16(x), "x = {x:e}");
    }
    assert_eq!(f32_to_f16(65519.0), 0x7bff);
    assert_eq!(f32_to_f16(65520.0), 0x7c00);
    assert_eq!(f32_to_f16(f32::INFINITY), 0x7c00);
    assert_eq!(f32_to_f16(-0.0), 0x8000);
    assert_eq!(f32_to_f16(2f32.powi(-25)), 0); // tie with 0 -> even
    assert_eq!(f32_to_f16(2f32.powi(-25) * 1.0001), 1);
    assert_eq!(f32_to_f16(1e-10), 0);
}

#[test]
fn bf16_conversions() {
    let mut r = Rng::new(2);
    for _ in 0..100_000 {
        let x = f32::from_bits(r.next_u64() as u32);
        let h = f32_to_bf16(x);
        if x.is_nan() {
            assert!(bf16_to_f32(h).is_nan() && h & 0x40 != 0, "NaN must stay (quiet) NaN");
            continue;
        }
        // independent: the two bf16 neighbours of x, pick the nearer (ties to even)
        let lo = x.to_bits() & 0xffff_0000;
        let hi = lo + 0x1_0000;
        let dl = (x as f64 - f32::from_bits(lo) as f64).abs();
        // an infinite upper neighbour stands for 2^128 (IEEE overflow rounding)
        let hv = if f32::from_bits(hi).is_infinite() {
            2f64.powi(128).copysign(x as f64)
        } else {
            f32::from_bits(hi) as f64
        };
        let dh = (x as f64 - hv).abs();
        let want = if dl < dh || (dl == dh && (lo >> 16) & 1 == 0) { lo } else { hi };
        if x.is_infinite() {
            assert_eq!(bf16_to_f32(h), x);
        } else {
            assert_eq!((h as u32) << 16, want, "x = {x:e} ({:#010x})", x.to_bits());
        }
    }
    assert_eq!(bf16_to_f32(0x3f80), 1.0);
}

#[test]
fn sqrtf_is_correctly_rounded() {
    let mut r = Rng::new(3);
    for i in 0..200_000u32 {
        let x = if i < 100_000 {
            f32::from_bits(r.next_u64() as u32 & 0x7fff_ffff) // any positive, incl. subnormals
        } else {
            (r.uniform() * 100.0) as f32
        };
        if x.is_nan() {
            continue;
        }
        assert_eq!(sqrtf(x).to_bits(), x.sqrt().to_bits(), "sqrt({x:e})");
    }
    for x in [0.0f32, 1.0, 2.0, 4.0, f32::MIN_POSITIVE, 1e-45, f32::MAX, f32::INFINITY] {
        assert_eq!(sqrtf(x).to_bits(), x.sqrt().to_bits(), "sqrt({x:e})");
    }
    assert!(sqrtf(-1.0).is_nan());
}

#[test]
fn nearest_int_is_round_ties_even() {
    let mut r = Rng::new(4);
    for i in 0..200_000 {
        let x = if i % 2 == 0 {
            ((r.uniform() * 2.0 - 1.0) * 4_194_303.0) as f32
        } else {
            ((r.next_u64() % 2001) as f32 - 1000.0) * 0.5 // many exact .5 ties
        };
        assert_eq!(nearest_int(x), x.round_ties_even() as i32, "x = {x}");
    }
}

#[test]
fn roundf_is_half_away_from_zero() {
    let mut r = Rng::new(5);
    for i in 0..200_000 {
        let x = if i % 2 == 0 {
            ((r.uniform() * 2.0 - 1.0) * 300.0) as f32
        } else {
            ((r.next_u64() % 2001) as f32 - 1000.0) * 0.5
        };
        assert_eq!(roundf_i32(x), x.round() as i32, "x = {x}");
    }
    // the largest float below 0.5 must not round up (a naive floor(x+0.5) gets this wrong)
    assert_eq!(roundf_i32(0.49999997), 0);
}
