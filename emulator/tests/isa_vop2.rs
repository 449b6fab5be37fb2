//! VOP2 / VOP1 / VOP3 encodings: integer and f32 ALU semantics against host formulas.
mod common;
use common::*;

fn check(body: &str, input: &[u32], want: impl Fn(usize) -> u32) {
    let Some(out) = run(body, input) else { return };
    for l in 0..32 {
        assert_eq!(out[l], want(l), "lane {l}: `{}`", body.trim());
    }
}

fn inputs() -> Vec<u32> {
    abc(
        |l| (l as u32).wrapping_mul(0x9E37_79B9),
        |l| (l as u32 * 7 + 3) ^ (0x8000_0001 * (l as u32 & 1)),
        |l| l as u32 * 3 + 1,
    )
}

#[test]
fn integer_vop2() {
    let i = inputs();
    let (a, b) = (|l: usize| i[l], |l: usize| i[32 + l]);
    check("v_add_nc_u32 v5, v2, v3", &i, |l| a(l).wrapping_add(b(l)));
    check("v_sub_nc_u32 v5, v2, v3", &i, |l| a(l).wrapping_sub(b(l)));
    check("v_subrev_nc_u32 v5, v2, v3", &i, |l| b(l).wrapping_sub(a(l)));
    check("v_and_b32 v5, v2, v3", &i, |l| a(l) & b(l));
    check("v_xor_b32 v5, 0x12345678, v3", &i, |l| 0x12345678 ^ b(l));
    check("v_lshlrev_b32 v5, v2, v3", &i, |l| b(l) << (a(l) & 31));
    check("v_ashrrev_i32 v5, v2, v3", &i, |l| ((b(l) as i32) >> (a(l) & 31)) as u32);
    check("v_max_i32 v5, v2, v3", &i, |l| (a(l) as i32).max(b(l) as i32) as u32);
    check("v_min_u32 v5, v2, v3", &i, |l| a(l).min(b(l)));
    check("v_mul_u32_u24 v5, v2, v3", &i, |l| (a(l) & 0xffffff).wrapping_mul(b(l) & 0xffffff));
    check("v_mul_i32_i24 v5, -5, v3", &i, |l| (-5i32).wrapping_mul(((b(l) << 8) as i32) >> 8) as u32);
}

#[test]
fn integer_vop3() {
    let i = inputs();
    let (a, b, c) = (|l: usize| i[l], |l: usize| i[32 + l], |l: usize| i[64 + l]);
    check("v_mul_lo_u32 v5, v2, v3", &i, |l| a(l).wrapping_mul(b(l)));
    check("v_mul_hi_u32 v5, v2, v3", &i, |l| ((a(l) as u64 * b(l) as u64) >> 32) as u32);
    check("v_add3_u32 v5, v2, v3, v4", &i, |l| a(l).wrapping_add(b(l)).wrapping_add(c(l)));
    check("v_lshl_add_u32 v5, v2, 3, v4", &i, |l| (a(l) << 3).wrapping_add(c(l)));
    check("v_bfe_u32 v5, v2, 5, 9", &i, |l| (a(l) >> 5) & 0x1ff);
    check("v_bfe_i32 v5, v2, 4, 8", &i, |l| ((a(l) >> 4) as u8 as i8) as i32 as u32);
    check("v_alignbit_b32 v5, v2, v3, 8", &i, |l| (((a(l) as u64) << 32 | b(l) as u64) >> 8) as u32);
    // v_perm_b32: selector bytes 0-3 pick from src1, 4-7 from src0, 12 = 0x00, 13 = 0xff
    check("v_perm_b32 v5, v2, v3, 0x0c0d0400", &i, |l| (b(l) & 0xff) | (a(l) & 0xff) << 8 | 0xff << 16);
    check("v_med3_i32 v5, v2, v3, v4", &i, |l| {
        let mut v = [a(l) as i32, b(l) as i32, c(l) as i32];
        v.sort();
        v[1] as u32
    });
    check("v_xad_u32 v5, v2, v3, v4", &i, |l| (a(l) ^ b(l)).wrapping_add(c(l)));
}

#[test]
fn carry_chain_vop3sd() {
    let i = inputs();
    let (a, b) = (|l: usize| i[l], |l: usize| i[32 + l]);
    // 64-bit add of (a, b) + (b, a) through VCC
    let body =
        "v_add_co_u32 v5, vcc_lo, v2, v3\n v_add_co_ci_u32_e32 v6, vcc_lo, v3, v2, vcc_lo\n v_xor_b32 v5, v5, v6";
    check(body, &i, |l| {
        let x = (b(l) as u64) << 32 | a(l) as u64;
        let y = (a(l) as u64) << 32 | b(l) as u64;
        let s = x.wrapping_add(y);
        s as u32 ^ (s >> 32) as u32
    });
    check("v_mad_u64_u32 v[6:7], null, v2, v3, v[3:4]\n v_xor_b32 v5, v6, v7", &i, |l| {
        let r = (a(l) as u64 * b(l) as u64).wrapping_add((i[64 + l] as u64) << 32 | b(l) as u64);
        r as u32 ^ (r >> 32) as u32
    });
}

