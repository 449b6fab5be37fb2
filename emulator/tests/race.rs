//! Race mode (`LaunchOptions::race_seed`, `STRATA_EMU_RACE_SEED`): the waves of a workgroup
//! run in a seeded random interleaving and accesses to one LDS or global byte from two waves
//! with no `s_barrier` between them (one a write) fail the launch with `EmuError::DataRace`.
//! A racy kernel is caught under every seed, the same kernel with a barrier passes, seeds give
//! different interleavings (visible through atomics) and race-free kernels give the same results
//! under every seed as in the normal mode.
mod common;
use common::*;
use emulator::{Device, EmuError, RaceAccess};

const SEEDS: [u64; 5] = [1, 2, 3, 0xdead_beef, u64::MAX];

/// 64 work-items = 2 waves. Wave 0 stores `100 + tid` to LDS[lane]; then (`sync`) wave 1
/// loads LDS[lane] into out[tid]. out[0..32] stays 0.
fn writer_reader(sync: &str, global: bool) -> String {
    let (store, load) = if global {
        // through out[64 + lane] in global memory instead of LDS
        (
            "global_store_b32 v7, v9, s[0:1] offset:256",
            "global_load_b32 v5, v7, s[0:1] offset:256\n  s_waitcnt vmcnt(0)",
        )
    } else {
        ("ds_store_b32 v7, v9", "ds_load_b32 v5, v7\n  s_waitcnt lgkmcnt(0)")
    };
    format!(
        "
  s_load_b64 s[0:1], s[0:1], 0x0
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v5, 0
  v_and_b32 v8, 31, v0
  v_lshlrev_b32 v7, 2, v8
  v_add_nc_u32 v9, 100, v0
  v_cmp_gt_u32 vcc_lo, 32, v0
  s_and_saveexec_b32 s4, vcc_lo
  {store}
  s_waitcnt vmcnt(0) lgkmcnt(0)
  s_or_b32 exec_lo, exec_lo, s4
  {sync}
  v_cmp_le_u32 vcc_lo, 32, v0
  s_and_saveexec_b32 s4, vcc_lo
  {load}
  s_or_b32 exec_lo, exec_lo, s4
  v_lshlrev_b32 v10, 2, v0
  global_store_b32 v10, v5, s[0:1]
  s_endpgm"
    )
}

/// Launch kernel `k` of `elf` once with `threads` work-items, out = 128 words; race seed `seed`.
fn launch(elf: &[u8], threads: u32, seed: Option<u64>) -> Result<Vec<u32>, EmuError> {
    let dev = Device::new();
    dev.set_race_seed(seed);
    let m = dev.load_module(elf)?;
    let f = m.function("k")?;
    let out = dev.malloc(128 * 4)?;
    let mut ka = out.to_le_bytes().to_vec();
    ka.extend_from_slice(&out.to_le_bytes());
    dev.launch(&f, [1, 1, 1], [threads, 1, 1], 0, &ka)?;
    let mut b = vec![0u8; 128 * 4];
    dev.memcpy_dtoh(&mut b, out)?;
    Ok(b.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect())
}

/// Code-object address of the first instruction whose text starts with `mnemonic`.
fn pc_of(elf: &[u8], mnemonic: &str) -> u64 {
    let dis = emulator::disassemble(elf).unwrap();
    let line = dis
        .lines()
        .find(|l| l.trim_start().starts_with(mnemonic))
        .unwrap_or_else(|| panic!("{mnemonic} not in\n{dis}"));
    let addr = line.split("// ").nth(1).and_then(|r| r.split(':').next()).unwrap();
    u64::from_str_radix(addr.trim(), 16).unwrap()
}

fn expect_race(e: &EmuError) -> (&str, u64, &RaceAccess, &RaceAccess) {
    match e {
        EmuError::DataRace(r) => {
            assert_eq!(r.kernel, "k");
            assert_eq!(r.workgroup, [0, 0, 0]);
            (r.space, r.addr, &r.first, &r.second)
        }
        other => panic!("expected a data race, got: {other}"),
    }
}

