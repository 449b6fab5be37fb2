//! Program control outcomes: s_trap, branch-to-self (Rust `loop {}` panic), instruction budget,
//! unsupported instructions, and launch counters.
mod common;
use common::*;
use emulator::{Device, EmuError};

fn launch(body: &str, budget: Option<u64>) -> Option<Result<emulator::LaunchStats, EmuError>> {
    let elf = assemble_raw(body, "", 0)?;
    let dev = Device::new();
    if let Some(b) = budget {
        dev.set_instruction_budget(b);
    }
    let m = dev.load_module(&elf).unwrap();
    let f = m.function("k").unwrap();
    let buf = dev.malloc(1024).unwrap();
    let mut ka = buf.to_le_bytes().to_vec();
    ka.extend_from_slice(&buf.to_le_bytes());
    Some(dev.launch(&f, [2, 1, 1], [64, 1, 1], 0, &ka))
}

#[test]
fn trap_loop_budget() {
    let Some(r) = launch("s_nop 0\n s_trap 2\n s_endpgm", None) else { return };
    let e = r.unwrap_err();
    assert!(matches!(e, EmuError::Trap { ref kernel, code: 2, .. } if kernel == "k"), "{e}");
    assert!(e.to_string().contains("kernel k trapped"));
    let Some(r) = launch("s_mov_b32 vcc_lo, exec_lo\nL:\n s_cbranch_vccnz L\n s_endpgm", None) else { return };
    assert!(r.unwrap_err().to_string().contains("kernel k panicked (loop)"));
    let Some(r) = launch("L:\n s_add_u32 s4, s4, 1\n s_branch L\n s_endpgm", Some(10_000)) else { return };
    assert!(matches!(r.unwrap_err(), EmuError::Budget { .. }));
}

#[test]
fn counters() {
    let Some(r) = launch(&format!("{PROLOGUE} v_add_nc_u32 v5, v2, v3{EPILOGUE}"), None) else { return };
    let st = r.unwrap();
    assert_eq!(st.waves, 4);
    // 3 vector loads per lane + one 16-byte s_load per wave
    assert_eq!(st.global_bytes_read, 4 * 64 * 2 * 3 + 16 * 4);
    assert_eq!(st.global_bytes_written, 4 * 64 * 2);
    assert_eq!(st.by_family["smem"], 4);
    assert_eq!(st.by_family["global"], 4 * 4);
    assert_eq!(st.lane_ops, 2 * 64 * 2);
    assert_eq!(st.instructions, st.by_family.values().sum::<u64>());
}

#[test]
fn pinned_alloc_knob() {
    let dev = Device::new();
    assert!(dev.host_malloc_pinned(1 << 20).is_ok());
    dev.set_fail_large_pinned_alloc(Some(4096));
    assert!(dev.host_malloc_pinned(4096).is_ok());
    assert!(matches!(dev.host_malloc_pinned(4097), Err(EmuError::Alloc { .. })));
    dev.set_fail_large_pinned_alloc(None);
    assert!(dev.host_malloc_pinned(1 << 20).is_ok());
}

#[test]
fn speed() {
    let r = emulator::bench_lane_ops_per_sec();
    eprintln!("VALU lane-ops/s on one core: {:.1} M", r / 1e6);
    assert!(r > 5e6, "{r}");
}

#[test]
fn device_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Device>();
    check::<emulator::Module>();
    check::<emulator::Function>();
}

#[test]
fn hidden_kernel_arguments_are_filled() {
    let args = "      - { .offset: 0, .size: 8, .value_kind: global_buffer, .address_space: global }
      - { .offset: 8, .size: 8, .value_kind: global_buffer, .address_space: global }
      - { .offset: 16, .size: 4, .value_kind: hidden_block_count_x }
      - { .offset: 20, .size: 4, .value_kind: hidden_block_count_y }
      - { .offset: 28, .size: 2, .value_kind: hidden_group_size_x }";
    // out[0] = block_count_x, out[1] = block_count_y, out[2] = group_size_x
    let body = "  s_load_b64 s[4:5], s[0:1], 0x0\n  s_load_b64 s[6:7], s[0:1], 0x10\n  s_load_b32 s8, s[0:1], 0x1c\n  s_waitcnt lgkmcnt(0)\n  s_and_b32 s8, s8, 0xffff\n  v_mov_b32 v1, 0\n  v_mov_b32 v2, s6\n  v_mov_b32 v3, s7\n  v_mov_b32 v4, s8\n  global_store_b96 v1, v[2:4], s[4:5]\n  s_endpgm";
    let Some(elf) = assemble_with_args(body, "  .amdhsa_kernarg_size 32", 0, args, 32) else { return };
    let dev = Device::new();
    let m = dev.load_module(&elf).unwrap();
    let f = m.function("k").unwrap();
    let out = dev.malloc(12).unwrap();
    let mut ka = out.to_le_bytes().to_vec();
    ka.extend_from_slice(&out.to_le_bytes());
    dev.launch(&f, [5, 3, 1], [64, 1, 1], 0, &ka).unwrap();
    let mut b = [0u8; 12];
    dev.memcpy_dtoh(&mut b, out).unwrap();
    let w: Vec<u32> = b.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(w, vec![5, 3, 64]);
}