#[test]
fn f32_arith_and_modifiers() {
    let i = abc(|l| f(l as f32 * 0.75 - 7.0), |l| f(1.5 + l as f32 / 8.0), |l| f(-(l as f32) * 0.125));
    let (a, b, c) = (|l: usize| ff(i[l]), |l: usize| ff(i[32 + l]), |l: usize| ff(i[64 + l]));
    check("v_add_f32 v5, v2, v3", &i, |l| f(a(l) + b(l)));
    check("v_mul_f32 v5, v2, v3", &i, |l| f(a(l) * b(l)));
    check("v_sub_f32_e64 v5, |v2|, -v3", &i, |l| f(a(l).abs() + b(l)));
    check("v_fma_f32 v5, v2, v3, v4", &i, |l| f(a(l).mul_add(b(l), c(l))));
    check("v_mov_b32 v5, v4\n v_fmac_f32 v5, v2, v3", &i, |l| f(a(l).mul_add(b(l), c(l))));
    check("v_fmaak_f32 v5, v2, v3, 0x40400000", &i, |l| f(a(l).mul_add(b(l), 3.0)));
    check("v_mul_f32_e64 v5, v2, v3 clamp", &i, |l| f((a(l) * b(l)).clamp(0.0, 1.0)));
    check("v_add_f32_e64 v5, v2, v3 mul:2", &i, |l| f((a(l) + b(l)) * 2.0));
    check("v_max_f32 v5, v2, v4", &i, |l| f(a(l).max(c(l))));
    check("v_cvt_i32_f32 v5, v2", &i, |l| a(l) as i32 as u32);
    check("v_cvt_f32_u32 v5, v4", &i, |l| f(i[64 + l] as f32));
    check("v_floor_f32 v5, v2", &i, |l| f(a(l).floor()));
    check("v_ldexp_f32 v5, v2, 3", &i, |l| f(a(l) * 8.0));
    check("v_add_f32 v5, 1.0, v2", &i, |l| f(1.0 + a(l)));
    check("v_add_f32 v5, 0.15915494, v2", &i, |l| f(f32::from_bits(0x3e22f983) + a(l)));
}

#[test]
fn float_edge_cases() {
    let nan = f32::NAN.to_bits();
    let i = abc(
        |l| [nan, f(1.0), f(-0.0), f(3e9), f(-3e9), f(1e-40), nan, f(0.0)][l % 8],
        |l| [f(2.0), nan, f(0.0), f(1.0), f(1.0), f(2.0), nan, f(-0.0)][l % 8],
        |_| 0,
    );
    let Some(out) = run("v_min_f32 v5, v2, v3", &i) else { return };
    let want = [2.0f32, 1.0, -0.0, 1.0, -3e9, 1e-40, f32::NAN, -0.0];
    for l in 0..8 {
        let g = ff(out[l]);
        if want[l].is_nan() {
            assert!(g.is_nan(), "lane {l}");
        } else {
            assert_eq!(g.to_bits(), want[l].to_bits(), "min lane {l}");
        }
    }
    // float -> int saturates, NaN -> 0
    let Some(out) = run("v_cvt_i32_f32 v5, v2", &i) else { return };
    assert_eq!(&out[..5], &[0, 1, 0, i32::MAX as u32, i32::MIN as u32]);
    let Some(out) = run("v_cvt_u32_f32 v5, v2", &i) else { return };
    assert_eq!(&out[..5], &[0, 1, 0, 3_000_000_000, 0]);
}

#[test]
fn f16_true16_halves() {
    // v2 = two f16 values (lo, hi); result packs lo+hi into the high half, keeps lo of v5 = v3
    let h = |x: f32| emulator_f16(x) as u32;
    let i = abc(|l| h(l as f32) | h(0.5 * l as f32) << 16, |l| 0xdead_0000 | l as u32, |_| 0);
    let Some(out) = run("v_mov_b32 v5, v3\n v_add_f16 v5.h, v2.l, v2.h", &i) else { return };
    for l in 0..32 {
        assert_eq!(out[l], (i[32 + l] & 0xffff) | h(1.5 * l as f32) << 16, "lane {l}");
    }
    let Some(out) = run("v_cvt_f32_f16 v5, v2.h", &i) else { return };
    for l in 0..32 {
        assert_eq!(ff(out[l]), 0.5 * l as f32, "lane {l}");
    }
}

/// f16 bits of a small exactly-representable value (independent of the device code).
fn emulator_f16(x: f32) -> u16 {
    if x == 0.0 {
        return 0;
    }
    let e = x.abs().log2().floor() as i32;
    let m = ((x.abs() / 2f32.powi(e) - 1.0) * 1024.0).round() as u16;
    (if x < 0.0 { 0x8000 } else { 0 }) | (((e + 15) as u16) << 10) | m
}

#[test]
fn transcendental_within_tolerance() {
    let i = abc(|l| f(0.25 + l as f32 * 0.37), |_| 0, |_| 0);
    for (body, g) in [
        ("v_exp_f32 v5, v2", f32::exp2 as fn(f32) -> f32),
        ("v_log_f32 v5, v2", f32::log2),
        ("v_rcp_f32 v5, v2", |x: f32| 1.0 / x),
        ("v_rsq_f32 v5, v2", |x: f32| 1.0 / x.sqrt()),
        ("v_sqrt_f32 v5, v2", f32::sqrt),
    ] {
        let Some(out) = run(body, &i) else { return };
        for l in 0..32 {
            let (got, want) = (ff(out[l]), g(ff(i[l])));
            assert!((got - want).abs() <= want.abs() * 2e-6, "{body} lane {l}: {got} vs {want}");
        }
    }
}

#[test]
fn ieee_division_sequence() {
    // the sequence LLVM emits for an IEEE f32 division
    let body = "
  v_div_scale_f32 v6, null, v3, v3, v2
  v_div_scale_f32 v9, vcc_lo, v2, v3, v2
  v_rcp_f32 v7, v6
  v_fma_f32 v8, -v6, v7, 1.0
  v_fmac_f32 v7, v8, v7
  v_mul_f32 v8, v9, v7
  v_fma_f32 v10, -v6, v8, v9
  v_fmac_f32 v8, v10, v7
  v_fma_f32 v6, -v6, v8, v9
  v_div_fmas_f32 v6, v6, v7, v8
  v_div_fixup_f32 v5, v6, v3, v2";
    let i = abc(
        |l| f([1.0, 7.0, -3.5, 1e30, 0.0, 5.0, 1e-30, 2.0][l % 8] * (1 + l / 8) as f32),
        |l| f([3.0, 7.0, 0.1, 3e-5, 2.0, 0.0, 1e20, -0.0][l % 8]),
        |_| 0,
    );
    let Some(out) = run(body, &i) else { return };
    for l in 0..32 {
        let want = ff(i[l]) / ff(i[32 + l]);
        let got = ff(out[l]);
        if want.is_nan() {
            assert!(got.is_nan());
            continue;
        }
        assert!(
            got == want || (got - want).abs() <= want.abs() * 1.2e-7,
            "lane {l}: {} / {} = {got}, want {want}",
            ff(i[l]),
            ff(i[32 + l])
        );
    }
}

