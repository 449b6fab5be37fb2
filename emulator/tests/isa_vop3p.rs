//! VOP3P: packed 16-bit ops, dot products (neg_lo bits = signedness for iu8), v_fma_mix and
//! WMMA (fragment layout from rdna3-facts.md), checked against plain host loops.
mod common;
use common::*;

fn sx8(x: u32, k: u32) -> i32 {
    (x >> (8 * k)) as u8 as i8 as i32
}
fn zx8(x: u32, k: u32) -> i32 {
    ((x >> (8 * k)) & 0xff) as i32
}

#[test]
fn dot4_signedness() {
    let i = abc(
        |l| (l as u32).wrapping_mul(0x9E37_79B9),
        |l| (l as u32 + 11).wrapping_mul(0x85EB_CA6B),
        |l| l as u32 * 1000,
    );
    let cases: [(&str, fn(u32, u32) -> i32, fn(u32, u32) -> i32); 4] =
        [("neg_lo:[1,1,0]", sx8, sx8), ("neg_lo:[1,0,0]", sx8, zx8), ("neg_lo:[0,1,0]", zx8, sx8), ("", zx8, zx8)];
    for (m, fa, fb) in cases {
        let Some(out) = run(&format!("v_dot4_i32_iu8 v5, v2, v3, v4 {m}"), &i) else { return };
        for l in 0..32 {
            let want = (0..4).fold(i[64 + l] as i32, |acc, k| acc.wrapping_add(fa(i[l], k) * fb(i[32 + l], k)));
            assert_eq!(out[l] as i32, want, "{m} lane {l}");
        }
    }
    let Some(out) = run("v_dot4_u32_u8 v5, v2, v3, v4", &i) else { return };
    for l in 0..32 {
        let want = (0..4).fold(i[64 + l], |acc, k| acc.wrapping_add((zx8(i[l], k) * zx8(i[32 + l], k)) as u32));
        assert_eq!(out[l], want, "udot4 lane {l}");
    }
}

fn h(x: f32) -> u32 {
    // exact f16 of small multiples of 1/8 (independent of the device's converter)
    if x == 0.0 {
        return 0;
    }
    let e = x.abs().log2().floor() as i32;
    let m = ((x.abs() / 2f32.powi(e) - 1.0) * 1024.0).round() as u32;
    (if x < 0.0 { 0x8000 } else { 0 }) | (((e + 15) as u32) << 10) | m
}
fn hv(b: u32) -> f32 {
    let (s, e, m) = (b >> 15 & 1, (b >> 10 & 31) as i32, (b & 1023) as f32);
    let v = if e == 0 { m * 2f32.powi(-24) } else { (1.0 + m / 1024.0) * 2f32.powi(e - 15) };
    if s == 1 { -v } else { v }
}

#[test]
fn packed_f16_and_dot2() {
    let i = abc(
        |l| h(l as f32 * 0.25) | h(-(l as f32) * 0.5) << 16,
        |l| h(1.5) | h(l as f32 * 0.125) << 16,
        |l| f(l as f32),
    );
    let Some(out) = run("v_pk_add_f16 v5, v2, v3", &i) else { return };
    for l in 0..32 {
        assert_eq!(hv(out[l] & 0xffff), l as f32 * 0.25 + 1.5, "lo lane {l}");
        assert_eq!(hv(out[l] >> 16), -(l as f32) * 0.5 + l as f32 * 0.125, "hi lane {l}");
    }
    // op_sel swaps the halves of src0 for the low result
    let Some(out) = run("v_pk_mul_f16 v5, v2, v3 op_sel:[1,0] op_sel_hi:[0,1]", &i) else { return };
    for l in 0..32 {
        assert_eq!(hv(out[l] & 0xffff), -(l as f32) * 0.5 * 1.5, "lo lane {l}");
        assert_eq!(hv(out[l] >> 16), l as f32 * 0.25 * l as f32 * 0.125, "hi lane {l}");
    }
    let Some(out) = run("v_dot2_f32_f16 v5, v2, v3, v4", &i) else { return };
    for l in 0..32 {
        let want = l as f32 * 0.25 * 1.5 + -(l as f32) * 0.5 * (l as f32 * 0.125) + l as f32;
        assert_eq!(ff(out[l]), want, "dot2 lane {l}");
    }
    let Some(out) = run("v_pk_add_u16 v5, v2, v3", &i) else { return };
    for l in 0..32 {
        let want =
            ((i[l] & 0xffff) + (i[32 + l] & 0xffff)) & 0xffff | (((i[l] >> 16) + (i[32 + l] >> 16)) & 0xffff) << 16;
        assert_eq!(out[l], want, "pk_add_u16 lane {l}");
    }
}

