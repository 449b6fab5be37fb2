//! GLOBAL / FLAT / SCRATCH memory: widths, d16 halves, saddr vs 64-bit vaddr, FLAT routing
//! to the LDS aperture, atomics, unaligned access and bounds checks.
mod common;
use common::*;

#[test]
fn global_widths() {
    let i: Vec<u32> = (0..96).map(|x| 0x0101_0101u32.wrapping_mul(x + 1)).collect();
    // b128 load of in[4l..4l+4] for lanes < 8 (in bounds), xor-folded
    let body = "v_cmpx_gt_u32 8, v0\n v_lshlrev_b32 v7, 4, v0\n global_load_b128 v[8:11], v7, s[2:3]\n s_waitcnt vmcnt(0)\n v_xor3_b32 v5, v8, v9, v10\n v_xor_b32 v5, v5, v11\n s_mov_b32 exec_lo, -1";
    let Some(out) = run(body, &i) else { return };
    for l in 0..8 {
        assert_eq!(out[l], i[4 * l] ^ i[4 * l + 1] ^ i[4 * l + 2] ^ i[4 * l + 3], "lane {l}");
    }
    // u8 / i16 / d16_hi loads at unaligned byte offsets
    let bytes: Vec<u8> = i.iter().flat_map(|x| x.to_le_bytes()).collect();
    let Some(out) = run(
        "global_load_i16 v8, v0, s[2:3] offset:1\n global_load_u8 v9, v0, s[2:3] offset:3\n v_mov_b32 v10, 0x1234\n global_load_d16_hi_b16 v10, v0, s[2:3] offset:5\n s_waitcnt vmcnt(0)\n v_add3_u32 v5, v8, v9, v10",
        &i,
    ) else {
        return;
    };
    for l in 0..32 {
        let a = i16::from_le_bytes([bytes[l + 1], bytes[l + 2]]) as i32 as u32;
        let b = bytes[l + 3] as u32;
        let c = 0x1234 | (u16::from_le_bytes([bytes[l + 5], bytes[l + 6]]) as u32) << 16;
        assert_eq!(out[l], a.wrapping_add(b).wrapping_add(c), "lane {l}");
    }
}

#[test]
fn flat_and_64bit_addresses() {
    let i: Vec<u32> = (0..96).map(|x| x * 11).collect();
    // build a 64-bit address per lane and use flat + global-with-off forms
    let body = "v_add_co_u32 v8, vcc_lo, s2, v1\n v_add_co_ci_u32_e64 v9, null, s3, 0, vcc_lo\n flat_load_b32 v10, v[8:9] offset:128\n global_load_b32 v11, v[8:9], off offset:256\n s_waitcnt vmcnt(0) lgkmcnt(0)\n v_add_nc_u32 v5, v10, v11";
    let Some(out) = run(body, &i) else { return };
    for l in 0..32 {
        assert_eq!(out[l], i[32 + l] + i[64 + l], "lane {l}");
    }
    // FLAT through the shared aperture reaches LDS
    let body = "s_mov_b64 s[8:9], src_shared_base\n v_mov_b32 v9, s9\n v_lshlrev_b32 v8, 2, v0\n flat_store_b32 v[8:9], v2\n s_waitcnt vmcnt(0) lgkmcnt(0)\n ds_load_b32 v5, v8\n s_waitcnt lgkmcnt(0)";
    let Some(elf) = assemble_raw(&format!("{PROLOGUE}{body}{EPILOGUE}"), "", 128) else { return };
    let (out, _) = run_elf(&elf, &i, 32, 32, 0).unwrap();
    for l in 0..32 {
        assert_eq!(out[l], i[l], "lane {l}");
    }
}

#[test]
fn atomics() {
    // all lanes add to out[40]; returned values are distinct prefixes
    let body = "v_mov_b32 v7, 160\n v_mov_b32 v8, 1\n global_atomic_add_u32 v9, v7, v8, s[0:1] glc\n s_waitcnt vmcnt(0)\n v_mov_b32 v5, v9";
    let Some(elf) = assemble_raw(&format!("{PROLOGUE}{body}{EPILOGUE}"), "", 0) else { return };
    let (out, _) = run_elf(&elf, &[], 41, 32, 0).unwrap();
    let mut seen: Vec<u32> = out[..32].to_vec();
    seen.sort();
    assert_eq!(seen, (0..32).collect::<Vec<u32>>());
    assert_eq!(out[40], 32);
    // cmpswap: only the lane whose compare value matches succeeds
    let body = "v_mov_b32 v7, 160\n v_mov_b32 v8, v0\n v_mov_b32 v9, 7\n global_atomic_cmpswap_b32 v10, v7, v[8:9], s[0:1] glc\n s_waitcnt vmcnt(0)\n v_mov_b32 v5, v10";
    let Some(elf) = assemble_raw(&format!("{PROLOGUE}{body}{EPILOGUE}"), "", 0) else { return };
    let (out, _) = run_elf(&elf, &[], 41, 32, 0).unwrap();
    // memory starts at 0: lane 0 (data 0 == cmp 7? no) -> nothing matches until value is 7
    assert_eq!(out[40], 0, "no lane had compare value 0 == 7");
}

#[test]
fn scratch_per_lane() {
    let body = "scratch_store_b32 off, v2, off offset:8\n v_mov_b32 v8, 4\n scratch_store_b32 v8, v3, off\n s_waitcnt vmcnt(0)\n scratch_load_b32 v9, off, off offset:8\n scratch_load_b32 v10, off, off offset:4\n s_waitcnt vmcnt(0)\n v_sub_nc_u32 v5, v9, v10";
    let i = abc(|l| 1000 + l as u32 * 3, |l| l as u32, |_| 0);
    let Some(elf) = assemble_raw(
        &format!("{PROLOGUE}{body}{EPILOGUE}"),
        "  .amdhsa_private_segment_fixed_size 16\n  .amdhsa_enable_private_segment 1",
        0,
    ) else {
        return;
    };
    let (out, _) = run_elf(&elf, &i, 32, 32, 0).unwrap_or_else(|e| panic!("{e}"));
    for l in 0..32 {
        assert_eq!(out[l], 1000 + 2 * l as u32, "lane {l}");
    }
}

#[test]
fn out_of_bounds_names_lane_and_address() {
    // lane 31 reads 4 bytes past the 96-word input buffer
    let Some(elf) = assemble_raw(&format!("{PROLOGUE} global_load_b32 v5, v1, s[2:3] offset:260{EPILOGUE}"), "", 0)
    else {
        return;
    };
    let e = run_elf(&elf, &[], 32, 32, 0).unwrap_err().to_string();
    assert!(
        e.contains("lane 31")
            && e.contains("global read")
            && e.contains("global_load_b32 v5, v1, s[2:3] offset:260")
            && e.contains("kernel k"),
        "{e}"
    );
}