#[test]
fn misc_vop3_ops() {
    let i = inputs();
    let (a, b, c) = (|l: usize| i[l], |l: usize| i[32 + l], |l: usize| i[64 + l]);
    check("v_mad_u32_u16 v5, v2.l, v3.h, v4", &i, |l| (a(l) & 0xffff).wrapping_mul(b(l) >> 16).wrapping_add(c(l)));
    check("v_sad_u8 v5, v2, v3, v4", &i, |l| {
        (0..4).map(|k| ((a(l) >> (8 * k)) & 0xff).abs_diff((b(l) >> (8 * k)) & 0xff)).sum::<u32>() + c(l)
    });
    check("v_cvt_pk_u8_f32 v5, 200.0, 2, v4", &i, |l| (c(l) & 0xff00ffff) | 200 << 16);
    check("v_bcnt_u32_b32 v5, v2, v4", &i, |l| a(l).count_ones() + c(l));
    check("v_mbcnt_lo_u32_b32 v5, -1, 0", &i, |l| l as u32);
    check("v_mbcnt_lo_u32_b32 v5, v2, v4", &i, |l| (a(l) & ((1u64 << l) - 1) as u32).count_ones() + c(l));
    check("v_cvt_f32_ubyte2 v5, v2", &i, |l| f(((a(l) >> 16) & 0xff) as f32));
    check("v_clz_i32_u32 v5, v4", &i, |l| if c(l) == 0 { u32::MAX } else { c(l).leading_zeros() });
    check("v_lshlrev_b64 v[5:6], 3, v[2:3]", &i, |l| a(l) << 3);
    check("v_lshrrev_b64 v[5:6], 4, v[2:3]", &i, |l| (a(l) >> 4) | (b(l) << 28));
}

#[test]
fn f64_ops() {
    // v[2:3] = a (f64 from two inputs), v4 = small int
    let vals: Vec<f64> = (0..32).map(|l| l as f64 * 1.25 - 9.5).collect();
    let i = abc(|l| vals[l].to_bits() as u32, |l| (vals[l].to_bits() >> 32) as u32, |l| l as u32);
    // the epilogue stores one dword: run twice to fetch the low and high halves
    for (body, g) in [
        ("v_add_f64 v[6:7], v[2:3], 1.0", (|x: f64, _k: u32| x + 1.0) as fn(f64, u32) -> f64),
        ("v_mul_f64 v[6:7], v[2:3], v[2:3]", |x, _| x * x),
        ("v_fma_f64 v[6:7], v[2:3], -2.0, v[2:3]", |x, _| x.mul_add(-2.0, x)),
        ("v_cvt_f64_i32 v[8:9], v4\n v_add_f64 v[6:7], v[2:3], v[8:9]", |x, k| x + k as f64),
        ("v_ldexp_f64 v[6:7], v[2:3], 5", |x, _| x * 32.0),
    ] {
        let Some(lo) = run(&format!("{body}\n v_mov_b32 v5, v6"), &i) else { return };
        let Some(hi) = run(&format!("{body}\n v_mov_b32 v5, v7"), &i) else { return };
        for l in 0..32 {
            let got = f64::from_bits(lo[l] as u64 | (hi[l] as u64) << 32);
            assert_eq!(got, g(vals[l], l as u32), "{body} lane {l}");
        }
    }
    let Some(out) = run("v_cvt_i32_f64 v5, v[2:3]", &i) else { return };
    for l in 0..32 {
        assert_eq!(out[l] as i32, vals[l] as i32, "cvt lane {l}");
    }
}

#[test]
fn f32_denormal_modes() {
    // 1e-39 is an f32 denormal: kept in mode 3, flushed (inputs and outputs) in mode 0
    let i = abc(|_| f(1e-39), |_| f(2.0), |_| 0);
    let body = format!("{PROLOGUE} v_mul_f32 v5, v2, v3{EPILOGUE}");
    let Some(elf) = assemble_raw(&body, "", 0) else { return };
    let (out, _) = run_elf(&elf, &i, 32, 32, 0).unwrap();
    assert_eq!(ff(out[0]), 2e-39);
    let Some(elf) = assemble_raw(&body, "  .amdhsa_float_denorm_mode_32 0", 0) else { return };
    let (out, _) = run_elf(&elf, &i, 32, 32, 0).unwrap();
    assert_eq!(out[0], 0);
    // s_denorm_mode switches at run time
    let body = format!("{PROLOGUE} s_denorm_mode 0xf\n v_mul_f32 v5, v2, v3{EPILOGUE}");
    let Some(elf) = assemble_raw(&body, "  .amdhsa_float_denorm_mode_32 0", 0) else { return };
    let (out, _) = run_elf(&elf, &i, 32, 32, 0).unwrap();
    assert_eq!(ff(out[0]), 2e-39);
}

// ---------------------------------------------------------------- ISA special values
// Expected bits come from the RDNA3 ISA pseudo-code and its functional examples (docs/emulator.md,
// "ISA conformance"), written out by hand here, not computed by the device's helpers.

const SNAN: u32 = 0x7f80_0001; // signalling NaN with payload 1
const QNAN: u32 = 0x7fc0_0123; // quiet NaN with a payload
const NQNAN: u32 = 0xffc0_0456; // negative quiet NaN
const DNAN: u32 = 0xffc0_0000; // the NaN the hardware generates
const INF: u32 = 0x7f80_0000;
const NINF: u32 = 0xff80_0000;
const NZERO: u32 = 0x8000_0000;
const DENORM: u32 = 0x0000_0001; // 2^-149
const NDENORM: u32 = 0x8000_0001;

