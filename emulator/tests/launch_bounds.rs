//! Launch-wide bounds (issue 14 item 6): a grid larger than a dispatch packet can describe is
//! refused, and a launch stops at its launch budget (all waves together) with an error naming
//! it, instead of running for as long as the per-wave budget times the number of waves allows.
use emulator::{Device, EmuError};

mod common;

fn args(ptrs: &[u64], tail: &[u32]) -> Vec<u8> {
    let mut v: Vec<u8> = ptrs.iter().flat_map(|p| p.to_le_bytes()).collect();
    for t in tail {
        v.extend_from_slice(&t.to_le_bytes());
    }
    v
}

fn api_error(r: Result<emulator::LaunchStats, EmuError>) -> String {
    match r {
        Err(EmuError::Api(e)) => e,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[test]
fn grid_larger_than_a_dispatch_is_refused() {
    let dev = Device::new();
    let m = dev.load_module(common::fixture::rust_kernels_elf()).unwrap();
    let f = m.function("vadd").unwrap();
    let p = dev.malloc(256).unwrap();
    let ka = args(&[p, p, p], &[0]);
    let e = api_error(dev.launch(&f, [u32::MAX, 1, 1], [64, 1, 1], 0, &ka));
    assert_eq!(
        e,
        "launch vadd: grid [4294967295, 1, 1] x block [64, 1, 1] is 274877906880 work-items in dimension 0, more than the 4294967295 a dispatch holds"
    );
    let e = api_error(dev.launch(&f, [1, 2, u32::MAX], [1, 1, 2], 0, &ka));
    assert!(e.contains("in dimension 2"), "{e}");
}

#[test]
fn launch_budget_stops_a_large_grid() {
    let dev = Device::new();
    let m = dev.load_module(common::fixture::rust_kernels_elf()).unwrap();
    let f = m.function("vadd").unwrap();
    let p = dev.malloc(256).unwrap();
    // n = 0: every work-item is out of range, so each wave runs a handful of instructions;
    // a 2^24-workgroup grid is a long launch made of tiny waves.
    let ka = args(&[p, p, p], &[0]);
    let one = dev.launch(&f, [1, 1, 1], [64, 1, 1], 0, &ka).unwrap();
    assert!(one.instructions > 0);
    dev.set_launch_budget(Some(100 * one.instructions));
    let t0 = std::time::Instant::now();
    let e = api_error(dev.launch(&f, [1 << 24, 1, 1], [64, 1, 1], 0, &ka));
    assert!(
        e.starts_with(&format!(
            "launch vadd: the launch ran more than {} instructions in all (its launch budget), stopped before workgroup ",
            100 * one.instructions
        )) && e.ends_with(" of 16777216"),
        "{e}"
    );
    assert!(t0.elapsed().as_secs() < 10, "stopped after {:?}", t0.elapsed());
    // Within the budget the same launch runs, and its counters are the sum of its workgroups.
    let st = dev.launch(&f, [50, 1, 1], [64, 1, 1], 0, &ka).unwrap();
    assert_eq!(st.instructions, 50 * one.instructions);
    assert_eq!(st.waves, 100);
    dev.set_launch_budget(None);
    dev.launch(&f, [200, 1, 1], [64, 1, 1], 0, &ka).unwrap();
}

#[test]
fn a_runaway_kernel_is_stopped_by_the_launch_budget_too() {
    // Every wave of `spin` exceeds its per-wave budget; each failed wave counts its budget, so
    // the launch stops after a few workgroups, not after all of them.
    let Some(elf) = common::assemble_raw("l:\n  s_nop 0\n  s_branch l\n  s_endpgm\n", "", 0) else { return };
    let dev = Device::new();
    let m = dev.load_module(&elf).unwrap();
    let f = m.function("k").unwrap();
    let p = dev.malloc(256).unwrap();
    dev.set_instruction_budget(10_000);
    dev.set_launch_budget(Some(100_000));
    let t0 = std::time::Instant::now();
    let r = dev.launch(&f, [1 << 20, 1, 1], [32, 1, 1], 0, &args(&[p, p], &[]));
    match r {
        Err(EmuError::Budget { budget: 10_000, .. }) => {}
        Err(EmuError::Api(e)) if e.contains("launch budget") => {}
        other => panic!("{other:?}"),
    }
    assert!(t0.elapsed().as_secs() < 10, "stopped after {:?}", t0.elapsed());
}
