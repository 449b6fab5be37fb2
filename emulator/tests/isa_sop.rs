//! Scalar ALU (SOP1/SOP2/SOPK/SOPC), branches (SOPP) and SMEM. Results are moved to v5 with
//! v_mov_b32 so they come back through the common epilogue.
mod common;
use common::*;

fn scalar(body: &str) -> Option<u32> {
    let out = run(&format!("{body}\n v_mov_b32 v5, s10"), &[])?;
    assert!(out.iter().all(|&x| x == out[0]));
    Some(out[0])
}

#[test]
fn sop2_arith_and_scc() {
    let cases: &[(&str, u32)] = &[
        ("s_mov_b32 s4, 0xfffffff0\n s_add_u32 s10, s4, 0x20", 0x10),
        ("s_mov_b32 s4, 0xfffffff0\n s_add_u32 s5, s4, 0x20\n s_cselect_b32 s10, 1, 2", 1), // carry out
        ("s_mov_b32 s4, 5\n s_sub_u32 s5, s4, 6\n s_subb_u32 s10, 10, 0", 9),               // borrow chain
        ("s_mov_b32 s4, 0x80000000\n s_ashr_i32 s10, s4, 4", 0xf8000000),
        ("s_mov_b32 s4, 0x12345678\n s_bfe_u32 s10, s4, 0x80004", 0x67), // offset 4, width 8
        ("s_mov_b32 s4, 0xff\n s_bfe_i32 s10, s4, 0x40004", 0xffffffff),
        ("s_mov_b32 s4, 7\n s_mul_i32 s10, s4, -3", -21i32 as u32),
        ("s_mov_b32 s4, 0x10000\n s_mul_hi_u32 s10, s4, 0x30000", 3),
        ("s_mov_b32 s4, 3\n s_lshl2_add_u32 s10, s4, 5", 17),
        ("s_mov_b32 s4, 0xf0f0\n s_and_not1_b32 s10, s4, 0xff00", 0xf0),
        ("s_mov_b32 s4, -5\n s_max_i32 s10, s4, 3", 3),
        ("s_mov_b32 s4, 0x1234\n s_pack_ll_b32_b16 s10, s4, 0xabcd", 0xabcd1234),
        ("s_mov_b64 s[4:5], -1\n s_lshr_b64 s[10:11], s[4:5], 36", 0x0fffffff),
        ("s_movk_i32 s10, 0x8000", 0xffff8000),
        ("s_movk_i32 s10, 100\n s_addk_i32 s10, 0x10", 116),
        ("s_mov_b32 s4, 0x00f00000\n s_ctz_i32_b32 s10, s4", 20),
        ("s_mov_b32 s4, 0x00f00000\n s_clz_i32_u32 s10, s4", 8),
        ("s_mov_b32 s4, 0xf0f0\n s_bcnt1_i32_b32 s10, s4", 8),
        ("s_mov_b32 s4, 0x80\n s_sext_i32_i8 s10, s4", 0xffffff80),
        ("s_mov_b32 s4, 1\n s_brev_b32 s10, s4", 0x80000000),
        ("s_mov_b32 s4, 5\n s_cmp_gt_i32 s4, -1\n s_cselect_b32 s10, 11, 22", 11),
        ("s_mov_b32 s4, 5\n s_cmp_gt_u32 s4, -1\n s_cselect_b32 s10, 11, 22", 22),
        ("s_mov_b32 s4, 5\n s_cmpk_lt_u32 s4, 0x6\n s_cselect_b32 s10, 11, 22", 11),
        ("s_mov_b32 s4, 4\n s_bitcmp1_b32 s4, 2\n s_cselect_b32 s10, 11, 22", 11),
    ];
    for (body, want) in cases {
        let Some(got) = scalar(body) else { return };
        assert_eq!(got, *want, "`{body}` = {got:#x}, want {want:#x}");
    }
}

#[test]
fn branches_and_loops() {
    // sum 1..=10 with a counted loop
    let body = "s_mov_b32 s10, 0\n s_mov_b32 s4, 10\nL1:\n s_add_u32 s10, s10, s4\n s_sub_u32 s4, s4, 1\n s_cmp_lg_u32 s4, 0\n s_cbranch_scc1 L1";
    if let Some(v) = scalar(body) {
        assert_eq!(v, 55);
    }
    // exec-masked region: lanes >= 8 skip the increment
    let Some(out) = run(
        "v_mov_b32 v5, 1\n s_mov_b32 s6, exec_lo\n v_cmpx_gt_u32 8, v0\n s_cbranch_execz SKIP\n v_add_nc_u32 v5, v5, 41\nSKIP:\n s_mov_b32 exec_lo, s6",
        &[],
    ) else {
        return;
    };
    for l in 0..32 {
        assert_eq!(out[l], if l < 8 { 42 } else { 1 }, "lane {l}");
    }
    // saveexec form and VCC branch
    let Some(out) = run(
        "v_mov_b32 v5, 3\n v_cmp_lt_u32 vcc_lo, v0, 5\n s_and_saveexec_b32 s6, vcc_lo\n v_mov_b32 v5, 4\n s_or_b32 exec_lo, exec_lo, s6",
        &[],
    ) else {
        return;
    };
    for l in 0..32 {
        assert_eq!(out[l], if l < 5 { 4 } else { 3 }, "lane {l}");
    }
}

#[test]
fn getpc_and_smem() {
    // s_load_b64 of the input buffer: in[0..2]
    let i: Vec<u32> = (0..96).map(|x| x * 3 + 1).collect();
    let Some(out) = run(
        "s_load_b64 s[10:11], s[2:3], 0x8\n s_waitcnt lgkmcnt(0)\n s_add_u32 s10, s10, s11\n v_mov_b32 v5, s10",
        &i,
    ) else {
        return;
    };
    assert!(out.iter().all(|&x| x == i[2] + i[3]));
    // s_getpc_b64 returns the address of the next instruction
    let Some(out) =
        run("s_getpc_b64 s[10:11]\n s_getpc_b64 s[12:13]\n s_sub_u32 s10, s12, s10\n v_mov_b32 v5, s10", &[])
    else {
        return;
    };
    assert!(out.iter().all(|&x| x == 4));
}