/// Up to 32 cases per launch: lane l gets (v2, v3, v4) = case.0 and must store case.1 in v5.
fn special(body: &str, directives: &str, cases: &[([u32; 3], u32)]) {
    for chunk in cases.chunks(32) {
        let i = abc(
            |l| chunk.get(l).map_or(0, |c| c.0[0]),
            |l| chunk.get(l).map_or(0, |c| c.0[1]),
            |l| chunk.get(l).map_or(0, |c| c.0[2]),
        );
        let Some(elf) = assemble_raw(&format!("{PROLOGUE}{body}{EPILOGUE}"), directives, 0) else { return };
        let (out, _) = run_elf(&elf, &i, 32, 32, 0).unwrap_or_else(|e| panic!("{e}\n{body}"));
        for (l, (inp, want)) in chunk.iter().enumerate() {
            assert_eq!(
                out[l],
                *want,
                "`{}` {directives} inputs {:#010x?}: got {:#010x}, want {:#010x}",
                body.trim(),
                inp,
                out[l],
                want
            );
        }
    }
}

#[test]
fn div_fixup_f32_special_values() {
    // (quotient, denominator, numerator) -> result
    let one = f(1.0);
    let cases = [
        ([one, f(2.0), SNAN], 0x7fc0_0001), // NaN numerator: quieted, payload kept
        ([one, f(2.0), NQNAN], NQNAN),
        ([one, SNAN | 0x10, f(2.0)], 0x7fc0_0011), // NaN denominator
        ([one, QNAN, SNAN], 0x7fc0_0001),          // numerator first
        ([one, 0, 0], DNAN),                       // 0/0 = 0xffc00000, not 0x7fc00000
        ([one, NZERO, 0], DNAN),
        ([one, 0, NZERO], DNAN),
        ([one, INF, INF], DNAN), // inf/inf
        ([one, NINF, INF], DNAN),
        ([one, 0, f(1.0)], INF), // x/0
        ([one, 0, f(-1.0)], NINF),
        ([one, NZERO, f(1.0)], NINF),
        ([one, f(2.0), INF], INF), // inf/y
        ([one, f(-2.0), INF], NINF),
        ([one, INF, f(1.0)], 0), // x/inf
        ([one, NINF, f(1.0)], NZERO),
        ([one, f(5.0), 0], 0), // 0/y
        ([one, f(-5.0), 0], NZERO),
        ([one, f(5.0), NZERO], NZERO),
        // exponent(n) - exponent(d) < -150: underflow to a signed zero whatever the quotient
        ([one, f(2f32.powi(60)), f(2f32.powi(-100))], 0),
        ([one, f(-(2f32.powi(60))), f(2f32.powi(-100))], NZERO),
        ([one, f(2f32.powi(24)), DENORM], 0),         // 0 - 151 < -150
        ([f(7.0), f(2f32.powi(23)), DENORM], f(7.0)), // 0 - 150 is not: the quotient stands
        // otherwise |quotient| with the sign of n/d
        ([f(-3.0), f(2.0), f(6.0)], f(3.0)),
        ([f(-3.0), f(-2.0), f(6.0)], f(-3.0)),
        ([f(3.0), f(2.0), f(-6.0)], f(-3.0)),
        ([NZERO, f(2.0), f(1e-45)], 0),
        // a quotient that overflowed in the Newton-Raphson steps (inf, or inf - inf = NaN):
        // OVERFLOW, signed (the pseudo-code's unreachable `exponent(S1) == 255` read as S0)
        ([DNAN, f(1e-20), f(3e38)], INF),
        ([0x7fc0_0000, f(-1e-20), f(3e38)], NINF),
        ([INF, f(-2.0), f(1.0)], NINF),
    ];
    special("v_div_fixup_f32 v5, v2, v3, v4", "", &cases);
}

#[test]
fn div_fixup_f16_and_f64_special_values() {
    let h = |x: u16| x as u32;
    // f16 (0/0 = 0xfe00, NaN quieted), no underflow rule
    let cases = [
        ([h(0x3c00), 0, 0], 0xfe00),
        ([h(0x3c00), h(0x7c00), h(0xfc00)], 0xfe00),
        ([h(0x3c00), h(0x4000), h(0x7d00)], 0x7f00), // sNaN numerator quieted
        ([h(0x3c00), h(0x7c01), h(0x4000)], 0x7e01),
        ([h(0x3c00), h(0x8000), h(0x3c00)], 0xfc00),
        ([h(0x3c00), h(0xfc00), h(0x3c00)], 0x8000),
        ([h(0xc200), h(0x4000), h(0x4600)], 0x4200), // |q| with sign(n/d)
    ];
    special("v_mov_b32 v5, 0\n v_div_fixup_f16 v5.l, v2.l, v3.l, v4.l", "", &cases);
    // f64: the high dword of the result
    let d = |x: f64| x.to_bits();
    let hi = |x: u64| (x >> 32) as u32;
    let body = "v_mov_b32 v6, 0\n v_mov_b32 v8, 0\n v_mov_b32 v10, 0\n v_mov_b32 v7, v2\n v_mov_b32 v9, v3\n v_mov_b32 v11, v4\n v_div_fixup_f64 v[12:13], v[6:7], v[8:9], v[10:11]\n v_mov_b32 v5, v13";
    let cases = [
        ([hi(d(1.0)), 0, 0], 0xfff8_0000),
        ([hi(d(1.0)), hi(d(f64::INFINITY)), hi(d(f64::INFINITY))], 0xfff8_0000),
        ([hi(d(1.0)), hi(d(2.0)), 0x7ff0_0001], 0x7ff8_0001),
        ([hi(d(1.0)), hi(d(-0.0)), hi(d(3.0))], 0xfff0_0000),
        ([hi(d(-3.0)), hi(d(-2.0)), hi(d(6.0))], hi(d(-3.0))),
        ([hi(d(1.0)), hi(d(2f64.powi(600))), hi(d(2f64.powi(-600)))], 0),
    ];
    special(body, "", &cases);
}

