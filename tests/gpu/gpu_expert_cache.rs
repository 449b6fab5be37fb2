//! The GPU expert cache (`--expert-cache N`, gpu-executor/src/experts/cache.rs) on the software device, on
//! the synthetic MoE model llama.cpp's references were recorded on (tiny-qwen3moe: 2 layers, 8
//! experts, top 2): with 0 slots (every expert on the CPU), 3 slots (admitted on first use, the
//! rest on the CPU) and every expert resident, the ordered-numerics mode gives logits bit for bit
//! equal to the CPU backend's ordered mode; the fast mode's greedy tokens equal the CPU's; the
//! counters add up; `strata generate` prints them; experts of a type the device cannot run as
//! stored are refused by name.

use std::process::Command;

use strata::cpu::prelude::*;
use strata::gpu::model::{ExpertCacheSize, GpuModel, GpuOptions};
use strata::gpu::test_device::TestDevice;
use strata::kv_cache::KvType;
use strata::model::{Decoder, Logits};
use strata::test_device;

use crate::models::models_util::reference;

const Q8: &str = "tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf";
const F32: &str = "tiny-qwen3moe/tiny-qwen3moe-v1024-f32.gguf";

fn prompt() -> Vec<u32> {
    (0..13).map(|i| (i * 37 + 5) % 1024).collect()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
}

fn gpu(path: &std::path::Path, ordered: bool, slots: Option<u32>, device: &TestDevice) -> GpuModel {
    let api = device.1.clone();
    let opts = GpuOptions { ordered, expert_cache: slots.map(ExpertCacheSize::Slots), ..GpuOptions::default() };
    GpuModel::new(Decoder::load(path).unwrap(), api, opts).unwrap()
}

/// Prompt logits (all rows) plus 6 greedy decode steps' logits.
fn run_gpu(g: &GpuModel) -> Vec<f32> {
    let mut s = g.new_session(KvType::F16, 64, 512).unwrap();
    let mut out = Vec::new();
    let mut all = Vec::new();
    g.eval(&mut s, &prompt(), Logits::All, &mut out).unwrap();
    all.extend_from_slice(&out);
    let nv = g.n_vocab();
    let mut t = argmax(&out[out.len() - nv..]);
    for _ in 0..6 {
        g.eval(&mut s, &[t], Logits::Last, &mut out).unwrap();
        all.extend_from_slice(&out);
        t = argmax(&out);
    }
    all
}

fn run_cpu_ordered(path: &std::path::Path) -> Vec<f32> {
    let m = Decoder::load(path).unwrap();
    let mut s = m.new_session(KvType::F16, 64, 512);
    (s.ordered, s.ordered_attention) = (true, true);
    let mut out = Vec::new();
    let mut all = Vec::new();
    m.eval(&mut s, &prompt(), Logits::All, &mut out).unwrap();
    all.extend_from_slice(&out);
    let nv = m.n_vocab;
    let mut t = argmax(&out[out.len() - nv..]);
    for _ in 0..6 {
        m.eval(&mut s, &[t], Logits::Last, &mut out).unwrap();
        all.extend_from_slice(&out);
        t = argmax(&out);
    }
    all
}

fn assert_bits(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let n = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    assert_eq!(n, 0, "{what}: {n} of {} logits differ", a.len());
}

test_device!(
    model fn expert_cache_ordered_is_bit_identical_to_the_cpu_at_every_size(device) {
        let path = reference(Q8);
        let want = run_cpu_ordered(&path);
        for slots in [Some(0), Some(3), None] {
            let g = gpu(&path, true, slots, device);
            assert_bits(&format!("q8_0, {slots:?} slots"), &run_gpu(&g), &want);
            let stats = g.expert_cache_stats();
            match slots {
                None => assert!(stats.is_none()),
                Some(n) => {
                    let s = stats.expect("a partial cache reports counters");
                    // 13 prompt tokens + 6 steps, 2 layers, top 2.
                    assert_eq!(s.lookups, (13 + 6) * 2 * 2, "{s}");
                    assert_eq!(s.admitted as usize, if n == 0 { 0 } else { 2 * n as usize }, "3 slots fill in both layers: {s}");
                    assert_eq!(s.hits + s.cpu + admitted_uses(&s), s.lookups, "{s}");
                    if n == 0 {
                        assert_eq!((s.hits, s.cpu), (0, s.lookups), "{s}");
                    } else {
                        assert!(s.hits > 0 && s.cpu > 0, "3 of 8 slots: both hits and CPU experts: {s}");
                    }
                }
            }
        }
    }
);

