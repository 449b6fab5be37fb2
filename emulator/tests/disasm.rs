//! The disassembler against `llvm-objdump-22 -d --mcpu=gfx1100`: every instruction line must
//! be identical, including the `// ADDRESS: WORDS` comment column and branch-target labels. Runs on the Rust fixture, on a hand-written .s covering
//! the encodings of the ISA tests, and on the gpu-kernels code object when one is built.
mod common;
use std::process::Command;

use common::objdump::compare;

#[test]
fn rust_fixture() {
    compare("rust_kernels.elf", common::fixture::rust_kernels_elf());
}

#[test]
fn gpu_kernels_object() {
    // The project's kernels, when a build left them where the gpu-kernels build puts them.
    let candidates = [
        std::env::var("STRATA_GPUK_ELF").unwrap_or_default(),
        "/work/target-gpuk/amdgcn-kernels/kernels-gfx1100/amdgcn-amd-amdhsa/release/gpu_kernels.elf".into(),
    ];
    match candidates.iter().find(|p| !p.is_empty() && std::path::Path::new(p).exists()) {
        Some(p) => compare(p, &std::fs::read(p).unwrap()),
        None => eprintln!("gpu-kernels object not built; set STRATA_GPUK_ELF to compare it"),
    }
}

#[test]
fn handwritten_encodings() {
    let body = r#"
  s_load_b128 s[0:3], s[0:1], 0x0
  s_load_b32 s4, s[2:3], s5 offset:0x10
  s_waitcnt vmcnt(0) lgkmcnt(0)
  s_mov_b32 s6, 0x12345678
  s_mov_b64 s[8:9], exec
  s_mov_b64 s[16:17], 0xffffffff
  s_mov_b64 s[16:17], lit(0x5)
  s_and_b64 s[16:17], s[2:3], 0xfffffff0
  s_add_u32 s4, s4, -1
  s_addc_u32 s5, s5, 0xffffffff
  s_cmpk_lg_i32 s4, 0x10
  s_and_saveexec_b32 s10, vcc_lo
  s_cselect_b32 s11, 1.0, s4
  s_bfe_u32 s12, s4, 0x80004
  s_getpc_b64 s[14:15]
  s_delay_alu instid0(VALU_DEP_1) | instskip(NEXT) | instid1(SALU_CYCLE_1)
  s_clause 0x1
  v_mov_b32 v1, 0.5
  v_add_f32 v2, -v1, v3
  v_add_f32_e64 v2, |v1|, -v3 clamp
  v_mul_f32_e64 v2, v1, v3 mul:2
  v_fma_f32 v4, v1, s4, 0x40490fdb
  v_fmaak_f32 v4, v1, v2, 0x3f800000
  v_fmamk_f32 v4, v1, 0x3f800000, v2
  v_add_co_u32 v5, vcc_lo, v1, v2
  v_add_co_ci_u32_e32 v6, vcc_lo, v1, v2, vcc_lo
  v_add_co_ci_u32_e64 v6, s4, v1, 0, s5
  v_mad_u64_u32 v[6:7], null, v1, v2, v[8:9]
  v_cmp_gt_u32_e32 vcc_lo, 5, v1
  v_cmp_lt_f32_e64 s4, v1, 1.0
  v_cmpx_eq_u32_e32 0, v0
  v_cndmask_b32_e32 v1, v2, v3, vcc_lo
  v_cndmask_b32_e64 v1, v2, v3, s4
  v_cvt_f32_f16_e32 v1, v2.h
  v_add_f16_e32 v1.h, v2.l, v3.h
  v_add_f16_e64 v1.l, v2.h, v3.l
  v_mov_b16_e32 v1.l, v2.h
  v_readlane_b32 s4, v1, 5
  v_readfirstlane_b32 s5, v2
  v_writelane_b32 v3, s4, 7
  v_permlanex16_b32 v1, v2, s4, s5
  v_perm_b32 v1, v2, v3, 0xc0c0400
  v_bfe_u32 v1, v2, 8, 4
  v_lshlrev_b64 v[1:2], 2, v[3:4]
  v_add_f32_dpp v1, v2, v3 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf bound_ctrl:1
  v_mov_b32_dpp v1, v2 row_shr:3 row_mask:0x5 bank_mask:0xa
  v_mov_b32_dpp v1, v2 row_share:2 row_mask:0xf bank_mask:0xf fi:1
  v_mov_b32_dpp v1, v2 dpp8:[7,6,5,4,3,2,1,0]
  v_add_f32_e64_dpp v1, -v2, |v3| quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf
  v_add_nc_u32_dpp v1, v2, v3 row_xmask:8 row_mask:0xf bank_mask:0xf bound_ctrl:1
  v_cmp_gt_u32_e64_dpp s4, v2, v3 row_shl:2 row_mask:0xf bank_mask:0xf
  v_fma_f32_e64_dpp v1, v2, v3, v4 dpp8:[1,0,3,2,5,4,7,6]
  v_dot4_i32_iu8 v1, v2, v3, v4 neg_lo:[1,0,0]
  v_dot2_f32_f16 v1, v2, v3, v4
  v_pk_fma_f16 v1, v2, v3, v4 op_sel:[1,0,0] op_sel_hi:[0,1,1]
  v_pk_add_u16 v1, v2, v3
  v_fma_mix_f32 v1, -v2, v3, |v4| op_sel_hi:[1,0,0]
  v_wmma_f32_16x16x16_f16 v[24:31], v[8:15], v[16:23], v[24:31]
  v_wmma_i32_16x16x16_iu8 v[24:31], v[8:11], v[16:19], v[24:31] neg_lo:[1,1,0]
  v_dual_mul_f32 v0, v1, v2 :: v_dual_add_f32 v3, v4, v5
  v_dual_fmaak_f32 v0, v1, v2, 0x1234 :: v_dual_mov_b32 v3, v4
  ds_load_b32 v1, v2 offset:16
  ds_store_b64 v1, v[2:3]
  ds_load_2addr_b32 v[1:2], v3 offset0:1 offset1:9
  ds_add_rtn_u32 v1, v2, v3
  ds_bpermute_b32 v1, v2, v3
  ds_swizzle_b32 v1, v2 offset:swizzle(BITMASK_PERM,"01pip")
  ds_swizzle_b32 v1, v2 offset:swizzle(SWAP,8)
  ds_swizzle_b32 v1, v2 offset:swizzle(REVERSE,16)
  ds_swizzle_b32 v1, v2 offset:swizzle(BROADCAST,4,1)
  ds_swizzle_b32 v1, v2 offset:swizzle(QUAD_PERM,1,0,3,2)
  ds_swizzle_b32 v1, v2
  global_load_b128 v[1:4], v5, s[0:1] offset:-16
  global_load_b32 v1, v[2:3], off
  global_store_b16 v1, v2, s[0:1] offset:2
  global_load_d16_hi_b16 v1, v2, s[0:1]
  global_atomic_add_u32 v1, v2, v3, s[0:1] glc
  global_atomic_add_f32 v2, v3, s[0:1]
  flat_load_b32 v1, v[2:3] offset:8
  scratch_store_b32 off, v1, off offset:4
  scratch_load_b64 v[1:2], v3, off
  s_barrier
  buffer_gl0_inv
  s_cbranch_execz 2
  s_trap 2
  s_endpgm
"#;
    let Some(elf) = common::assemble_raw(body, "", 0) else { return };
    compare("handwritten", &elf);
}