/// The whole IEEE division sequence LLVM emits on special values: the results of a correctly
/// rounded division (what the sequence gives on hardware), NaNs as v_div_fixup makes them.
#[test]
fn ieee_division_special_values() {
    let body = "
  v_div_scale_f32 v6, null, v3, v3, v2
  v_div_scale_f32 v9, vcc_lo, v2, v3, v2
  v_rcp_f32 v7, v6
  v_fma_f32 v8, -v6, v7, 1.0
  v_fmac_f32 v7, v8, v7
  v_mul_f32 v8, v9, v7
  v_fma_f32 v10, -v6, v8, v9
  v_fmac_f32 v8, v10, v7
  v_fma_f32 v6, -v6, v8, v9
  v_div_fmas_f32 v6, v6, v7, v8
  v_div_fixup_f32 v5, v6, v3, v2";
    let (n, d): (Vec<u32>, Vec<u32>) = [
        (f(1.0), f(3.0)),
        (f(-7.0), f(0.1)),
        (0, 0),
        (NZERO, f(2.0)),
        (f(1.0), 0),
        (f(-1.0), NZERO),
        (INF, INF),
        (INF, f(-2.0)),
        (f(3.0), NINF),
        (SNAN, f(1.0)),
        (f(1.0), QNAN),
        (NQNAN, SNAN),
        (DENORM, f(3.0)),
        (f(1e-38), f(7.0)),
        (f(1.0), f(3e38)),
        (f(3e38), f(1e-10)),
        (f(1e-30), f(1e20)),
        (f(2e-38), f(3e-39)),
        (f(5e-39), f(0.999)),
        (DENORM, f(0.5)),
        (NDENORM, f(2.0)),
        (0x0000_0003, f(2.0)),
        (f(1.0), 0x0000_0007),
        (f(6e37), f(2e-8)),
        (f(1.7e38), f(0.5)),
        (f(1.0), f(f32::MAX)),
        (f(f32::MAX), f(f32::MAX)),
        (f(1.5e-45), f(1e10)),
        (f(123.456), f(-0.001)),
        (f(1e-40), f(1e-41)),
        (f(9.9e-39), f(1.0e-7)),
        (f(3.0), f(3.0)),
    ]
    .into_iter()
    .unzip();
    let want = |a: u32, b: u32| -> u32 {
        let (x, y) = (ff(a), ff(b));
        if x.is_nan() {
            return a | 0x40_0000;
        }
        if y.is_nan() {
            return b | 0x40_0000;
        }
        let q = x / y;
        if q.is_nan() { DNAN } else { q.to_bits() }
    };
    let cases: Vec<([u32; 3], u32)> = n.iter().zip(&d).map(|(&a, &b)| ([a, b, 0], want(a, b))).collect();
    special(body, "", &cases);
}

#[test]
fn min_max_nan_and_signed_zero_rules() {
    let one = f(1.0);
    // IEEE mode (the default of compute kernels): sNaN -> that NaN quieted; qNaN -> the other
    // operand (both qNaN: S0); -0 < +0
    let ieee = [
        ([SNAN, one, 0], 0x7fc0_0001),
        ([one, SNAN, 0], 0x7fc0_0001),
        ([QNAN, one, 0], one),
        ([one, QNAN, 0], one),
        ([QNAN, NQNAN, 0], QNAN),
        ([SNAN, QNAN, 0], 0x7fc0_0001),
        ([QNAN, SNAN | 0x8000_0000, 0], 0xffc0_0001),
        ([NZERO, 0, 0], NZERO),
        ([0, NZERO, 0], NZERO),
        ([NINF, INF, 0], NINF),
        ([DENORM, 0, 0], 0),
        ([NDENORM, NZERO, 0], NDENORM),
    ];
    special("v_min_f32 v5, v2, v3", "", &ieee);
    let ieee_max = [
        ([SNAN, one, 0], 0x7fc0_0001),
        ([one, SNAN, 0], 0x7fc0_0001),
        ([QNAN, one, 0], one),
        ([NQNAN, QNAN, 0], NQNAN),
        ([NZERO, 0, 0], 0),
        ([0, NZERO, 0], 0),
        ([NINF, INF, 0], INF),
        ([DENORM, 0, 0], DENORM),
    ];
    special("v_max_f32 v5, v2, v3", "", &ieee_max);
    // non-IEEE mode: any NaN gives the other operand, unquieted (both NaN: S0)
    let no_ieee = [
        ([SNAN, one, 0], one),
        ([one, SNAN, 0], one),
        ([QNAN, SNAN, 0], QNAN),
        ([SNAN, QNAN, 0], SNAN),
        ([NZERO, 0, 0], NZERO),
    ];
    special("v_min_f32 v5, v2, v3", "  .amdhsa_ieee_mode 0", &no_ieee);
    special("v_max_f32 v5, v2, v3", "  .amdhsa_ieee_mode 0", &[([SNAN, one, 0], one), ([NZERO, 0, 0], 0)]);
    // three-operand forms are built from min/max; med3: any NaN -> min3, else by max3 with IEEE `==`
    special(
        "v_min3_f32 v5, v2, v3, v4",
        "",
        &[
            ([QNAN, one, f(0.5)], f(0.5)),
            ([one, f(0.5), SNAN], 0x7fc0_0001),
            ([one, SNAN, f(0.5)], f(0.5)),
            ([0, NZERO, 0], NZERO),
        ],
    );
    special("v_max3_f32 v5, v2, v3, v4", "", &[([QNAN, one, f(2.0)], f(2.0)), ([NZERO, NZERO, 0], 0)]);
    special(
        "v_med3_f32 v5, v2, v3, v4",
        "",
        &[
            ([f(3.0), one, f(2.0)], f(2.0)),
            ([one, f(3.0), f(2.0)], f(2.0)),
            ([one, f(2.0), f(3.0)], f(2.0)),
            ([NZERO, 0, NZERO], 0),     // max3 = +0 == S0 (-0 == +0): max(+0, -0) = +0
            ([0, NZERO, NZERO], NZERO), // max3 = +0 == S0: max(-0, -0)
            ([QNAN, f(5.0), f(4.0)], f(4.0)),
            ([f(5.0), SNAN, f(4.0)], f(4.0)),
            ([f(5.0), f(4.0), SNAN], 0x7fc0_0001),
        ],
    );
    special("v_maxmin_f32 v5, v2, v3, v4", "", &[([QNAN, one, f(0.5)], f(0.5)), ([NZERO, 0, NZERO], NZERO)]);
    special("v_minmax_f32 v5, v2, v3, v4", "", &[([one, QNAN, f(2.0)], f(2.0)), ([NZERO, 0, NZERO], NZERO)]);
    // f16 on raw bits (an f32 detour would quiet the sNaN before the test)
    let h = |x: u16| x as u32;
    special(
        "v_mov_b32 v5, 0\n v_min_f16 v5.l, v2.l, v3.l",
        "",
        &[
            ([h(0x7d00), h(0x3c00), 0], 0x7f00),
            ([h(0x3c00), h(0x7e01), 0], 0x3c00),
            ([h(0x8000), h(0), 0], 0x8000),
            ([h(0), h(0x8000), 0], 0x8000),
        ],
    );
    special(
        "v_mov_b32 v5, 0\n v_max_f16 v5.l, v2.l, v3.l",
        "",
        &[([h(0x7e01), h(0xbc00), 0], 0xbc00), ([h(0x8000), h(0), 0], 0), ([h(0xfd00), h(0), 0], 0xff00)],
    );
    special(
        "v_mov_b32 v5, 0\n v_med3_f16 v5.l, v2.l, v3.l, v4.l",
        "",
        &[([h(0x8000), h(0), h(0x8000)], 0), ([h(0x4200), h(0x3c00), h(0x4000)], 0x4000)],
    );
    // f64: sNaN quieted, -0 < +0 (high dwords)
    let body64 = "v_mov_b32 v6, 0\n v_mov_b32 v8, 0\n v_mov_b32 v7, v2\n v_mov_b32 v9, v3\n v_min_f64 v[10:11], v[6:7], v[8:9]\n v_mov_b32 v5, v11";
    special(
        body64,
        "",
        &[
            ([0x7ff0_0001, 0x3ff0_0000, 0], 0x7ff8_0001),
            ([0x7ff8_0002, 0x3ff0_0000, 0], 0x3ff0_0000),
            ([0, 0x8000_0000, 0], 0x8000_0000),
        ],
    );
    let body64 = body64.replace("v_min_f64", "v_max_f64");
    special(&body64, "", &[([0x3ff0_0000, 0x7ff0_0001, 0], 0x7ff8_0001), ([0x8000_0000, 0, 0], 0)]);
}

