//! DS (LDS): loads/stores of every width, 2addr forms, atomics, bounds, and barrier
//! interleaving across the waves of a workgroup.
mod common;
use common::*;

#[test]
fn lds_widths_and_2addr() {
    let i = abc(|l| 0x1000_0000 + l as u32, |l| 0x2000_0000 + l as u32, |_| 0);
    let body = "v_lshlrev_b32 v7, 3, v0\n ds_store_2addr_b32 v7, v2, v3 offset1:1\n s_waitcnt lgkmcnt(0)\n ds_load_b64 v[8:9], v7\n s_waitcnt lgkmcnt(0)\n v_sub_nc_u32 v5, v9, v8";
    let Some(elf) = assemble_raw(&format!("{PROLOGUE}{body}{EPILOGUE}"), "", 256) else { return };
    let (out, st) = run_elf(&elf, &i, 32, 32, 0).unwrap();
    assert!(out.iter().all(|&x| x == 0x1000_0000), "{out:x?}");
    assert!(st.lds_bytes >= 32 * 16);
    // byte/short stores and sign-extending loads
    let body = "ds_store_b8 v0, v2\n ds_store_b16 v0, v2 offset:64\n s_waitcnt lgkmcnt(0)\n ds_load_i8 v8, v0\n ds_load_u16 v9, v0 offset:64\n s_waitcnt lgkmcnt(0)\n v_add_nc_u32 v5, v8, v9";
    let i = abc(|l| 0xffff_ff80 + l as u32, |_| 0, |_| 0);
    let Some(elf) = assemble_raw(&format!("{PROLOGUE}{body}{EPILOGUE}"), "", 128) else { return };
    let (out, _) = run_elf(&elf, &i, 32, 32, 0).unwrap();
    // each lane stores at byte address l; lane l's u16 load at 64+l overlaps lane l+1's bytes
    let mut lds = [0u8; 128];
    for l in 0..32 {
        lds[l] = i[l] as u8;
    }
    for l in 0..32 {
        let b = (i[l] as u16).to_le_bytes();
        lds[64 + l] = b[0];
        lds[65 + l] = b[1];
    }
    for l in 0..32 {
        let want = (lds[l] as i8 as i32 as u32).wrapping_add(u16::from_le_bytes([lds[64 + l], lds[65 + l]]) as u32);
        assert_eq!(out[l], want, "lane {l}");
    }
}

#[test]
fn lds_atomics_and_rtn() {
    // every lane adds its id to one counter and gets the running value back
    let body = "v_mov_b32 v7, 0\n ds_add_rtn_u32 v8, v7, v0\n s_waitcnt lgkmcnt(0)\n ds_load_b32 v9, v7\n s_waitcnt lgkmcnt(0)\n v_lshlrev_b32 v9, 16, v9\n v_or_b32 v5, v8, v9";
    let Some(elf) = assemble_raw(&format!("{PROLOGUE}{body}{EPILOGUE}"), "", 64) else { return };
    let (out, _) = run_elf(&elf, &[], 32, 32, 0).unwrap();
    for l in 0..32 {
        assert_eq!(
            out[l],
            // Lane l's return value is the sum of the lanes before it; the final sum (0+..+31 = 496)
            // is in the high half.
            (0..l as u32).sum::<u32>() | (496 << 16),
            "lane {l}"
        );
    }
}

#[test]
fn lds_out_of_range_faults() {
    let Some(elf) = assemble_raw(
        &format!(
            "{PROLOGUE} v_mov_b32 v7, 252\n ds_load_b64 v[8:9], v7\n s_waitcnt lgkmcnt(0)\n v_mov_b32 v5, v8{EPILOGUE}"
        ),
        "",
        256,
    ) else {
        return;
    };
    let e = run_elf(&elf, &[], 32, 32, 0).unwrap_err().to_string();
    assert!(e.contains("LDS read") && e.contains("ds_load_b64") && e.contains("lane 0"), "{e}");
    // the dynamic LDS size extends the valid range
    assert!(run_elf(&elf, &[], 32, 32, 16).is_ok());
}

/// 64 work-items (2 waves): each writes its id to LDS, then reads the slot of the mirror
/// work-item in the other wave. With the barrier every read sees the write; without it the
/// first wave runs ahead and reads zeros, as it could on hardware.
#[test]
fn barrier_interleaving() {
    let body = |bar: &str| {
        format!(
            "{PROLOGUE}
  v_lshlrev_b32 v7, 2, v0
  v_add_nc_u32 v8, 1, v0
  ds_store_b32 v7, v8
  s_waitcnt lgkmcnt(0)
  {bar}
  v_sub_nc_u32 v9, 63, v0
  v_lshlrev_b32 v9, 2, v9
  ds_load_b32 v5, v9
  s_waitcnt lgkmcnt(0)
  global_store_b32 v7, v5, s[0:1]
  s_endpgm"
        )
    };
    let Some(elf) = assemble_raw(&body("s_barrier"), "", 256) else { return };
    let (out, st) = run_elf(&elf, &[0; 200], 64, 64, 0).unwrap();
    for t in 0..64 {
        assert_eq!(out[t], 64 - t as u32, "item {t}");
    }
    assert_eq!(st.waves, 2);
    let Some(elf) = assemble_raw(&body("s_nop 0"), "", 256) else { return };
    let (out, _) = run_elf(&elf, &[0; 200], 64, 64, 0).unwrap();
    assert!(out[..32].iter().all(|&x| x == 0), "a missing barrier must show: {out:?}");
}
