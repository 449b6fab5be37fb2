//! VOP2 / VOP1 / VOP3 encodings: integer and f32 ALU semantics against host formulas.
mod common;
use common::*;

fn check(body: &str, input: &[u32], want: impl Fn(usize) -> u32) {
    let Some(out) = run(body, input) else { return };
    for l in 0..32 { assert_eq!(out[l], want(l), "lane {l}: `{}`", body.trim()); }
}

fn inputs() -> Vec<u32> {
    abc(|l| (l as u32).wrapping_mul(0x9E37_79B9), |l| (l as u32 * 7 + 3) ^ 0x8000_0001 * (l as u32 & 1), |l| l as u32 * 3 + 1)
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
    check("v_med3_i32 v5, v2, v3, v4", &i, |l| { let mut v = [a(l) as i32, b(l) as i32, c(l) as i32]; v.sort(); v[1] as u32 });
    check("v_xad_u32 v5, v2, v3, v4", &i, |l| (a(l) ^ b(l)).wrapping_add(c(l)));
}

#[test]
fn carry_chain_vop3sd() {
    let i = inputs();
    let (a, b) = (|l: usize| i[l], |l: usize| i[32 + l]);
    // 64-bit add of (a, b) + (b, a) through VCC
    let body = "v_add_co_u32 v5, vcc_lo, v2, v3\n v_add_co_ci_u32_e32 v6, vcc_lo, v3, v2, vcc_lo\n v_xor_b32 v5, v5, v6";
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
    let i = abc(|l| [nan, f(1.0), f(-0.0), f(3e9), f(-3e9), f(1e-40), nan, f(0.0)][l % 8],
                |l| [f(2.0), nan, f(0.0), f(1.0), f(1.0), f(2.0), nan, f(-0.0)][l % 8], |_| 0);
    let Some(out) = run("v_min_f32 v5, v2, v3", &i) else { return };
    let want = [2.0f32, 1.0, -0.0, 1.0, -3e9, 1e-40, f32::NAN, -0.0];
    for l in 0..8 {
        let g = ff(out[l]);
        if want[l].is_nan() { assert!(g.is_nan(), "lane {l}"); } else { assert_eq!(g.to_bits(), want[l].to_bits(), "min lane {l}"); }
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
    for l in 0..32 { assert_eq!(out[l], (i[32 + l] & 0xffff) | h(1.5 * l as f32) << 16, "lane {l}"); }
    let Some(out) = run("v_cvt_f32_f16 v5, v2.h", &i) else { return };
    for l in 0..32 { assert_eq!(ff(out[l]), 0.5 * l as f32, "lane {l}"); }
}

/// f16 bits of a small exactly-representable value (independent of the device code).
fn emulator_f16(x: f32) -> u16 {
    if x == 0.0 { return 0; }
    let e = x.abs().log2().floor() as i32;
    let m = ((x.abs() / 2f32.powi(e) - 1.0) * 1024.0).round() as u16;
    (if x < 0.0 { 0x8000 } else { 0 }) | (((e + 15) as u16) << 10) | m
}

#[test]
fn transcendental_within_tolerance() {
    let i = abc(|l| f(0.25 + l as f32 * 0.37), |_| 0, |_| 0);
    for (body, g) in [("v_exp_f32 v5, v2", f32::exp2 as fn(f32) -> f32), ("v_log_f32 v5, v2", f32::log2), ("v_rcp_f32 v5, v2", |x: f32| 1.0 / x),
                      ("v_rsq_f32 v5, v2", |x: f32| 1.0 / x.sqrt()), ("v_sqrt_f32 v5, v2", f32::sqrt)] {
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
    let i = abc(|l| f([1.0, 7.0, -3.5, 1e30, 0.0, 5.0, 1e-30, 2.0][l % 8] * (1 + l / 8) as f32),
                |l| f([3.0, 7.0, 0.1, 3e-5, 2.0, 0.0, 1e20, -0.0][l % 8]), |_| 0);
    let Some(out) = run(body, &i) else { return };
    for l in 0..32 {
        let want = ff(i[l]) / ff(i[32 + l]);
        let got = ff(out[l]);
        if want.is_nan() { assert!(got.is_nan()); continue; }
        assert!(got == want || (got - want).abs() <= want.abs() * 1.2e-7, "lane {l}: {} / {} = {got}, want {want}", ff(i[l]), ff(i[32 + l]));
    }
}

#[test]
fn misc_vop3_ops() {
    let i = inputs();
    let (a, b, c) = (|l: usize| i[l], |l: usize| i[32 + l], |l: usize| i[64 + l]);
    check("v_mad_u32_u16 v5, v2.l, v3.h, v4", &i, |l| (a(l) & 0xffff).wrapping_mul(b(l) >> 16).wrapping_add(c(l)));
    check("v_sad_u8 v5, v2, v3, v4", &i, |l| (0..4).map(|k| ((a(l) >> (8 * k)) & 0xff).abs_diff((b(l) >> (8 * k)) & 0xff)).sum::<u32>() + c(l));
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
    for (body, g) in [("v_add_f64 v[6:7], v[2:3], 1.0", (|x: f64, _k: u32| x + 1.0) as fn(f64, u32) -> f64),
                      ("v_mul_f64 v[6:7], v[2:3], v[2:3]", |x, _| x * x),
                      ("v_fma_f64 v[6:7], v[2:3], -2.0, v[2:3]", |x, _| x.mul_add(-2.0, x)),
                      ("v_cvt_f64_i32 v[8:9], v4\n v_add_f64 v[6:7], v[2:3], v[8:9]", |x, k| x + k as f64),
                      ("v_ldexp_f64 v[6:7], v[2:3], 5", |x, _| x * 32.0)] {
        let Some(lo) = run(&format!("{body}\n v_mov_b32 v5, v6"), &i) else { return };
        let Some(hi) = run(&format!("{body}\n v_mov_b32 v5, v7"), &i) else { return };
        for l in 0..32 {
            let got = f64::from_bits(lo[l] as u64 | (hi[l] as u64) << 32);
            assert_eq!(got, g(vals[l], l as u32), "{body} lane {l}");
        }
    }
    let Some(out) = run("v_cvt_i32_f64 v5, v[2:3]", &i) else { return };
    for l in 0..32 { assert_eq!(out[l] as i32, vals[l] as i32, "cvt lane {l}"); }
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