#[test]
fn transcendentals_special_values() {
    // the ISA's functional examples, bit for bit
    special(
        "v_rcp_f32 v5, v2",
        "",
        &[([NINF, 0, 0], NZERO), ([f(-2.0), 0, 0], f(-0.5)), ([NZERO, 0, 0], NINF), ([0, 0, 0], INF), ([INF, 0, 0], 0)],
    );
    special(
        "v_rsq_f32 v5, v2",
        "",
        &[([NINF, 0, 0], DNAN), ([NZERO, 0, 0], NINF), ([0, 0, 0], INF), ([f(4.0), 0, 0], f(0.5)), ([INF, 0, 0], 0)],
    );
    special(
        "v_sqrt_f32 v5, v2",
        "",
        &[
            ([NINF, 0, 0], DNAN),
            ([NZERO, 0, 0], NZERO),
            ([0, 0, 0], 0),
            ([f(4.0), 0, 0], f(2.0)),
            ([INF, 0, 0], INF),
            ([f(-1.0), 0, 0], DNAN),
        ],
    );
    special("v_exp_f32 v5, v2", "", &[([NINF, 0, 0], 0), ([NZERO, 0, 0], f(1.0)), ([INF, 0, 0], INF)]);
    special(
        "v_log_f32 v5, v2",
        "",
        &[
            ([NINF, 0, 0], DNAN),
            ([f(-1.0), 0, 0], DNAN),
            ([NZERO, 0, 0], NINF),
            ([0, 0, 0], NINF),
            ([f(1.0), 0, 0], 0),
            ([INF, 0, 0], INF),
        ],
    );
    special(
        "v_sin_f32 v5, v2",
        "",
        &[
            ([NINF, 0, 0], DNAN),
            ([0xff7f_ffff, 0, 0], 0),
            ([NZERO, 0, 0], NZERO),
            ([f(0.25), 0, 0], f(1.0)),
            ([INF, 0, 0], DNAN),
        ],
    );
    special(
        "v_cos_f32 v5, v2",
        "",
        &[
            ([NINF, 0, 0], DNAN),
            ([0xff7f_ffff, 0, 0], f(1.0)),
            ([NZERO, 0, 0], f(1.0)),
            ([f(0.25), 0, 0], 0),
            ([INF, 0, 0], DNAN),
        ],
    );
    // NaN inputs come back quieted
    for op in ["v_rcp_f32", "v_rsq_f32", "v_sqrt_f32", "v_exp_f32", "v_log_f32"] {
        special(&format!("{op} v5, v2"), "", &[([SNAN, 0, 0], 0x7fc0_0001), ([NQNAN, 0, 0], NQNAN)]);
    }
    // "denormals are flushed" (even in denormal mode): input denormals are zeros, denormal
    // results are zeros
    special(
        "v_rcp_f32 v5, v2",
        "",
        &[([DENORM, 0, 0], INF), ([NDENORM, 0, 0], NINF), ([0x7f00_0000, 0, 0], 0), ([0xff00_0000, 0, 0], NZERO)],
    );
    special("v_sqrt_f32 v5, v2", "", &[([DENORM, 0, 0], 0), ([0x0040_0000, 0, 0], 0)]);
    special("v_rsq_f32 v5, v2", "", &[([DENORM, 0, 0], INF)]);
    special(
        "v_exp_f32 v5, v2",
        "",
        &[([f(-130.0), 0, 0], 0), ([f(-126.0), 0, 0], 0x0080_0000), ([f(128.0), 0, 0], INF)],
    );
    special("v_log_f32 v5, v2", "", &[([DENORM, 0, 0], NINF), ([NDENORM, 0, 0], NINF)]);
    // f16: denormals supported; NaN 0xfe00
    let h = |x: u16| x as u32;
    special(
        "v_mov_b32 v5, 0\n v_sqrt_f16 v5.l, v2.l",
        "",
        &[
            ([h(0xfc00), 0, 0], 0xfe00),
            ([h(0x8000), 0, 0], 0x8000),
            ([h(0x4400), 0, 0], 0x4000),
            ([h(0x0001), 0, 0], 0x0c00),
        ],
    );
    special(
        "v_mov_b32 v5, 0\n v_rcp_f16 v5.l, v2.l",
        "",
        &[
            ([h(0xfc00), 0, 0], 0x8000),
            ([h(0xc000), 0, 0], 0xb800),
            ([h(0x8000), 0, 0], 0xfc00),
            ([h(0x7c00), 0, 0], 0),
        ],
    );
    special(
        "v_mov_b32 v5, 0\n v_log_f16 v5.l, v2.l",
        "",
        &[([h(0xbc00), 0, 0], 0xfe00), ([h(0x0000), 0, 0], 0xfc00), ([h(0x3c00), 0, 0], 0)],
    );
    special(
        "v_mov_b32 v5, 0\n v_sin_f16 v5.l, v2.l",
        "",
        &[
            ([h(0xfc00), 0, 0], 0xfe00),
            ([h(0xfbff), 0, 0], 0),
            ([h(0x3400), 0, 0], 0x3c00),
            ([h(0x8000), 0, 0], 0x8000),
        ],
    );
    special("v_mov_b32 v5, 0\n v_cos_f16 v5.l, v2.l", "", &[([h(0x3400), 0, 0], 0), ([h(0x7bff), 0, 0], 0x3c00)]);
}

