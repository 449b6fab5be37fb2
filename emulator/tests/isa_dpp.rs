//! DPP16 / DPP8 swizzles and the other cross-lane instructions (permlane16/x16, readlane,
//! writelane, readfirstlane, ds_swizzle, ds_bpermute, ds_permute). Expected values follow the
//! documented lane mappings, written out independently here.
mod common;
use common::*;

/// v5 = lane + 100 for all lanes, v6 = old value 0xAAAA, then `body`.
fn run_x(body: &str) -> Option<Vec<u32>> {
    let i = abc(|l| l as u32 + 100, |_| 0, |_| 0);
    run(&format!("v_mov_b32 v6, 0xaaaa\n{body}\n v_mov_b32 v5, v6"), &i)
}

fn row_src(ctrl: &str, l: usize) -> Option<usize> {
    let (r, li) = (l & !15, (l & 15) as i32);
    let s: i32 = match ctrl {
        "row_shl:1" => li + 1,
        "row_shl:3" => li + 3,
        "row_shr:1" => li - 1,
        "row_shr:15" => li - 15,
        "row_ror:4" => (li - 4).rem_euclid(16),
        "row_mirror" => 15 - li,
        "row_half_mirror" => (li & 8) | (7 - (li & 7)),
        "row_share:5" => 5,
        "row_xmask:6" => li ^ 6,
        "quad_perm:[3,2,1,0]" => (li & !3) | (3 - (li & 3)),
        "quad_perm:[0,0,0,0]" => li & !3,
        _ => unreachable!(),
    };
    if (0..16).contains(&s) { Some(r + s as usize) } else { None }
}

#[test]
fn dpp16_controls() {
    for ctrl in [
        "row_shl:1",
        "row_shl:3",
        "row_shr:1",
        "row_shr:15",
        "row_ror:4",
        "row_mirror",
        "row_half_mirror",
        "row_share:5",
        "row_xmask:6",
        "quad_perm:[3,2,1,0]",
        "quad_perm:[0,0,0,0]",
    ] {
        for bc in [false, true] {
            let body = format!(
                "v_mov_b32_dpp v6, v2 {ctrl} row_mask:0xf bank_mask:0xf{}",
                if bc { " bound_ctrl:1" } else { "" }
            );
            let Some(out) = run_x(&body) else { return };
            for l in 0..32 {
                let want = match row_src(ctrl, l) {
                    Some(s) => s as u32 + 100,
                    None => {
                        if bc {
                            0
                        } else {
                            0xaaaa
                        }
                    }
                };
                assert_eq!(out[l], want, "{body} lane {l}");
            }
        }
    }
}

#[test]
fn dpp16_row_and_bank_masks() {
    let Some(out) = run_x("v_mov_b32_dpp v6, v2 row_mirror row_mask:0x2 bank_mask:0x5") else { return };
    for l in 0..32 {
        let li = l & 15;
        let on = l >= 16 && (li / 4 == 0 || li / 4 == 2);
        assert_eq!(out[l], if on { (l & 16) as u32 + 15 - li as u32 + 100 } else { 0xaaaa }, "lane {l}");
    }
}

#[test]
fn dpp_folded_into_add() {
    // the reduction step LLVM emits: v_add_f32_dpp with row_xmask
    let i = abc(|l| f(l as f32), |_| 0, |_| 0);
    let Some(out) = run("v_add_f32_dpp v5, v2, v2 row_xmask:1 row_mask:0xf bank_mask:0xf bound_ctrl:1", &i) else {
        return;
    };
    for l in 0..32 {
        assert_eq!(ff(out[l]), (l + (l ^ 1)) as f32, "lane {l}");
    }
}

#[test]
fn dpp8() {
    let Some(out) = run_x("v_mov_b32_dpp v6, v2 dpp8:[7,6,5,4,3,2,1,0]") else { return };
    for l in 0..32 {
        assert_eq!(out[l], ((l & !7) | (7 - (l & 7))) as u32 + 100, "lane {l}");
    }
}