#[test]
fn fma_mix() {
    let i = abc(|l| h(l as f32 * 0.5) << 16, |l| f(2.0 + l as f32), |_| f(0.25));
    let Some(out) = run("v_fma_mix_f32 v5, v2, v3, v4 op_sel:[1,0,0] op_sel_hi:[1,0,0]", &i) else { return };
    for l in 0..32 {
        assert_eq!(ff(out[l]), (l as f32 * 0.5) * (2.0 + l as f32) + 0.25, "lane {l}");
    }
}

/// Build WMMA A/B fragments: A[i][k] in lanes i and i+16, VGPR k/2 half k%2 (f16) or VGPR
/// k/4 byte k%4 (iu8); C/D[i][j] (f32/i32) in VGPR i/2 of lane (16*i)%32 + j.
#[test]
fn wmma_f32_f16_and_iu8() {
    let a = |r: usize, k: usize| ((r * 3 + k * 5) % 7) as f32 - 3.0;
    let b = |k: usize, c: usize| ((k * 2 + c) % 5) as f32 * 0.5 - 1.0;
    let cm = |r: usize, c: usize| (r * 16 + c) as f32 * 0.25;
    // input buffer: 8 VGPRs of A, 8 of B, 8 of C, each 32 lanes
    let mut inp = vec![0u32; 24 * 32];
    for lane in 0..32 {
        for v in 0..8 {
            let (k0, k1) = (2 * v, 2 * v + 1);
            inp[v * 32 + lane] = h(a(lane % 16, k0)) | h(a(lane % 16, k1)) << 16;
            inp[(8 + v) * 32 + lane] = h(b(k0, lane % 16)) | h(b(k1, lane % 16)) << 16;
            let (r, c) = (2 * v + lane / 16, lane % 16);
            inp[(16 + v) * 32 + lane] = f(cm(r, c));
        }
    }
    let mut body = String::from(PROLOGUE);
    for v in 0..24 {
        body += &format!("  global_load_b32 v{}, v1, s[2:3] offset:{}\n", 8 + v, v * 128);
    }
    body += "  s_waitcnt vmcnt(0)\n  v_wmma_f32_16x16x16_f16 v[24:31], v[8:15], v[16:23], v[24:31]\n";
    for v in 0..8 {
        body += &format!("  global_store_b32 v1, v{}, s[0:1] offset:{}\n", 24 + v, v * 128);
    }
    body += "  s_endpgm\n";
    let Some(elf) = assemble_raw(&body, "", 0) else { return };
    let (out, _) = run_elf(&elf, &inp, 8 * 32, 32, 0).unwrap();
    for r in 0..16 {
        for c in 0..16 {
            let want = (0..16).fold(cm(r, c), |s, k| s + a(r, k) * b(k, c));
            let got = ff(out[(r / 2) * 32 + (16 * r) % 32 + c]);
            assert_eq!(got, want, "D[{r}][{c}]");
        }
    }
    // iu8, A signed and B unsigned (neg_lo:[1,0,0])
    let ai = |r: usize, k: usize| ((r * 37 + k * 11) % 256) as u8;
    let bi = |k: usize, c: usize| ((k * 13 + c * 7 + 100) % 256) as u8;
    let mut inp = vec![0u32; 24 * 32];
    for lane in 0..32 {
        for v in 0..4 {
            inp[v * 32 + lane] = (0..4).map(|q| (ai(lane % 16, 4 * v + q) as u32) << (8 * q)).sum();
            inp[(8 + v) * 32 + lane] = (0..4).map(|q| (bi(4 * v + q, lane % 16) as u32) << (8 * q)).sum();
        }
        for v in 0..8 {
            inp[(16 + v) * 32 + lane] = (lane * 1000 + v) as u32;
        }
    }
    let body = body.replace(
        "v_wmma_f32_16x16x16_f16 v[24:31], v[8:15], v[16:23], v[24:31]",
        "v_wmma_i32_16x16x16_iu8 v[24:31], v[8:11], v[16:19], v[24:31] neg_lo:[1,0,0]",
    );
    let Some(elf) = assemble_raw(&body, "", 0) else { return };
    let (out, _) = run_elf(&elf, &inp, 8 * 32, 32, 0).unwrap();
    for r in 0..16 {
        for c in 0..16 {
            let lane = (16 * r) % 32 + c;
            let want = (0..16).fold((lane * 1000 + r / 2) as i32, |s, k| s + ai(r, k) as i8 as i32 * bi(k, c) as i32);
            assert_eq!(out[(r / 2) * 32 + lane] as i32, want, "D[{r}][{c}]");
        }
    }
}