#[test]
fn fma_special_values_and_single_rounding() {
    let one = f(1.0);
    special(
        "v_fma_f32 v5, v2, v3, v4",
        "",
        &[
            ([INF, 0, one], DNAN),    // inf * 0
            ([INF, one, NINF], DNAN), // inf - inf
            ([SNAN, one, one], 0x7fc0_0001),
            ([one, one, NQNAN], NQNAN),
            ([f(2f32.powi(-140)), f(2f32.powi(-10)), 0], 0), // 2^-150: a tie, to even (0)
            ([f(1.5 * 2f32.powi(-140)), f(2f32.powi(-10)), 0], 0x0000_0001), // 0.75 units: 1
            ([f(f32::MAX), f(2.0), f(-f32::MAX)], f(f32::MAX)), // no intermediate overflow
            ([f(-1.0), f(1.0), f(1.0)], 0),
            ([f(-1.0), 0, NZERO], NZERO),
        ],
    );
    // f16 fma rounds once: a*b + c = 1 + 5*2^-11 + 2^-31 (just above a midpoint whose even
    // neighbour is below) -> 0x3c03; through f32 first it would be a tie -> 0x3c02
    let h = |x: u16| x as u32;
    let case = [h(0x9001), h(0x3bfe), h(0x3c03)];
    special(
        "v_mov_b32 v5, 0\n v_fma_f16 v5.l, v2.l, v3.l, v4.l",
        "",
        &[(case, 0x3c03), ([h(0x7c00), 0, h(0x3c00)], 0xfe00), ([h(0x7d00), h(0x3c00), 0], 0x7f00)],
    );
    special("v_mov_b32 v5, v4\n v_fmac_f16 v5.l, v2.l, v3.l", "", &[(case, 0x3c03)]);
}

#[test]
fn conversions_f16_f32_special_values() {
    let h = |x: u16| x as u32;
    // f32 -> f16: round to nearest even, overflow to inf at 65520, denormals, NaN quiet
    special(
        "v_mov_b32 v5, 0\n v_cvt_f16_f32 v5.l, v2",
        "",
        &[
            ([f(65519.0), 0, 0], 0x7bff),
            ([f(65520.0), 0, 0], 0x7c00),
            ([f(-65520.0), 0, 0], 0xfc00),
            ([f(1e10), 0, 0], 0x7c00),
            ([INF, 0, 0], 0x7c00),
            ([NZERO, 0, 0], 0x8000),
            ([f(1.0 + 2f32.powi(-11)), 0, 0], 0x3c00),
            ([f(1.0 + 3.0 * 2f32.powi(-11)), 0, 0], 0x3c02), // ties to even
            ([f(2f32.powi(-24)), 0, 0], 0x0001),
            ([f(2f32.powi(-25)), 0, 0], 0),
            ([f(1.5 * 2f32.powi(-25)), 0, 0], 0x0001),
            ([f(2f32.powi(-14) - 2f32.powi(-25)), 0, 0], 0x0400), // rounds up into the normals
            ([DENORM, 0, 0], 0),
            ([NDENORM, 0, 0], 0x8000),
            ([SNAN, 0, 0], 0x7e00),
            ([DNAN, 0, 0], 0xfe00),
        ],
    );
    // f16 denormal mode 0: f16 denormal results flushed (the sign stays)
    special(
        "v_mov_b32 v5, 0\n v_cvt_f16_f32 v5.l, v2",
        "  .amdhsa_float_denorm_mode_16_64 0",
        &[([f(2f32.powi(-20)), 0, 0], 0), ([f(-(2f32.powi(-20))), 0, 0], 0x8000), ([f(2f32.powi(-14)), 0, 0], 0x0400)],
    );
    // f16 -> f32: exact, denormals kept (flushed in mode 0), NaN quieted
    special(
        "v_cvt_f32_f16 v5, v2.l",
        "",
        &[
            ([h(0x0001), 0, 0], f(2f32.powi(-24))),
            ([h(0x83ff), 0, 0], f(-1023.0 * 2f32.powi(-24))),
            ([h(0x7d00), 0, 0], 0x7fe0_0000),
            ([h(0xfc00), 0, 0], NINF),
        ],
    );
    special(
        "v_cvt_f32_f16 v5, v2.l",
        "  .amdhsa_float_denorm_mode_16_64 0",
        &[([h(0x0001), 0, 0], 0), ([h(0x8001), 0, 0], NZERO)],
    );
    // round toward zero packing: overflow saturates to the largest finite value, inf stays
    special(
        "v_cvt_pk_rtz_f16_f32 v5, v2, v3",
        "",
        &[([f(65520.0), INF, 0], 0x7c00_7bff), ([f(1.0 + 2f32.powi(-11)), f(-1e10), 0], 0xfbff_3c00)],
    );
    // f32 denormal mode 0 flushes denormal inputs and results of f32 arithmetic
    special(
        "v_add_f32 v5, v2, v3",
        "  .amdhsa_float_denorm_mode_32 0",
        &[([DENORM, 0, 0], 0), ([f(1.5 * 2f32.powi(-126)), f(-(2f32.powi(-126))), 0], 0)],
    );
    special("v_add_f32 v5, v2, v3", "", &[([f(1.5 * 2f32.powi(-126)), f(-(2f32.powi(-126))), 0], 0x0040_0000)]);
}