#[test]
fn computed_jump_reaches_undecoded_code() {
    // s_setpc to getpc+16 skips the s_trap; the target is only reachable through the jump
    let body = format!(
        "{PROLOGUE}  s_getpc_b64 s[4:5]\n  s_add_u32 s4, s4, 16\n  s_addc_u32 s5, s5, 0\n  s_setpc_b64 s[4:5]\n  s_trap 2\n  v_mov_b32 v5, 42{EPILOGUE}"
    );
    let Some(elf) = assemble_raw(&body, "", 0) else { return };
    let (out, _) = run_elf(&elf, &[], 32, 32, 0).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.iter().all(|&x| x == 42));
}

/// Encodings the device does not execute (MUBUF, MTBUF, MIMG, EXP, VINTERP, LDSDIR) load and
/// disassemble; a wave that reaches one is refused with an error naming the instruction (its
/// mnemonic, the kernel and the address llvm-objdump-22 lists it at), never a panic or a guess.
/// A kernel that only has one behind a branch it does not take runs.
#[test]
fn unimplemented_instructions_are_refused_at_execution_by_name() {
    let cases = [
        "buffer_load_b32 v1, v0, s[0:3], 0 offen",
        "buffer_store_b32 v1, v0, s[0:3], 0 offen",
        "buffer_atomic_add_u32 v1, v0, s[0:3], 0 offen glc",
        "tbuffer_load_format_x v1, v0, s[0:3], 0 offen",
        "image_load v1, v0, s[0:7] dmask:0x1 dim:SQ_RSRC_IMG_1D",
        "image_sample v[0:3], v[4:5], s[0:7], s[8:11] dmask:0xf dim:SQ_RSRC_IMG_2D",
        "exp mrt0 v0, v0, v0, v0 done",
        "v_interp_p10_f32 v0, v1, v2, v3",
        "lds_param_load v1, attr0.x",
        "v_dot2_f32_f16 v0, v1, v2, v3 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf",
        "v_fma_mix_f32 v0, v1, v2, v3 dpp8:[7,6,5,4,3,2,1,0]",
        "ds_add_u32 v1, v2 gds",
        "ds_gws_init v1 gds",
    ];
    for line in cases {
        let mnemonic = line.split(' ').next().unwrap();
        // not reached: s_cbranch_scc1 jumps over it
        let body = format!("  s_cmp_eq_u32 s0, s0\n  s_cbranch_scc1 .Lskip\n  {line}\n.Lskip:\n  s_endpgm");
        let Some(elf) = assemble_raw(&body, "", 0) else { return };
        run_elf(&elf, &[], 32, 32, 0).unwrap_or_else(|e| panic!("`{line}` behind an untaken branch: {e}"));
        let dis = emulator::disassemble(&elf).unwrap_or_else(|e| panic!("`{line}`: {e}"));
        assert!(dis.lines().any(|l| l.trim_start().starts_with(mnemonic)), "`{line}` not listed:\n{dis}");

        // reached
        let body = format!("  s_nop 0\n  {line}\n  s_endpgm");
        let elf = assemble_raw(&body, "", 0).unwrap();
        let e = run_elf(&elf, &[], 32, 32, 0).err().unwrap_or_else(|| panic!("`{line}` executed"));
        let EmuError::Unsupported { kernel, what, .. } = &e else { panic!("`{line}`: {e}") };
        assert_eq!(kernel, "k");
        assert!(what.starts_with(mnemonic) && what.contains("not implemented"), "`{line}`: {e}");
        // the error's text is the instruction as llvm-objdump-22 (the oracle) lists it
        let path = std::env::temp_dir().join(format!("emu-unimpl-{}-{mnemonic}.elf", std::process::id()));
        std::fs::write(&path, &elf).unwrap();
        if let Ok(o) = std::process::Command::new("llvm-objdump-22").args(["-d", "--mcpu=gfx1100"]).arg(&path).output()
        {
            let dump = String::from_utf8_lossy(&o.stdout);
            let l = dump
                .lines()
                .find(|l| l.trim_start().starts_with(mnemonic))
                .unwrap_or_else(|| panic!("{mnemonic} not in\n{dump}"));
            let listed = l.split("//").next().unwrap().trim();
            assert!(what.starts_with(listed), "`{what}` vs objdump `{listed}`");
        }
        let _ = std::fs::remove_file(&path);
    }
}