#[test]
fn lds_write_then_read_without_barrier_is_a_race() {
    let Some(elf) = assemble_raw(&writer_reader("s_nop 0", false), "", 512) else { return };
    let (st, ld) = (pc_of(&elf, "ds_store_b32"), pc_of(&elf, "ds_load_b32"));
    // The normal scheduler runs wave 0 to its end first: the results look right, the race is
    // invisible without race mode.
    let out = launch(&elf, 64, None).unwrap();
    assert!((0..32).all(|l| out[32 + l] == 100 + l as u32), "{out:?}");
    for seed in SEEDS {
        let e = launch(&elf, 64, Some(seed)).expect_err("a race must be reported");
        let (space, addr, first, second) = expect_race(&e);
        assert_eq!(space, "LDS", "{e}");
        assert!(addr < 128, "{e}");
        // whichever wave came first, the report names both sides: wave 0's store, wave 1's load
        let (w, r) = if first.kind == "write" { (first, second) } else { (second, first) };
        assert_eq!((w.wave, w.kind, w.pc), (0, "write", st), "{e}");
        assert_eq!((r.wave, r.kind, r.pc), (1, "read", ld), "{e}");
        assert_eq!(w.lane, r.lane, "{e}");
        assert_eq!(addr, 4 * w.lane as u64, "{e}");
        assert!(w.inst.starts_with("ds_store_b32") && r.inst.starts_with("ds_load_b32"), "{e}");
        let text = e.to_string();
        for part in [
            "kernel k",
            "data race on LDS",
            &format!("{st:#x}"),
            &format!("{ld:#x}"),
            "wave 0",
            "wave 1",
            "no s_barrier",
        ] {
            assert!(text.contains(part), "{part:?} missing from: {text}");
        }
        assert!(text.contains(&format!("race seed {seed}")), "{text}");
    }
}

#[test]
fn global_write_then_read_without_barrier_is_a_race() {
    let Some(elf) = assemble_raw(&writer_reader("s_nop 0", true), "", 0) else { return };
    let (st, ld) = (pc_of(&elf, "global_store_b32"), pc_of(&elf, "global_load_b32"));
    for seed in SEEDS {
        let e = launch(&elf, 64, Some(seed)).expect_err("a race must be reported");
        let (space, _, first, second) = expect_race(&e);
        assert_eq!(space, "global", "{e}");
        let mut pcs = [first.pc, second.pc];
        pcs.sort();
        assert_eq!(pcs, [st, ld], "{e}");
        assert_ne!(first.wave, second.wave, "{e}");
    }
}

#[test]
fn the_same_kernel_with_a_barrier_passes_under_every_seed() {
    for global in [false, true] {
        let Some(elf) = assemble_raw(&writer_reader("s_barrier", global), "", 512) else { return };
        let want = launch(&elf, 64, None).unwrap();
        assert!((0..32).all(|l| want[32 + l] == 100 + l as u32 && want[l] == 0), "{want:?}");
        for seed in SEEDS {
            let got = launch(&elf, 64, Some(seed)).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            assert_eq!(got, want, "seed {seed} global={global}");
        }
    }
}

#[test]
fn lanes_of_one_wave_and_atomics_are_not_races() {
    // All 32 lanes of each wave store to LDS[0] (one wave: no race between waves), then every
    // lane of both waves adds to one LDS counter (atomics do not race with atomics), after a
    // barrier wave 1 reads what wave 0 wrote.
    let body = "
  s_load_b64 s[0:1], s[0:1], 0x0
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v7, 0
  v_mov_b32 v6, 1
  v_lshrrev_b32 v8, 5, v0
  v_lshlrev_b32 v8, 2, v8
  ds_store_b32 v8, v0 offset:16
  ds_add_u32 v7, v6
  s_waitcnt lgkmcnt(0)
  s_barrier
  ds_load_b32 v5, v7
  s_waitcnt lgkmcnt(0)
  v_lshlrev_b32 v10, 2, v0
  global_store_b32 v10, v5, s[0:1]
  s_endpgm";
    let Some(elf) = assemble_raw(body, "", 64) else { return };
    for seed in SEEDS {
        let out = launch(&elf, 64, Some(seed)).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(out[..64].iter().all(|&x| x == 64), "seed {seed}: {out:?}");
    }
    // An atomic and a plain read of the same word in one epoch do race.
    let body = body.replace("  s_barrier\n", "");
    let Some(elf) = assemble_raw(&body, "", 64) else { return };
    let e = launch(&elf, 64, Some(7)).expect_err("atomic vs read");
    let (space, addr, first, second) = expect_race(&e);
    assert_eq!((space, addr), ("LDS", 0), "{e}");
    let mut kinds = [first.kind, second.kind];
    kinds.sort();
    assert_eq!(kinds, ["atomic", "read"], "{e}");
}

