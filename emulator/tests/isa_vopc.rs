//! VOPC compares in e32 (VCC) and e64 (SGPR) form, v_cmpx (EXEC), v_cmp_class, v_cndmask.
mod common;
use common::*;

fn mask_of(body: &str, input: &[u32]) -> Option<u32> {
    let out = run(&format!("{body}\n v_mov_b32 v5, s10"), input)?;
    Some(out[0])
}

#[test]
fn compares() {
    let nan = f32::NAN.to_bits();
    let i = abc(
        |l| [f(1.0), f(-2.0), nan, f(0.0), f(-0.0), f(3.0), f(f32::INFINITY), f(5.0)][l % 8],
        |l| [f(1.0), f(2.0), f(1.0), f(-0.0), f(0.0), f(2.0), f(1.0), nan][l % 8],
        |l| l as u32,
    );
    let a = |l: usize| ff(i[l]);
    let b = |l: usize| ff(i[32 + l]);
    let expect = |p: &dyn Fn(usize) -> bool| (0..32).filter(|&l| p(l)).fold(0u32, |m, l| m | 1 << l);
    for (op, p) in [
        ("v_cmp_lt_f32", &(|l| a(l) < b(l)) as &dyn Fn(usize) -> bool),
        ("v_cmp_eq_f32", &|l| a(l) == b(l)),
        ("v_cmp_neq_f32", &|l| !(a(l) == b(l))),
        ("v_cmp_lg_f32", &|l| a(l) < b(l) || a(l) > b(l)),
        ("v_cmp_o_f32", &|l| !a(l).is_nan() && !b(l).is_nan()),
        ("v_cmp_nge_f32", &|l| !(a(l) >= b(l))),
    ] {
        let Some(m) = mask_of(&format!("{op}_e64 s10, v2, v3"), &i) else { return };
        assert_eq!(m, expect(p), "{op}");
        let Some(m) = mask_of(&format!("{op}_e32 vcc_lo, v2, v3\n s_mov_b32 s10, vcc_lo"), &i) else { return };
        assert_eq!(m, expect(p), "{op} e32");
    }
    let Some(m) = mask_of("v_cmp_gt_i32 s10, v2, v4", &i) else { return };
    assert_eq!(m, expect(&|l| (i[l] as i32) > l as i32));
    let Some(m) = mask_of("v_cmp_gt_u32 s10, v2, v4", &i) else { return };
    assert_eq!(m, expect(&|l| i[l] > l as u32));
    // class: quiet NaN (bit 1) | -0 (bit 5) | +inf (bit 9)
    let Some(m) = mask_of("v_mov_b32 v6, 0x222\n v_cmp_class_f32 s10, v2, v6", &i) else { return };
    assert_eq!(m, expect(&|l| a(l).is_nan() || (a(l) == 0.0 && a(l).is_sign_negative()) || a(l) == f32::INFINITY));
}

#[test]
fn cmpx_and_cndmask() {
    let i = abc(|l| l as u32, |l| 100 + l as u32, |l| 200 + l as u32);
    let Some(out) = run("v_mov_b32 v5, v3\n v_cmpx_lt_u32 v2, 10\n v_mov_b32 v5, v4\n s_mov_b32 exec_lo, -1", &i)
    else {
        return;
    };
    for l in 0..32 {
        assert_eq!(out[l], if l < 10 { 200 + l as u32 } else { 100 + l as u32 });
    }
    let Some(out) = run(
        "v_cmp_eq_u32 s8, 1, v2 \n v_and_b32 v6, 1, v2\n v_cmp_eq_u32 vcc_lo, 1, v6\n v_cndmask_b32 v5, v3, v4, vcc_lo",
        &i,
    ) else {
        return;
    };
    for l in 0..32 {
        assert_eq!(out[l], if l % 2 == 1 { 200 + l as u32 } else { 100 + l as u32 });
    }
}

/// v_cmp_class: bit k of the mask selects class k (0 sNaN, 1 qNaN, 2 -inf, 3 -normal,
/// 4 -denormal, 5 -0, 6 +0, 7 +denormal, 8 +normal, 9 +inf); every value against its own class
/// bit alone (true) and against all other bits (false), for f32, f16 and f64.
#[test]
fn class_of_every_special_value() {
    let f32s: [(u32, u32); 12] = [
        (0x7f80_0001, 0),
        (0xffbf_ffff, 0),
        (0x7fc0_0000, 1),
        (0xffc0_0123, 1),
        (0xff80_0000, 2),
        (0xbf80_0000, 3),
        (0xff7f_ffff, 3),
        (0x8000_0001, 4),
        (0x8000_0000, 5),
        (0, 6),
        (0x007f_ffff, 7),
        (0x7f80_0000, 9),
    ];
    let f16s: [(u32, u32); 10] = [
        (0x7c01, 0),
        (0x7e00, 1),
        (0xfc00, 2),
        (0xbc00, 3),
        (0x8001, 4),
        (0x8000, 5),
        (0, 6),
        (0x03ff, 7),
        (0x7bff, 8),
        (0x7c00, 9),
    ];
    for (body, vals) in
        [("v_cmp_class_f32_e64 s4, v2, v3", &f32s[..]), ("v_cmp_class_f16_e64 s4, v2.l, v3.l", &f16s[..])]
    {
        for own in [true, false] {
            let i = abc(
                |l| vals.get(l).map_or(0, |v| v.0),
                |l| vals.get(l).map_or(0, |v| if own { 1 << v.1 } else { 0x3ff & !(1 << v.1) }),
                |_| 0,
            );
            let Some(out) = run(&format!("{body}\n v_cndmask_b32_e64 v5, 0, 1, s4"), &i) else { return };
            for (l, v) in vals.iter().enumerate() {
                assert_eq!(out[l], own as u32, "`{body}` value {:#x} class {} mask {:#x}", v.0, v.1, i[32 + l]);
            }
        }
    }
    // f64 (high dwords; the low dword 1 makes 0x7ff00000_00000001 a signalling NaN)
    let f64s: [(u32, u32, u32); 6] = [
        (0x7ff0_0000, 1, 0),
        (0x7ff8_0000, 0, 1),
        (0xfff0_0000, 0, 2),
        (0x8000_0000, 0, 5),
        (0x0000_0000, 1, 7),
        (0x3ff0_0000, 0, 8),
    ];
    let i = abc(
        |l| f64s.get(l).map_or(0, |v| v.1),
        |l| f64s.get(l).map_or(0, |v| v.0),
        |l| f64s.get(l).map_or(0, |v| 1 << v.2),
    );
    let Some(out) = run("v_cmp_class_f64_e64 s4, v[2:3], v4\n v_cndmask_b32_e64 v5, 0, 1, s4", &i) else { return };
    for (l, v) in f64s.iter().enumerate() {
        assert_eq!(out[l], 1, "f64 {:#x}_{:08x} class {}", v.0, v.1, v.2);
    }
}
