//! SMEM: scalar loads of every width, immediate and SGPR offsets, buffer loads through a
//! resource descriptor, and the dword alignment of scalar addresses.
mod common;
use common::*;

fn input() -> Vec<u32> {
    (0..96).map(|x| 0x1000 + x * 17).collect()
}

/// Run `body` (which leaves a value in s10) and return it.
fn s10(body: &str) -> Option<u32> {
    let out = run(&format!("{body}\n s_waitcnt lgkmcnt(0)\n v_mov_b32 v5, s10"), &input())?;
    Some(out[0])
}

#[test]
fn load_widths_and_offsets() {
    let i = input();
    let sum = |a: usize, n: usize| i[a..a + n].iter().fold(0u32, |s, x| s.wrapping_add(*x));
    let Some(v) = s10("s_load_b32 s10, s[2:3], 0x14") else { return };
    assert_eq!(v, i[5]);
    let Some(v) = s10("s_mov_b32 s4, 0x20\n s_load_b32 s10, s[2:3], s4 offset:0x8") else { return };
    assert_eq!(v, i[10]);
    let Some(v) = s10("s_load_b64 s[10:11], s[2:3], 0x0\n s_waitcnt lgkmcnt(0)\n s_add_u32 s10, s10, s11") else {
        return;
    };
    assert_eq!(v, sum(0, 2));
    let Some(v) = s10(
        "s_load_b128 s[12:15], s[2:3], 0x10\n s_waitcnt lgkmcnt(0)\n s_add_u32 s10, s12, s13\n s_add_u32 s10, s10, s14\n s_add_u32 s10, s10, s15",
    ) else {
        return;
    };
    assert_eq!(v, sum(4, 4));
    let mut body = String::from("s_load_b512 s[16:31], s[2:3], 0x40\n s_waitcnt lgkmcnt(0)\n s_mov_b32 s10, 0\n");
    for r in 16..32 {
        body += &format!(" s_add_u32 s10, s10, s{r}\n");
    }
    let Some(v) = s10(&body) else { return };
    assert_eq!(v, sum(16, 16));
    // the low two address bits are ignored
    let Some(v) = s10("s_load_b32 s10, s[2:3], 0x17") else { return };
    assert_eq!(v, i[5]);
}

#[test]
fn buffer_load() {
    // descriptor: base = input buffer, stride 0, num_records large
    let i = input();
    let Some(v) = s10(
        "s_mov_b32 s12, s2\n s_and_b32 s13, s3, 0xffff\n s_mov_b32 s14, -1\n s_mov_b32 s15, 0x31004000\n s_buffer_load_b32 s10, s[12:15], 0x24",
    ) else {
        return;
    };
    assert_eq!(v, i[9]);
}

#[test]
fn out_of_bounds_scalar_load_faults() {
    let Some(elf) = assemble_raw(
        &format!("{PROLOGUE} s_load_b32 s10, s[2:3], 0x180\n s_waitcnt lgkmcnt(0)\n v_mov_b32 v5, s10{EPILOGUE}"),
        "",
        0,
    ) else {
        return;
    };
    let e = run_elf(&elf, &[], 32, 32, 0).unwrap_err().to_string();
    assert!(e.contains("scalar load") && e.contains("s_load_b32 s10, s[2:3], 0x180"), "{e}");
}
