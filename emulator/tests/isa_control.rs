//! Program control outcomes: s_trap, branch-to-self (Rust `loop {}` panic), instruction budget,
//! unsupported instructions, and launch counters.
mod common;
use common::*;
use emulator::{Device, EmuError};

fn launch(body: &str, budget: Option<u64>) -> Option<Result<emulator::LaunchStats, EmuError>> {
    let elf = assemble_raw(body, "", 0)?;
    let dev = Device::new();
    if let Some(b) = budget { dev.set_instruction_budget(b); }
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