#[test]
fn permlanes() {
    // selector nibble n of lane i (within a row) = (i * 5 + 3) % 16
    let (lo, hi) = (0..8).fold((0u32, 0u32), |(a, b), i| {
        (a | (((i * 5 + 3) % 16) << (4 * i)), b | ((((i + 8) * 5 + 3) % 16) << (4 * i)))
    });
    let body = format!("s_mov_b32 s4, {lo:#x}\n s_mov_b32 s5, {hi:#x}\n v_permlane16_b32 v6, v2, s4, s5");
    let Some(out) = run_x(&body) else { return };
    for l in 0..32 {
        assert_eq!(out[l], ((l & 16) + (((l & 15) * 5 + 3) % 16)) as u32 + 100, "permlane16 lane {l}");
    }
    let body = format!("s_mov_b32 s4, {lo:#x}\n s_mov_b32 s5, {hi:#x}\n v_permlanex16_b32 v6, v2, s4, s5");
    let Some(out) = run_x(&body) else { return };
    for l in 0..32 {
        assert_eq!(out[l], (((l & 16) ^ 16) + (((l & 15) * 5 + 3) % 16)) as u32 + 100, "permlanex16 lane {l}");
    }
}

#[test]
fn readlane_writelane_readfirstlane() {
    let Some(out) = run_x("v_readlane_b32 s4, v2, 13\n v_mov_b32 v6, s4") else { return };
    assert!(out.iter().all(|&x| x == 113));
    let Some(out) = run_x("s_mov_b32 s4, 77\n v_writelane_b32 v6, s4, 9") else { return };
    for l in 0..32 {
        assert_eq!(out[l], if l == 9 { 77 } else { 0xaaaa });
    }
    // with lanes 0-4 disabled the first active lane is 5
    let Some(out) = run_x(
        "s_mov_b32 s6, exec_lo\n s_and_b32 exec_lo, exec_lo, 0xffffffe0\n v_readfirstlane_b32 s4, v2\n s_mov_b32 exec_lo, s6\n v_mov_b32 v6, s4",
    ) else {
        return;
    };
    assert!(out.iter().all(|&x| x == 105), "{out:?}");
}

#[test]
fn ds_cross_lane() {
    // ds_swizzle "pipip": bit 4 first, so xor mask 0b01010 (and=0x1f, or=0)
    let Some(out) = run_x("ds_swizzle_b32 v6, v2 offset:swizzle(BITMASK_PERM,\"pipip\")\n s_waitcnt lgkmcnt(0)") else {
        return;
    };
    for l in 0..32 {
        assert_eq!(out[l], (l ^ 10) as u32 + 100, "swizzle lane {l}");
    }
    // ds_bpermute: lane l reads lane (addr/4) % 32 with addr = ((l * 7) % 32) * 4
    let Some(out) = run_x(
        "v_mul_u32_u24 v7, 7, v0\n v_and_b32 v7, 31, v7\n v_lshlrev_b32 v7, 2, v7\n ds_bpermute_b32 v6, v7, v2\n s_waitcnt lgkmcnt(0)",
    ) else {
        return;
    };
    for l in 0..32 {
        assert_eq!(out[l], ((l * 7) % 32) as u32 + 100, "bpermute lane {l}");
    }
    // ds_permute: lane l writes to lane (l * 7) % 32
    let Some(out) = run_x(
        "v_mul_u32_u24 v7, 7, v0\n v_and_b32 v7, 31, v7\n v_lshlrev_b32 v7, 2, v7\n ds_permute_b32 v6, v7, v2\n s_waitcnt lgkmcnt(0)",
    ) else {
        return;
    };
    for l in 0..32 {
        assert_eq!(out[(l * 7) % 32], l as u32 + 100, "permute lane {l}");
    }
}

#[test]
fn vop3_dpp() {
    let i = abc(|l| f(l as f32), |l| f(-(l as f32) * 2.0), |_| 0);
    // dst = -src0[swizzled] + |src1|
    let Some(out) = run("v_add_f32_e64_dpp v5, -v2, |v3| quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf", &i) else {
        return;
    };
    for l in 0..32 {
        assert_eq!(ff(out[l]), -((l ^ 1) as f32) + 2.0 * l as f32, "lane {l}");
    }
    let Some(out) = run("v_fma_f32_e64_dpp v5, v2, v3, v2 dpp8:[1,0,3,2,5,4,7,6]", &i) else { return };
    for l in 0..32 {
        assert_eq!(ff(out[l]), ((l ^ 1) as f32).mul_add(-(l as f32) * 2.0, l as f32), "fma lane {l}");
    }
}