/// Special values of the packed f16 and mixed-precision ops (expected bits by hand, from the
/// ISA pseudo-code): fmas round once to the destination's precision, min/max keep the IEEE NaN
/// rules per half, generated NaNs are the default NaN.
#[test]
fn packed_and_mix_special_values() {
    // a*b + c = 1 + 5*2^-11 + 2^-31: just above a midpoint whose even neighbour is below, so
    // one rounding gives 0x3c03 and f32-then-f16 would give 0x3c02
    let (a, b, c) = (0x9001u32, 0x3bfeu32, 0x3c03u32);
    let i = abc(
        |l| if l == 0 { a | a << 16 } else { 0x7c00 | 0x3c00 << 16 },
        |l| if l == 0 { b | b << 16 } else { 0x7d00 << 16 },
        |l| if l == 0 { c | c << 16 } else { 0x3c00 | 0x3c00 << 16 },
    );
    let Some(out) = run("v_pk_fma_f16 v5, v2, v3, v4", &i) else { return };
    assert_eq!(out[0], 0x3c03_3c03, "pk_fma_f16 rounds once: {:#x}", out[0]);
    // lo: inf * 0 + 1 = the default NaN; hi: 1 * sNaN + 1 = that NaN quieted
    assert_eq!(out[1], 0x7f00_fe00, "pk_fma_f16 NaNs: {:#x}", out[1]);
    // the mix forms: f16 sources, f16 (lo/hi) or f32 result, one rounding
    let Some(out) = run("v_mov_b32 v5, 0\n v_fma_mixlo_f16 v5, v2, v3, v4 op_sel_hi:[1,1,1]", &i) else { return };
    assert_eq!(out[0] & 0xffff, 0x3c03, "fma_mixlo_f16 rounds once: {:#x}", out[0]);
    assert_eq!(out[1] & 0xffff, 0xfe00, "fma_mixlo_f16 inf*0: {:#x}", out[1]);
    let Some(out) = run("v_mov_b32 v5, 0x1234\n v_fma_mixhi_f16 v5, v2, v3, v4 op_sel_hi:[1,1,1]", &i) else { return };
    assert_eq!(out[0], 0x3c03_1234, "fma_mixhi_f16 keeps the low half: {:#x}", out[0]);
    let Some(out) = run("v_fma_mix_f32 v5, v2, v3, v4 op_sel_hi:[1,1,1]", &i) else { return };
    // exact in f32: 1 + 5*2^-11 + 2^-31 rounds to 1 + 5*2^-11 (2^-31 < half an ulp)
    assert_eq!(out[0], f(1.0 + 5.0 * 2f32.powi(-11)), "fma_mix_f32: {:#x}", out[0]);
    assert_eq!(out[1], 0xffc0_0000, "fma_mix_f32 inf*0: {:#x}", out[1]);
    // f32 sources in the mix: fma(2^-140, 2^-10, 0) = 2^-150, a tie -> 0
    let i = abc(|_| f(2f32.powi(-140)), |_| f(2f32.powi(-10)), |_| 0);
    let Some(out) = run("v_fma_mix_f32 v5, v2, v3, v4", &i) else { return };
    assert_eq!(out[0], 0, "{:#x}", out[0]);
    // pk_min/pk_max: sNaN -> quieted, qNaN -> the other half's operand, -0 < +0
    let i = abc(|_| 0x7d00 | 0x8000 << 16, |_| 0x3c00, |_| 0);
    let Some(out) = run("v_pk_min_f16 v5, v2, v3", &i) else { return };
    assert_eq!(out[0], 0x8000_7f00, "pk_min_f16: {:#x}", out[0]);
    let i = abc(|_| 0x7e01 | 0x8000 << 16, |_| 0xbc00, |_| 0);
    let Some(out) = run("v_pk_max_f16 v5, v2, v3", &i) else { return };
    assert_eq!(out[0], 0x0000_bc00, "pk_max_f16: {:#x}", out[0]);
}