#[test]
fn frexp_ldexp_special_values() {
    // frexp: inf/NaN -> mantissa = input, exponent 0; denormals are normalised
    special(
        "v_frexp_mant_f32 v5, v2",
        "",
        &[
            ([INF, 0, 0], INF),
            ([NINF, 0, 0], NINF),
            ([QNAN, 0, 0], QNAN),
            ([NZERO, 0, 0], NZERO),
            ([f(-12.0), 0, 0], f(-0.75)),
            ([DENORM, 0, 0], f(0.5)),
            ([0x0000_0003, 0, 0], f(0.75)),
        ],
    );
    special(
        "v_frexp_exp_i32_f32 v5, v2",
        "",
        &[
            ([INF, 0, 0], 0),
            ([QNAN, 0, 0], 0),
            ([0, 0, 0], 0),
            ([f(-12.0), 0, 0], 4),
            ([DENORM, 0, 0], (-148i32) as u32),
            ([f(f32::MAX), 0, 0], 128),
        ],
    );
    // ldexp rounds once: 9 * 2^-149 * 2^-4 = 0.5625 units -> 1 unit (two half-steps would give
    // 2.25 -> 2 -> 0.5 -> a tie -> 0)
    special(
        "v_ldexp_f32 v5, v2, v3",
        "",
        &[
            ([0x0000_0009, (-4i32) as u32, 0], 0x0000_0001),
            ([f(1.5), (-149i32) as u32, 0], 0x0000_0002), // 1.5 units: a tie, to even
            ([f(1.0), 128, 0], INF),
            ([f(-1.0), 128, 0], NINF),
            ([f(1.0), (-150i32) as u32, 0], 0),
            ([f(-3.0), (-1000i32) as u32, 0], NZERO),
            ([DENORM, 200, 0], f(2f32.powi(51))),
            ([f(1.0), i32::MAX as u32, 0], INF),
            ([f(1.0), i32::MIN as u32, 0], 0),
            ([SNAN, 3, 0], 0x7fc0_0001),
            ([INF, (-5i32) as u32, 0], INF),
        ],
    );
    let h = |x: u16| x as u32;
    special(
        "v_mov_b32 v5, 0\n v_ldexp_f16 v5.l, v2.l, v3.l",
        "",
        &[([h(0x3c00), h(0xffe8), 0], 0x0001), ([h(0x3c00), 16, 0], 0x7c00), ([h(0x3e00), 15, 0], 0x7a00)],
    );
}

/// LLVM's division sequence on 8192 random bit patterns of every magnitude (denormals, huge and tiny
/// quotients, overflow, underflow): correctly rounded, as on hardware.
#[test]
fn ieee_division_random_bit_patterns() {
    let body = "
  v_div_scale_f32 v6, null, v3, v3, v2
  v_div_scale_f32 v9, vcc_lo, v2, v3, v2
  v_rcp_f32 v7, v6
  v_fma_f32 v8, -v6, v7, 1.0
  v_fmac_f32 v7, v8, v7
  v_mul_f32 v8, v9, v7
  v_fma_f32 v10, -v6, v8, v9
  v_fmac_f32 v8, v10, v7
  v_fma_f32 v6, -v6, v8, v9
  v_div_fmas_f32 v6, v6, v7, v8
  v_div_fixup_f32 v5, v6, v3, v2";
    let Some(elf) = assemble_raw(&format!("{PROLOGUE}{body}{EPILOGUE}"), "", 0) else { return };
    let mut x = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u32
    };
    let mut bad = Vec::new();
    for _ in 0..256 {
        let (n, d): (Vec<u32>, Vec<u32>) = (0..32).map(|_| (next(), next())).unzip();
        let i: Vec<u32> = n.iter().chain(&d).copied().chain(std::iter::repeat_n(0, 32)).collect();
        let (out, _) = run_elf(&elf, &i, 32, 32, 0).unwrap();
        for l in 0..32 {
            let (a, b) = (ff(n[l]), ff(d[l]));
            let want = if a.is_nan() {
                n[l] | 0x40_0000
            } else if b.is_nan() {
                d[l] | 0x40_0000
            } else if (a / b).is_nan() {
                DNAN
            } else {
                (a / b).to_bits()
            };
            if out[l] != want {
                bad.push(format!("{:#010x} / {:#010x} = {:#010x}, want {want:#010x}", n[l], d[l], out[l]));
            }
        }
    }
    assert!(bad.is_empty(), "{} of 8192 divisions differ:\n{}", bad.len(), bad[..bad.len().min(20)].join("\n"));
}