/// 8 waves each take one ticket from an LDS counter: the tickets show the order in which the
/// waves got there, i.e. the interleaving (atomics are not races, so this kernel is race-free).
#[test]
fn seeds_give_different_interleavings_and_the_same_seed_the_same() {
    let body = "
  s_load_b64 s[0:1], s[0:1], 0x0
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v7, 0
  v_mov_b32 v6, 1
  v_add_nc_u32 v1, v0, v0
  v_add_nc_u32 v1, v1, v0
  v_add_nc_u32 v1, v1, v0
  v_add_nc_u32 v1, v1, v0
  v_add_nc_u32 v1, v1, v0
  ds_add_rtn_u32 v5, v7, v6
  s_waitcnt lgkmcnt(0)
  v_lshlrev_b32 v10, 2, v0
  global_store_b32 v10, v5, s[0:1]
  s_endpgm";
    let Some(elf) = assemble_raw(body, "", 64) else { return };
    // wave order from the tickets of each wave's lane 0
    let order = |out: &[u32]| -> Vec<u32> { (0..8).map(|w| out[w * 32] / 32).collect() };
    let dev_out = |seed: Option<u64>| {
        let dev = Device::new();
        dev.set_race_seed(seed);
        let m = dev.load_module(&elf).unwrap();
        let f = m.function("k").unwrap();
        let out = dev.malloc(256 * 4).unwrap();
        let mut ka = out.to_le_bytes().to_vec();
        ka.extend_from_slice(&out.to_le_bytes());
        dev.launch(&f, [1, 1, 1], [256, 1, 1], 0, &ka).unwrap_or_else(|e| panic!("{e}"));
        let mut b = vec![0u8; 256 * 4];
        dev.memcpy_dtoh(&mut b, out).unwrap();
        b.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<u32>>()
    };
    assert_eq!(order(&dev_out(None)), (0..8).collect::<Vec<u32>>(), "the normal scheduler runs the waves in order");
    let mut orders = std::collections::BTreeSet::new();
    for seed in SEEDS {
        let a = dev_out(Some(seed));
        assert_eq!(a, dev_out(Some(seed)), "seed {seed} is not reproducible");
        let mut o = order(&a);
        orders.insert(o.clone());
        o.sort();
        assert_eq!(o, (0..8).collect::<Vec<u32>>(), "every wave took one ticket");
    }
    assert!(orders.len() >= 3, "5 seeds gave only {} interleavings: {orders:?}", orders.len());
}

/// Race-free Rust kernels of the fixture (LDS reverse through barriers, 4 waves per workgroup,
/// 2 workgroups) give the normal mode's results under every seed.
#[test]
fn race_free_rust_kernels_agree_under_every_seed() {
    let elf = common::fixture::rust_kernels_elf();
    let a: Vec<u8> = (0..512).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let run = |k: &str, seed: Option<u64>| -> Result<Vec<u8>, EmuError> {
        let dev = Device::new();
        dev.set_race_seed(seed);
        let m = dev.load_module(elf)?;
        let f = m.function(k)?;
        let pa = dev.malloc(512 * 4)?;
        dev.memcpy_htod(pa, &a)?;
        let po = dev.malloc(512 * 4)?;
        let mut ka = pa.to_le_bytes().to_vec();
        ka.extend_from_slice(&po.to_le_bytes());
        dev.launch(&f, [2, 1, 1], [256, 1, 1], if k == "lds_dyn_shim" { 1024 } else { 0 }, &ka)?;
        let mut out = vec![0u8; 512 * 4];
        dev.memcpy_dtoh(&mut out, po)?;
        Ok(out)
    };
    for k in ["lds_static_shim", "lds_dyn_shim", "bar_plain", "bar_lgkm", "bar_sysfence"] {
        let want = run(k, None).unwrap();
        for seed in SEEDS {
            assert_eq!(run(k, Some(seed)).unwrap_or_else(|e| panic!("{k} seed {seed}: {e}")), want, "{k} seed {seed}");
        }
    }
}

/// `STRATA_EMU_RACE_SEED` turns race mode on for devices created afterwards; a malformed value
/// fails every launch (it would otherwise run without the checks that were asked for). Checked
/// in a child process, so the variable never reaches the other tests of this binary.
#[test]
fn environment_variable() {
    if std::env::var("RACE_TEST_CHILD").is_ok() {
        return;
    }
    for (value, want) in
        [("7", "race seed Some(7)"), ("0x10", "race seed Some(16)"), ("", "race seed None"), ("seven", "launch error")]
    {
        let o = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "environment_variable_child", "--nocapture"])
            .env(emulator::RACE_SEED_ENV, value)
            .env("RACE_TEST_CHILD", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success() && text.contains(want),
            "{}={value:?}: expected {want:?} in:\n{text}",
            emulator::RACE_SEED_ENV
        );
    }
}

#[test]
#[ignore = "run by `environment_variable` in a child process"]
fn environment_variable_child() {
    let dev = Device::new();
    println!("race seed {:?}", dev.options().race_seed);
    let Some(elf) = assemble_raw("  s_endpgm", "", 0) else { return };
    let m = dev.load_module(&elf).unwrap();
    let f = m.function("k").unwrap();
    if let Err(e) = dev.launch(&f, [1, 1, 1], [32, 1, 1], 0, &[0u8; 16]) {
        assert!(e.to_string().contains(emulator::RACE_SEED_ENV), "{e}");
        println!("launch error: {e}");
    }
}