/// One instance of every opcode llvm-mc-22 knows for gfx1100 (tools/ops.json holds the text
/// llvm-mc printed for each probe encoding), assembled and disassembled by both sides.
#[test]
fn every_opcode() {
    let json = include_str!("../tools/ops.json");
    // minimal parse of {"family": {"op": "text", ...}, ...}: take every quoted value after ':'
    let mut lines: Vec<String> = Vec::new();
    for part in json.split("\": \"").skip(1) {
        let text = part.split('"').next().unwrap_or("");
        if text.contains("/*")
            || text.contains("sendmsg(")
            || text.starts_with("s_call")
            || text.starts_with("s_cbranch_cdbg")
            || text.starts_with("s_subvector")
            || text.starts_with("s_setpc")
            || text.starts_with("s_swappc")
            || text.starts_with("s_rfe")
            || text.starts_with("s_endpgm")
            || text.starts_with("s_branch")
            || text.starts_with("s_cbranch")
            || text.starts_with("s_code_end")
        {
            continue;
        }
        lines.push(text.replace("\\\"", "\""));
    }
    // drop lines llvm-mc rejects in this context, then compare the rest
    let Some(mut ok) = filter_assemblable(&lines) else { return };
    ok.push("s_endpgm".into());
    let body = ok.join("\n  ");
    let Some(elf) = common::assemble_raw(&format!("  {body}"), "", 0) else { return };
    compare("every opcode", &elf);
    assert!(ok.len() > 1000, "only {} opcodes assembled", ok.len());
}

fn filter_assemblable(lines: &[String]) -> Option<Vec<String>> {
    let src = lines.join("\n");
    let out = Command::new("llvm-mc-22")
        .args(["-arch=amdgcn", "-mcpu=gfx1100", "-o", "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = out else {
        eprintln!("*** SKIPPED: llvm-mc-22 not found ***");
        return None;
    };
    use std::io::Write;
    child.stdin.take().unwrap().write_all(src.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let bad: std::collections::HashSet<usize> =
        err.lines().filter_map(|l| l.strip_prefix("<stdin>:")?.split(':').next()?.parse::<usize>().ok()).collect();
    Some(lines.iter().enumerate().filter(|(i, _)| !bad.contains(&(i + 1))).map(|(_, l)| l.clone()).collect())
}