test_device!(
    /// Adaptive residency (`--adapt-every 1`: experts swapped between slots after every token)
    /// moves experts between the device and the CPU without changing a bit of the ordered output.
    model fn expert_cache_adaptive_swaps_keep_the_ordered_output_bit_identical(device) {
        let path = reference(Q8);
        let want = run_cpu_ordered(&path);
        let api = device.1.clone();
        let opts = GpuOptions { ordered: true, expert_cache: Some(ExpertCacheSize::Slots(3)), adapt_every: 1, ..GpuOptions::default() };
        let g = GpuModel::new(Decoder::load(&path).unwrap(), api, opts).unwrap();
        assert_bits("q8_0, 3 slots, adapting every token", &run_gpu(&g), &want);
        let s = g.expert_cache_stats().unwrap();
        assert!(s.swapped > 0, "{s}");
        assert_eq!(s.lookups, (13 + 6) * 2 * 2, "{s}");
    }
);

/// Decisions served by the admission of their expert (the first use of each admitted expert
/// within its layer's chunk): what is neither a hit nor a CPU expert.
fn admitted_uses(s: &strata::gpu::experts::cache::CacheStats) -> u64 {
    s.lookups - s.hits - s.cpu
}

test_device!(
    model fn expert_cache_fast_mode_greedy_equals_the_cpu(device) {
        let path = reference(Q8);
        let cpu = Decoder::load(&path).unwrap();
        let mut cs = cpu.new_session(KvType::F16, 64, 512);
        let mut out = Vec::new();
        cpu.eval(&mut cs, &prompt(), Logits::Last, &mut out).unwrap();
        let mut want = vec![argmax(&out)];
        for _ in 0..8 {
            cpu.eval(&mut cs, &[*want.last().unwrap()], Logits::Last, &mut out).unwrap();
            want.push(argmax(&out));
        }
        let g = gpu(&path, false, Some(3), device);
        let mut s = g.new_session(KvType::F16, 64, 512).unwrap();
        g.eval(&mut s, &prompt(), Logits::Last, &mut out).unwrap();
        let mut got = vec![argmax(&out)];
        for _ in 0..8 {
            g.eval(&mut s, &[*got.last().unwrap()], Logits::Last, &mut out).unwrap();
            got.push(argmax(&out));
        }
        assert_eq!(got, want);
    }
);

test_device!(
    model fn expert_cache_refuses_experts_the_device_cannot_run_as_stored(device) {
        let api = device.1.clone();
        let opts = GpuOptions { expert_cache: Some(ExpertCacheSize::Slots(2)), ..GpuOptions::default() };
        let err = GpuModel::new(Decoder::load(&reference(F32)).unwrap(), api, opts).err().expect("f32 experts are widened at upload");
        let msg = err.to_string();
        assert!(msg.contains("blk.0.ffn_gate_exps.weight") && msg.contains("--expert-cache"), "{msg}");
    }
);

#[test]
fn cli_generate_with_an_expert_cache_prints_its_counters_and_the_cpu_text() {
    let m = reference(Q8);
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "-m",
            m.to_str().unwrap(),
            "--tokens",
            "5,42,79,116,153",
            "-n",
            "8",
            "--temp",
            "0",
            "--show-ids",
            "--ordered",
        ];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_strata")).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {err}");
        (String::from_utf8_lossy(&out.stdout).into_owned(), err)
    };
    let (cpu_text, cpu_err) = run(&["--device", "cpu"]);
    let (emu_text, emu_err) = run(&["--device", "emu", "--expert-cache", "3", "--pool-workers", "2"]);
    assert_eq!(emu_text, cpu_text);
    let ids = |e: &str| e.lines().find(|l| l.starts_with("ids: ")).map(str::to_owned);
    assert_eq!(ids(&emu_err), ids(&cpu_err));
    assert!(
        emu_err.contains("expert cache: ") && emu_err.contains("lookups") && emu_err.contains("3 slots per layer"),
        "{emu_err}"
    );
    assert!(emu_err.contains(" ms, 2 workers)"), "the CPU experts ran on a pool of 2: {emu_err}");
}

