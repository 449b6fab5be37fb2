//! `strata emu ...` and `strata bench kernels` end to end: the disassembly of every embedded
//! code object equals llvm-objdump-22's, and a kernel run from the command line (buffers from
//! files, scalars inline) gives the `quant` crate's reference result.

use crate::support::strata_cmd as strata;
use std::path::PathBuf;
use std::process::Command;

fn tmp(name: &str) -> PathBuf {
    crate::support::scratch_dir("cli-emu").join(name)
}

/// Each test writes its own copy (tests run in parallel; a shared file could be read half written).
fn write_object(arch: &str, test: &str) -> PathBuf {
    let p = tmp(&format!("{test}-kernels-{arch}.elf"));
    std::fs::write(&p, strata::gpu::code_object_for(arch).expect("embedded code object")).unwrap();
    p
}

#[test]
fn emu_disasm_matches_llvm_objdump_on_every_embedded_object() {
    for arch in ["gfx1100", "gfx1101", "gfx1102"] {
        let elf = write_object(arch, "disasm");
        let objdump = match Command::new("llvm-objdump-22").args(["-d", &format!("--mcpu={arch}")]).arg(&elf).output() {
            Ok(o) => o,
            Err(e) => panic!("llvm-objdump-22 is needed for this test (apt-get install llvm-22): {e}"),
        };
        assert!(
            objdump.status.success(),
            "llvm-objdump-22 failed on {}: {}",
            elf.display(),
            String::from_utf8_lossy(&objdump.stderr)
        );
        let ours = strata().args(["emu", "disasm"]).arg(&elf).output().unwrap();
        assert!(ours.status.success(), "{}", String::from_utf8_lossy(&ours.stderr));
        let (a, b) = (String::from_utf8(ours.stdout).unwrap(), String::from_utf8(objdump.stdout).unwrap());
        let n = b.lines().count();
        assert!(n > 1000, "{arch}: objdump printed only {n} lines");
        for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
            assert_eq!(x, y, "{arch}: line {} differs", i + 1);
        }
        assert_eq!(a.lines().count(), n, "{arch}: line counts differ");
    }
}

