//! `--expert-cache auto` and the software device's VRAM size (`--emu-vram-mib`): the device
//! refuses allocations past its size as a card does and reports its free memory; `auto` gives
//! each MoE layer the slots that fit beside the other weights, one session and
//! `--vram-reserve-mib`, and every expert resident when all fit. Checked on the public
//! tiny-qwen4exp fixture (where `auto` is the default on a GPU) and the tiny qwen3moe model:
//! the slot count is the largest that fits, a session then leaves the reserve free, the output
//! is the CPU's; a device too small for the weights or the session is a clear error.

use std::process::Command;

use crate::models::models_qwen4exp::{compare, load_refs, model, ref_dir};
use crate::models::models_util::reference;
use strata::gpu::device::{EmuApi, GpuApi, GpuError};
use strata::gpu::model::{ExpertCacheSize, GpuOptions};
use strata::gpu::qwen4exp::GpuQwen4Exp;
use strata::model::Logits;
use strata::model::qwen4exp::KvType;

const F32: &str = "tiny-qwen4exp-public-f32.gguf";
const MIB: u64 = 1 << 20;

#[test]
fn emu_vram_size_is_enforced_and_reported() {
    let api = EmuApi::new().unwrap().with_vram(MIB);
    assert_eq!(api.info().vram_bytes, MIB);
    let m = api.mem_info().unwrap();
    assert_eq!((m.free, m.total), (MIB, MIB));
    let a = api.malloc(768 << 10).unwrap();
    assert_eq!(api.mem_info().unwrap().free, MIB - (768 << 10));
    match api.malloc(512 << 10) {
        Err(GpuError::OutOfMemory { bytes, free, total }) => {
            assert_eq!((bytes, free, total), (512 << 10, 256 << 10, MIB))
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
    // Host buffers are not VRAM.
    let h = api.host_alloc(512 << 10, Default::default()).unwrap();
    api.free(a).unwrap();
    assert_eq!(api.mem_info().unwrap().free, MIB);
    api.host_free(h).unwrap();
    assert_eq!(EmuApi::new().unwrap().mem_info().unwrap().total, 24 << 30, "24 GiB by default, like an RX 7900 XTX");
}

fn flash(vram: u64, reserve_mib: u64) -> strata::error::Result<GpuQwen4Exp> {
    let api = std::sync::Arc::new(EmuApi::new().unwrap().with_vram(vram));
    let opts = GpuOptions {
        expert_cache: Some(ExpertCacheSize::Auto),
        vram_reserve_mib: reserve_mib,
        ..GpuOptions::default()
    };
    GpuQwen4Exp::new(model(F32), api, opts)
}

/// For device sizes from "the weights and a session only" to "everything", `auto` picks the
/// largest slot count that leaves the reserve free, a session fits beside it, and the logits
/// stay within the all-resident run's tolerance of llama.cpp's (tests/gpu/gpu_qwen4exp.rs).
#[test]
fn qwen4exp_auto_takes_the_largest_slot_count_that_fits() {
    let refs = load_refs("f32");
    let s = &refs[0];
    let (ctx, reserve) = (64usize, 1u64);
    let mut seen = Vec::new();
    // The weights besides the experts (with the 4-slot staging ring) and a 64-position session
    // take about 13 MiB, a slot 1.5 MiB across the 4 layers.
    for vram_mib in [15u64, 17, 20, 28] {
        let mut g = flash(vram_mib * MIB, reserve).unwrap_or_else(|e| panic!("{vram_mib} MiB: {e}"));
        let fit = g.fit_expert_cache(KvType::F16, ctx).unwrap_or_else(|e| panic!("{vram_mib} MiB: {e}"));
        let room = fit.free.saturating_sub(reserve * MIB);
        if fit.all_resident() {
            assert!(room >= 8 * fit.slot_bytes && g.expert_cache_stats().is_none(), "{vram_mib} MiB: {fit}");
        } else {
            assert!(
                room >= fit.slots as u64 * fit.slot_bytes && room < (fit.slots as u64 + 1) * fit.slot_bytes,
                "{vram_mib} MiB: {fit}"
            );
            assert_eq!(g.expert_cache_stats().unwrap().slots, fit.slots);
        }
        let mut sess = g.new_session(KvType::F16, ctx).unwrap_or_else(|e| panic!("{vram_mib} MiB, session: {e}"));
        let free = g.api().mem_info().unwrap().free;
        assert!(
            fit.slots == 0 || free >= reserve * MIB,
            "{vram_mib} MiB: {free} bytes free with a session, reserve {reserve} MiB"
        );
        let mut got = Vec::new();
        g.eval(&mut sess, &s.tokens, Logits::All, &mut got).unwrap();
        let c = compare(&got, &s.logits.1, g.n_vocab());
        assert!(c.max_abs <= 1e-3, "{vram_mib} MiB ({fit}): {c:?}");
        eprintln!("{vram_mib} MiB: {fit}");
        seen.push(fit.slots);
    }
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "more VRAM, no fewer slots: {seen:?}");
    assert!(
        seen.first() < Some(&8) && seen.last() == Some(&8),
        "the sizes span a partial cache and all resident: {seen:?}"
    );
    assert!(seen.iter().any(|&n| n > 0 && n < 8), "some size gives a partial cache: {seen:?}");
}

#[test]
fn qwen4exp_auto_too_small_a_device_is_an_error_not_a_panic() {
    let e = flash(4 * MIB, 0).err().expect("4 MiB cannot hold the weights");
    assert!(e.to_string().contains("the weights do not fit") && e.to_string().contains("--device cpu"), "{e}");
    let mut g = flash(14 * MIB, 0).expect("14 MiB holds the weights besides the experts");
    let e = g.fit_expert_cache(KvType::F16, 4096).expect_err("4096 positions do not fit beside them");
    assert!(e.to_string().contains("a session of 4096 positions") && e.to_string().contains("--max-context"), "{e}");
}

/// A load or a session that runs out of device memory half-way frees what it had allocated
/// (the device reports its whole size free again), for both executors: a server that retries
/// with a smaller context, or the next model, finds the card as it was.
#[test]
fn failed_uploads_leave_the_device_as_they_found_it() {
    let free = |api: &dyn GpuApi| api.mem_info().unwrap().free;
    // Flash-Next: the weights do not fit 4 MiB (the uploader had placed some before failing).
    let api = std::sync::Arc::new(EmuApi::new().unwrap().with_vram(4 * MIB));
    let opts = GpuOptions { expert_cache: Some(ExpertCacheSize::Auto), ..GpuOptions::default() };
    assert!(GpuQwen4Exp::new(model(F32), api.clone(), opts).is_err());
    assert_eq!(free(&*api), 4 * MIB, "a failed Flash-Next load leaked device memory");
    // A session too long for the room beside the weights.
    let g = flash(14 * MIB, 0).expect("14 MiB holds the weights");
    let before = free(&**g.api());
    assert!(g.new_session(KvType::F16, 1 << 16).is_err());
    assert_eq!(free(&**g.api()), before, "a failed Flash-Next session leaked device memory");
    // The shared decoder (qwen3moe) the same way.
    let moe = || strata::model::Decoder::load(&reference("tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf")).unwrap();
    let api = std::sync::Arc::new(EmuApi::new().unwrap().with_vram(MIB));
    assert!(strata::gpu::model::GpuModel::new(moe(), api.clone(), GpuOptions::default()).is_err());
    assert_eq!(free(&*api), MIB, "a failed decoder load leaked device memory");
    // A device with 256 KiB beside the weights: the first context that does not fit (doubling
    // from 8 positions) fails after its first allocations succeeded.
    let api = std::sync::Arc::new(EmuApi::new().unwrap().with_vram(64 * MIB));
    let used = 64 * MIB
        - free(
            &*strata::gpu::model::GpuModel::new(moe(), api.clone(), GpuOptions::default())
                .expect("64 MiB holds the tiny model")
                .api()
                .clone(),
        );
    let api = std::sync::Arc::new(EmuApi::new().unwrap().with_vram(used + (256 << 10)));
    let g = strata::gpu::model::GpuModel::new(moe(), api.clone(), GpuOptions::default()).expect("room for the weights");
    let before = free(&*api);
    let mut ctx = 8;
    while let Ok(s) = g.new_session(KvType::F16, ctx, 8) {
        drop(s);
        assert_eq!(free(&*api), before, "a dropped session gives its memory back");
        ctx *= 2;
    }
    assert_eq!(free(&*api), before, "a failed decoder session ({ctx} positions) leaked device memory");
}

fn strata(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().unwrap()
}

/// On a GPU, Flash-Next sizes its expert cache by itself: on a 20 MiB software device `generate`
/// (its session with 64-token prompt chunks) says how many experts per layer stay in VRAM and
/// prints the CPU's text; the tiny qwen3moe
/// model with `--expert-cache auto` on a 2 MiB device in the ordered mode too; a device too
/// small is an error naming the fix.
#[test]
fn cli_expert_cache_auto_sizes_itself_and_prints_the_cpu_text() {
    let q4 = ref_dir().join(F32);
    let moe = reference("tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf");
    for (m, vram, extra, want) in [
        (&q4, "20", &["--max-context", "64"][..], "expert cache auto: 2 of 8 experts per layer in VRAM"),
        (
            &moe,
            "2",
            &["--max-context", "64", "--expert-cache", "auto", "--ordered"][..],
            "expert cache auto: 2 of 8 experts per layer in VRAM",
        ),
    ] {
        let base = [
            "generate",
            "-m",
            m.to_str().unwrap(),
            "--tokens",
            "5,42,79,116,153",
            "-n",
            "6",
            "--temp",
            "0",
            "--show-ids",
        ];
        let cpu = strata(&[&base[..], extra, &["--device", "cpu"]].concat());
        assert!(cpu.status.success(), "{}", String::from_utf8_lossy(&cpu.stderr));
        let emu = strata(
            &[&base[..], extra, &["--device", "emu", "--emu-vram-mib", vram, "--vram-reserve-mib", "0"]].concat(),
        );
        let err = String::from_utf8_lossy(&emu.stderr);
        assert!(emu.status.success(), "{err}");
        assert!(err.contains(want) && err.contains("lookups"), "{err}");
        assert_eq!(emu.stdout, cpu.stdout, "{err}");
        let ids = |o: &std::process::Output| {
            String::from_utf8_lossy(&o.stderr).lines().find(|l| l.starts_with("ids: ")).map(str::to_owned)
        };
        assert_eq!(ids(&emu), ids(&cpu));
    }
    let small = strata(&[
        "generate",
        "-m",
        q4.to_str().unwrap(),
        "-p",
        "x",
        "-n",
        "1",
        "--device",
        "emu",
        "--emu-vram-mib",
        "4",
    ]);
    let err = String::from_utf8_lossy(&small.stderr);
    assert!(!small.status.success() && err.contains("the weights do not fit") && !err.contains("panicked"), "{err}");
    let bad = strata(&["generate", "-m", q4.to_str().unwrap(), "-p", "x", "-n", "1", "--expert-cache", "some"]);
    assert!(
        !bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("a number of slots or auto"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// Without any flag, on a device with room for everything, Flash-Next keeps every expert
/// resident and says nothing about a cache.
#[test]
fn qwen4exp_default_on_a_roomy_device_keeps_every_expert_resident() {
    let q4 = ref_dir().join(F32);
    let out = strata(&[
        "generate",
        "-m",
        q4.to_str().unwrap(),
        "--tokens",
        "5,42,79",
        "-n",
        "2",
        "--temp",
        "0",
        "--device",
        "emu",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("expert cache"), "{err}");
}