/// `strata bench` reports the cache's counters over the whole run (text and JSON).
#[test]
fn bench_reports_expert_cache_counters() {
    let m = reference(Q8);
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "bench",
            "-m",
            m.to_str().unwrap(),
            "--device",
            "emu",
            "--expert-cache",
            "3",
            "--pool-workers",
            "2",
            "--pp",
            "8",
            "--tg",
            "4",
            "--reps",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["expert_cache"];
    let n = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k} in {c}"));
    // Every lookup is a hit, a first-use admission's or a CPU run; top 2 of 2 layers per token.
    assert!(n("lookups") > 0 && n("lookups") % 4 == 0 && n("hits") + n("cpu") <= n("lookups"), "{c}");
    assert_eq!((n("slots"), n("pool_workers")), (3, 2), "{c}");
}

/// `--expert-profile-save` writes a run's routing counts as an STRP profile; a new run with
/// `--expert-profile` starts with the slots filled from it (the most-routed experts), so more
/// decisions hit and none is admitted on first use; the text is unchanged. Bad uses are errors.
#[test]
fn cli_expert_profile_round_trip_preloads_the_most_routed_experts() {
    let m = reference(Q8);
    let dir = std::env::temp_dir().join(format!("strata-expert-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prof = dir.join("run.strp");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "The capital of France",
            "-n",
            "12",
            "--temp",
            "0",
            "--show-ids",
            "--device",
            "emu",
            "--expert-cache",
            "3",
        ];
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_strata")).args(&args).output().unwrap()
    };
    let stat = |err: &str, what: &str| -> u64 {
        let line = err
            .lines()
            .find(|l| l.contains("expert cache: ") && l.contains("lookups"))
            .unwrap_or_else(|| panic!("no counters in {err}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        let i = words.iter().position(|w| *w == what).unwrap_or_else(|| panic!("{what} in {line}"));
        words[i - 1].trim_start_matches('[').parse().unwrap()
    };
    let first = run(&["--expert-profile-save", prof.to_str().unwrap()]);
    let e1 = String::from_utf8_lossy(&first.stderr).into_owned();
    assert!(first.status.success(), "{e1}");
    let p = strata::experts::Profile::read(&prof).unwrap();
    assert_eq!((p.n_layers, p.n_expert, p.slots), (2, 8, 3));
    let second = run(&["--expert-profile", prof.to_str().unwrap()]);
    let e2 = String::from_utf8_lossy(&second.stderr).into_owned();
    assert!(second.status.success(), "{e2}");
    assert_eq!(second.stdout, first.stdout, "same text with a preloaded cache");
    assert_eq!(stat(&e2, "preloaded"), 6, "3 slots x 2 layers from the profile: {e2}");
    assert_eq!(stat(&e2, "admitted"), 0, "{e2}");
    assert!(
        stat(&e2, "hits") > stat(&e1, "hits"),
        "profile-filled slots hit more often than first-use ones:\n{e1}\n{e2}"
    );
    // The profile is for this model's shape; without --expert-cache it is refused.
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["generate", "-m", m.to_str().unwrap(), "-p", "x", "-n", "1", "--expert-profile", prof.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("give --expert-cache N"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--dump-routing` records every routing decision: one record per token and MoE layer with
/// the top-k ids and weights; the CPU and the software device (host-readback path, forced on
/// by the dump) record the same experts in the same order, and `strata experts simulate`
/// reads the file.
#[test]
fn cli_dump_routing_cpu_and_emu_agree_and_simulate_reads_it() {
    let m = reference(Q8);
    let dir = std::env::temp_dir().join(format!("strata-dump-routing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dump = |dev: &str| {
        let f = dir.join(format!("{dev}.routing"));
        let args = [
            "generate",
            "-m",
            m.to_str().unwrap(),
            "--tokens",
            "5,42,79,116,153",
            "-n",
            "6",
            "--temp",
            "0",
            "--ordered",
            "--device",
            dev,
            "--dump-routing",
            f.to_str().unwrap(),
        ];
        let out = Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        assert!(err.contains("routing: ") && err.contains("records written"), "{err}");
        (f.clone(), strata::experts::trace::read(&f, Some(8)).unwrap())
    };
    let (cpu_file, cpu) = dump("cpu");
    let (_, emu) = dump("emu");
    // 5 prompt tokens + 5 decode steps (the 6th token is sampled, not evaluated), 2 layers.
    assert_eq!(cpu.len(), (5 + 5) * 2);
    assert!(
        cpu.iter().all(|r| r.ids.len() == 2 && r.layer < 2 && (r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-5),
        "{cpu:?}"
    );
    let ids = |t: &[strata::experts::trace::Routing]| t.iter().map(|r| (r.layer, r.ids.clone())).collect::<Vec<_>>();
    assert_eq!(ids(&emu), ids(&cpu));
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["experts", "simulate", "--trace", cpu_file.to_str().unwrap(), "--experts", "8", "--slots", "3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `strata --serve` with an expert cache reports each request's hits and lookups in its `done`
/// line (the server sums them into /metrics): lookups = evaluated tokens x layers x top-k,
/// hits <= lookups. A second identical request reuses the first one's prompt (all but its
/// last token: prompt reuse) and finds its experts resident, so it hits at a higher rate.
#[test]
fn serve_done_line_reports_expert_cache_counters_per_request() {
    use std::io::Write;
    let m = reference(Q8);
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["-m", m.to_str().unwrap(), "--serve", "--device", "emu", "--expert-cache", "3", "--ordered"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting strata --serve");
    let mut stdin = child.stdin.take().unwrap();
    for id in [1, 2] {
        let req = serde_json::json!({"type": "generate", "id": id, "tokens": prompt(), "max_tokens": 4,
            "sampling": {"temperature": 0.0}, "stop_tokens": []});
        writeln!(stdin, "{req}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let done: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["type"] == "done")
        .collect();
    assert_eq!(done.len(), 2, "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let hp = Decoder::load(&m).unwrap().hp;
    let moe = (hp.n_layer as u64, hp.moe.as_ref().expect("an MoE model").n_expert_used as u64);
    let stat = |d: &serde_json::Value, k: &str| d["stats"][k].as_u64().unwrap_or_else(|| panic!("no stats.{k} in {d}"));
    let mut rates = Vec::new();
    for (d, cached) in done.iter().zip([0, prompt().len() - 1]) {
        assert_eq!(stat(d, "prompt_cached_tokens"), cached as u64, "{d}");
        // The prompt tokens not reused + the 3 decode evaluations after the first sampled token.
        let evaluated = (prompt().len() - cached + 3) as u64;
        assert_eq!(stat(d, "expert_cache_lookups"), evaluated * moe.0 * moe.1, "{d}");
        assert!(stat(d, "expert_cache_hits") <= stat(d, "expert_cache_lookups"), "{d}");
        rates.push(stat(d, "expert_cache_hits") as f64 / stat(d, "expert_cache_lookups") as f64);
        // The ordered mode has no handoff (its wait is zero); the CPU pool's time is measured.
        assert_eq!(stat(d, "expert_handoff_wait_us"), 0, "{d}");
        stat(d, "expert_cpu_us");
    }
    assert!(rates[1] >= rates[0], "the second request starts with the first one's experts resident: {rates:?}");
    // The first request fills the 3 slots of both layers (and streams its prompt's misses).
    let bytes: Vec<u64> = done.iter().map(|d| stat(d, "expert_bytes_to_vram")).collect();
    let expert = {
        let g = gguf::GgufFile::open(&m).unwrap();
        let t = g
            .tensors()
            .iter()
            .filter(|t| t.name.starts_with("blk.0.ffn_") && t.name.contains("_exps."))
            .map(|t| g.tensor_data(t).len() as u64)
            .sum::<u64>();
        t / hp.moe.as_ref().unwrap().n_expert as u64
    };
    assert!(
        bytes[0] >= 2 * 3 * expert && bytes.iter().all(|b| b % expert == 0),
        "{bytes:?} (an expert is {expert} bytes)"
    );
}

test_device!(
    /// `--pcie-frac F`: that share of the misses is copied into the staging slot and computed on
    /// the device instead of the CPU pool (most-used first). At 0 and 3 slots, shares 0.5 and 1,
    /// static and adaptive, the ordered output stays bit-identical to the CPU backend's, and the
    /// counters move exactly those decisions from the CPU to the staging slot.
    model fn expert_cache_pcie_frac_keeps_the_ordered_output_bit_identical(device) {
        let path = reference(Q8);
        let want = run_cpu_ordered(&path);
        for (slots, frac, adapt_every) in [(0, 0.5, 0), (0, 1.0, 0), (3, 0.5, 4), (3, 1.0, 1)] {
            let what = format!("q8_0, {slots} slots, --pcie-frac {frac}, --adapt-every {adapt_every}");
            let opts = GpuOptions { ordered: true, expert_cache: Some(ExpertCacheSize::Slots(slots)), pcie_frac: frac, adapt_every, ..GpuOptions::default() };
            let g = GpuModel::new(Decoder::load(&path).unwrap(), device.1.clone(), opts).unwrap();
            assert_bits(&what, &run_gpu(&g), &want);
            let s = g.expert_cache_stats().unwrap();
            assert_eq!(s.lookups, (13 + 6) * 2 * 2, "{what}: {s}");
            assert!(s.streamed_experts > 0 && s.streamed >= s.streamed_experts, "{what}: {s}");
            if frac == 1.0 {
                assert_eq!(s.cpu, 0, "{what}: every miss on the device: {s}");
            } else {
                assert!(s.cpu > 0, "{what}: half of the misses stay on the CPU: {s}");
            }
            if slots == 0 {
                assert_eq!(s.cpu + s.streamed, s.lookups, "{what}: no slots, every decision a miss: {s}");
            }
        }
    }
);

test_device!(
    /// The fast mode with `--pcie-frac`: decode windows go through the handoff, whose host thread
    /// gives that share of the misses back for the device to read from RAM (gpu-executor/src/experts/pcie.rs);
    /// the prompt streams its misses through the staging slot. Greedy tokens equal the CPU
    /// backend's, static and adaptive.
    model fn expert_cache_pcie_frac_fast_mode_greedy_equals_the_cpu(device) {
        let path = reference(Q8);
        let greedy = |eval: &mut dyn FnMut(&[u32], &mut Vec<f32>)| {
            let mut out = Vec::new();
            eval(&prompt(), &mut out);
            let mut ids = vec![argmax(&out)];
            for _ in 0..8 {
                eval(&[*ids.last().unwrap()], &mut out);
                ids.push(argmax(&out));
            }
            ids
        };
        let cpu = Decoder::load(&path).unwrap();
        let mut cs = cpu.new_session(KvType::F16, 64, 512);
        let want = greedy(&mut |t, out| cpu.eval(&mut cs, t, Logits::Last, out).unwrap());
        for (frac, adapt_every) in [(0.5, 0), (1.0, 0), (0.5, 1)] {
            let opts = GpuOptions { expert_cache: Some(ExpertCacheSize::Slots(3)), pcie_frac: frac, adapt_every, ..GpuOptions::default() };
            let g = GpuModel::new(Decoder::load(&path).unwrap(), device.1.clone(), opts).unwrap();
            let mut s = g.new_session(KvType::F16, 64, 512).unwrap();
            let got = greedy(&mut |t, out| g.eval(&mut s, t, Logits::Last, out).unwrap());
            assert_eq!(got, want, "--pcie-frac {frac}, --adapt-every {adapt_every}");
            let st = g.expert_cache_stats().unwrap();
            let what = format!("{}: --pcie-frac {frac}, --adapt-every {adapt_every}: {st}", device.0);
            // 8 decode steps of 2 MoE layers through the handoff; misses read from RAM there.
            assert_eq!(st.handoff_layers, 8 * 2, "{what}");
            assert!(st.pcie_read_experts > 0 && st.streamed > st.pcie_read_experts, "{what}");
            if frac == 1.0 {
                assert_eq!(st.cpu, 0, "{what}");
            }
        }
    }
);

#[test]
fn cli_pcie_frac_prints_its_counters_and_refuses_bad_shares() {
    let m = reference(Q8);
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "-m",
            m.to_str().unwrap(),
            "--tokens",
            "5,42,79,116,153",
            "-n",
            "8",
            "--temp",
            "0",
            "--show-ids",
            "--ordered",
        ];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_strata")).args(&args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, cpu_text, cpu_err) = run(&["--device", "cpu"]);
    assert!(ok, "{cpu_err}");
    let (ok, emu_text, emu_err) = run(&["--device", "emu", "--expert-cache", "2", "--pcie-frac", "0.5"]);
    assert!(ok, "{emu_err}");
    assert_eq!(emu_text, cpu_text);
    let ids = |e: &str| e.lines().find(|l| l.starts_with("ids: ")).map(str::to_owned);
    assert_eq!(ids(&emu_err), ids(&cpu_err));
    assert!(
        emu_err.contains("computed on the device instead") && emu_err.contains("copied to a staging slot"),
        "{emu_err}"
    );
    for bad in ["1.5", "-0.1", "half"] {
        let flag = format!("--pcie-frac={bad}");
        let (ok, _, err) = run(&["--device", "emu", "--expert-cache", "2", &flag]);
        assert!(!ok && err.contains("--pcie-frac") && err.contains("between 0 and 1"), "--pcie-frac {bad}: {err}");
    }
    // Flash-Next (two-shard Q8_0, fast mode): decode reads half its misses from RAM, in RAM
    // and with the experts left mapped; greedy ids equal the CPU's.
    let fnx = reference("tiny-qwen4exp/tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf");
    let flash = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "-m",
            fnx.to_str().unwrap(),
            "--tokens",
            "5,42,79,116,153",
            "-n",
            "8",
            "--temp",
            "0",
            "--show-ids",
        ];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_strata")).args(&args).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, cpu_err) = flash(&["--device", "cpu"]);
    assert!(ok, "{cpu_err}");
    for mapped in [false, true] {
        let mut extra = vec!["--device", "emu", "--expert-cache", "3", "--pcie-frac", "0.5"];
        if mapped {
            extra.push("--mmap-experts");
        }
        let (ok, err) = flash(&extra);
        assert!(ok, "{err}");
        assert_eq!(ids(&err), ids(&cpu_err), "--mmap-experts {mapped}");
        assert!(err.contains("read from RAM over PCIe"), "{err}");
    }
}

test_device!(
    /// A long prompt chunk (160 tokens, about 40 per expert) runs each chosen expert once on all
    /// its tokens by the prompt rule of the products (dequantize + f16 GEMM from 32 tokens):
    /// with 3 of 8 slots (5 misses a layer streamed through the 4-slot staging ring, so the
    /// ring wraps) the logits equal the all-resident run's bit for bit; against device dispatch
    /// (MMVQ in groups of 8 tokens) they differ, by the GEMM path's rounding only (it skips the
    /// Q8 activation rounding): both within 5e-2 of the CPU backend's logits (measured 3.2e-2
    /// and 2.6e-2) with the CPU's greedy token.
    model fn expert_groups_of_a_long_prompt_chunk_take_the_prompt_rule(device) {
        use strata::gpu::model::MoePath;
        let path = reference(Q8);
        let toks: Vec<u32> = (0..160).map(|i| (i * 37 + 5) % 1024).collect();
        let last = |opts: GpuOptions| {
            let g = GpuModel::new(Decoder::load(&path).unwrap(), device.1.clone(), opts).unwrap();
            let mut s = g.new_session(KvType::F16, 256, 512).unwrap();
            let mut out = Vec::new();
            g.eval(&mut s, &toks, Logits::Last, &mut out).unwrap();
            (out, g.expert_cache_stats())
        };
        let (resident, _) = last(GpuOptions::default());
        let (cached, st) = last(GpuOptions { expert_cache: Some(ExpertCacheSize::Slots(3)), ..GpuOptions::default() });
        let (dispatch, _) = last(GpuOptions { moe: MoePath::Device, ..GpuOptions::default() });
        let st = st.expect("a cache");
        assert!(st.streamed_experts >= 2 * 5 && st.cpu == 0, "{st}");
        assert_bits("3 slots vs every expert resident", &cached, &resident);
        let cpu = Decoder::load(&path).unwrap();
        let mut cs = cpu.new_session(KvType::F16, 256, 512);
        let mut want = Vec::new();
        cpu.eval(&mut cs, &toks, Logits::Last, &mut want).unwrap();
        let diff = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        let (grouped, mmvq, between) = (diff(&resident, &want), diff(&dispatch, &want), diff(&resident, &dispatch));
        eprintln!("{}: prompt rule vs CPU {grouped:e}, dispatch vs CPU {mmvq:e}, between {between:e}", device.0);
        assert!(grouped <= 5e-2 && mmvq <= 5e-2, "{grouped:e} {mmvq:e}");
        assert!(argmax(&resident) == argmax(&want) && argmax(&dispatch) == argmax(&want));
        assert!(between > 0.0, "the grouped experts ran MMVQ as dispatch does: the prompt rule was not taken");
    }
);