#[test]
fn emu_run_dequant_from_files_matches_reference() {
    use quant::GgmlType;
    let elf = write_object("gfx1100", "run");
    // 5 random Q8_0 blocks (deterministic LCG), reference-dequantized by the quant crate.
    let mut s = 0x1234_5678u64;
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let x: Vec<f32> = (0..160).map(|_| (next() % 2001) as f32 / 100.0 - 10.0).collect();
    let mut w = vec![0u8; GgmlType::Q8_0.row_bytes(160).unwrap()];
    quant::quantize_row(GgmlType::Q8_0, &x, &mut w).unwrap();
    let mut want = vec![0f32; 160];
    quant::dequantize_row(GgmlType::Q8_0, &w, &mut want).unwrap();
    let (win, yout) = (tmp("w.bin"), tmp("y.bin"));
    std::fs::write(&win, &w).unwrap();
    let out = strata()
        .args(["emu", "run"])
        .arg(&elf)
        .args(["dequant_q8_0_f32", "--grid", "1", "--block", "256"])
        .arg(format!("--arg=in={}", win.display()))
        .arg(format!("--arg=out={}:640", yout.display()))
        .args(["--arg=u32=5", "--arg=u32=0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stats = String::from_utf8(out.stdout).unwrap();
    assert!(stats.contains("waves") && stats.contains("valu"), "{stats}");
    let got: Vec<f32> =
        std::fs::read(&yout).unwrap().chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(got.len(), 160);
    for (i, (g, r)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.to_bits(), r.to_bits(), "element {i}: {g} vs {r}");
    }
}

#[test]
fn emu_run_rejects_bad_arguments_with_a_clear_message() {
    let elf = write_object("gfx1100", "bad-args");
    let out = strata().args(["emu", "run"]).arg(&elf).args(["dequant_q8_0_f32", "--arg=u32=5"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("takes 4 arguments, 1 given"), "{err}");
    let out = strata().args(["emu", "run"]).arg(&elf).args(["no_such_kernel"]).output().unwrap();
    assert!(!out.status.success());
    let out = strata().args(["emu", "disasm", "/nonexistent.elf"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.elf"));
}

#[test]
fn bench_kernels_reports_every_mmvq_type_and_device_speed() {
    let out = strata().args(["bench", "kernels", "--quick"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for k in ["mmvq_q8_0", "mmvq_q4_k", "mmvq_q6_k", "mmvq_iq3_xxs", "lane-operations/s"] {
        assert!(text.to_lowercase().contains(k), "bench kernels output lacks {k}:\n{text}");
    }
    // MMVQ rows carry the byte-ratio flag for 1, 2, 4 and 8 columns.
    for c in [1, 2, 4, 8] {
        let row = text.lines().find(|l| l.starts_with(&format!("mmvq_q4_k_q8_1_c{c} ")) && !l.contains("rows["));
        let row = row.unwrap_or_else(|| panic!("no q4_k c{c} row:\n{text}"));
        assert!(row.ends_with(" ok") || row.contains("MISS"), "no byte flag: {row}");
    }
    // The cross-lane reduction table: every method, all exact, and the choice.
    for m in [
        "DPP row_xmask + permlanex16",
        "readlane",
        "permlane16 + permlanex16",
        "ds_swizzle",
        "ds_bpermute",
        "chosen: DPP",
    ] {
        assert!(text.contains(m), "reduction table lacks {m}:\n{text}");
    }
    let reduce_rows: Vec<&str> = text.lines().filter(|l| l.contains(" | ") && !l.contains("listing")).collect();
    assert_eq!(reduce_rows.len(), 12, "6 methods x v1/v8:\n{}", reduce_rows.join("\n"));
    assert!(
        reduce_rows.iter().all(|l| l.contains("| yes ")),
        "a reduction variant differs from the CPU butterfly:\n{text}"
    );
}

/// Huge grids and buffers (issue 14 item 6) are errors before anything runs or is allocated,
/// not an aborted allocation (SIGABRT), a `capacity overflow` panic or minutes of work; a grid
/// within the wave limit stops at the launch budget.
#[test]
fn emu_run_bounds_grids_buffers_and_total_work() {
    let elf = write_object("gfx1100", "bounds");
    let w = tmp("bounds-w.bin");
    std::fs::write(&w, vec![0u8; 34 * 5]).unwrap();
    let run = |extra: &[&str], out_arg: &str| {
        let t0 = std::time::Instant::now();
        let o = strata()
            .args(["emu", "run"])
            .arg(&elf)
            .arg("dequant_q8_0_f32")
            .args(extra)
            .arg(format!("--arg=in={}", w.display()))
            .arg(format!("--arg={out_arg}"))
            .args(["--arg=u32=5", "--arg=u32=0"])
            .output()
            .unwrap();
        assert!(t0.elapsed().as_secs() < 30, "{extra:?} {out_arg}: took {:?}", t0.elapsed());
        assert_eq!(o.status.code(), Some(1), "{extra:?} {out_arg}: {o:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let y = tmp("bounds-y.bin");
    let out = format!("out={}:640", y.display());
    let e = run(&["--grid", "4294967295,1,1", "--block", "256"], &out);
    assert!(e.contains("--grid 4294967295,1,1 --block 256,1,1: 34359738360 waves (4294967295 workgroups), more than --max-waves 1048576"), "{e}");
    let e = run(&["--grid", "4294967295,1,1", "--block", "2", "--max-waves", "18446744073709551615"], &out);
    assert!(e.contains("is 8589934590 work-items in dimension 0, more than the 4294967295 a dispatch holds"), "{e}");
    let e = run(&["--grid", "1000000", "--block", "32", "--launch-budget", "100000"], &out);
    assert!(e.contains("the launch ran more than 100000 instructions in all (its launch budget)"), "{e}");
    let e = run(&[], &format!("out={}:68719476736", y.display()));
    assert!(
        e.contains("a buffer of 68719476736 bytes (64.0 GiB) does not fit") && e.contains("of memory available"),
        "{e}"
    );
    let e = run(&[], "zero=18446744073709551615");
    assert!(e.contains("--arg zero=18446744073709551615: a buffer of 18446744073709551615 bytes"), "{e}");
    let e = run(&[], "zero=18446744073709551616");
    assert!(e.contains("'18446744073709551616' is not a byte count"), "{e}");
    assert!(!e.contains("panicked") && !e.contains("capacity overflow"), "{e}");
}
