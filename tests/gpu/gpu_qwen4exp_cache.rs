//! Flash-Next's expert cache on the device (`--expert-cache N` with `--device emu|hip`,
//! gpu/qwen4exp): the routed experts live in N slots per MoE layer, admitted on first use or
//! filled from a profile; the experts without a slot run on the CPU (the CPU backend's products)
//! and their rows join the device's combine. On the public tiny-qwen4exp fixtures (4 MoE layers,
//! 8 experts, top 2), with 0 slots (every expert on the CPU), 3 and 7: the logits stay within the
//! tolerances of llama.cpp's recorded ones that the all-resident device run meets
//! (tests/gpu/gpu_qwen4exp.rs), greedy ids equal llama.cpp's, the counters add up; the CLI prints
//! them and the CPU's text; a saved profile preloads the next run.

use std::process::Command;

use crate::models::models_qwen4exp::{compare, load_refs, model};
use strata::gpu::model::{ExpertCacheSize, GpuOptions};
use strata::gpu::qwen4exp::GpuQwen4Exp;
use strata::model::Logits;
use strata::model::qwen4exp::KvType;
use strata::test_device;

const F32: &str = "tiny-qwen4exp-public-f32.gguf";
const Q8: &str = "tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf";
const LAYERS: u64 = 4;
const TOP_K: u64 = 2;

fn load(device: &strata::gpu::test_device::TestDevice, file: &str, slots: Option<u32>) -> GpuQwen4Exp {
    let (_, api) = device.clone();
    let opts = GpuOptions { expert_cache: slots.map(ExpertCacheSize::Slots), ..GpuOptions::default() };
    GpuQwen4Exp::new(model(file), api, opts).unwrap_or_else(|e| panic!("{file}, {slots:?} slots: {e}"))
}

test_device!(
    /// Prompt logits of the 8- and 64-token reference sequences at 0, 3 and 7 slots, on the f32
    /// and the two-shard Q8_0 model: within the all-resident run's tolerances of llama.cpp; the
    /// counters: one lookup per token, layer and rank, each a hit, an admission's use or a CPU
    /// run; 0 slots sends all to the CPU, 7 of 8 admits at most 7 per layer.
    model fn qwen4exp_expert_cache_logits_match_llama_cpp_at_every_size(device) {
        let dev = device.0;
        for (file, variant) in [(F32, "f32"), (Q8, "q8_0-split")] {
            for slots in [0u32, 3, 7] {
                let g = load(device, file, Some(slots));
                let v = g.n_vocab();
                let mut tokens = 0u64;
                for s in load_refs(variant).into_iter().take(2) {
                    let mut sess = g.new_session(KvType::F16, 512).unwrap();
                    let mut got = Vec::new();
                    g.eval(&mut sess, &s.tokens, Logits::All, &mut got).unwrap();
                    tokens += s.tokens.len() as u64;
                    // Q8_0 experts go through the handoff: every window a graph. f32 experts
                    // (no device dispatch) read the choice back: every window eager.
                    let windows = s.tokens.len().div_ceil(strata::gpu::qwen4exp::WINDOW);
                    let want = if variant == "f32" { (0, windows) } else { (windows, 0) };
                    assert_eq!((sess.graph_replays, sess.eager_windows), want, "{dev} {variant} {slots} slots {}", s.name);
                    let c = compare(&got, &s.logits.1, v);
                    eprintln!("{dev} {variant} {slots} slots {}: {c:?}", s.name);
                    if variant == "f32" {
                        assert!(c.max_abs <= 1e-3, "{dev} {variant} {slots} slots {}: {c:?}", s.name);
                    } else {
                        assert!(c.max_abs <= 0.6 && c.mean_abs <= 0.02 && c.max_flip_gap <= 0.05, "{dev} {variant} {slots} slots {}: {c:?}", s.name);
                    }
                }
                let st = g.expert_cache_stats().expect("fewer slots than experts: a cache with counters");
                assert_eq!(st.slots, slots as usize, "{st}");
                assert_eq!(st.lookups, tokens * LAYERS * TOP_K, "{st}");
                assert!(st.hits + st.cpu <= st.lookups && st.admitted <= LAYERS * slots as u64, "{st}");
                // Each copy into a slot is one expert: gate, up and down of 128 x 256 (f32: 4
                // bytes a weight; Q8_0: 34 bytes a block of 32).
                let expert = if variant == "f32" { 3 * 128 * 256 * 4 } else { 3 * 128 * 256 / 32 * 34 };
                assert_eq!(st.copied_bytes, (st.admitted + st.swapped) * expert, "{st}");
                if slots == 0 {
                    assert_eq!((st.hits, st.admitted, st.cpu), (0, 0, st.lookups), "{st}");
                } else {
                    assert!(st.hits > 0 && st.admitted > 0, "{st}");
                    assert_eq!(st.admitted, LAYERS * slots as u64, "72 tokens fill every slot: {st}");
                }
            }
        }
    }
);

test_device!(
    /// With every expert given a slot (`--expert-cache 8` of 8) there is no cache; with 3 slots,
    /// greedy generation prints llama.cpp's greedy ids, as the all-resident run does.
    model fn qwen4exp_expert_cache_greedy_matches_llama_cpp(device) {
        let dev = device.0;
        assert!(load(device, F32, Some(8)).expert_cache_stats().is_none(), "8 of 8 experts: resident, no cache");
        let g = load(device, F32, Some(3));
        let s = load_refs("f32").into_iter().next().expect("seq1");
        let (ids, _) = crate::gpu::gpu_qwen4exp::greedy(&g, &s.tokens, s.greedy.len());
        assert_eq!(ids, s.greedy, "{dev} {}", s.name);
        let st = g.expert_cache_stats().unwrap();
        assert!(st.cpu > 0 && st.hits > 0, "3 of 8 slots over a generation: both sides ran experts: {st}");
    }
);

test_device!(
    /// Adaptive residency (`adapt_every` 1: slots re-assigned after every window) on the 64-token
    /// sequence with 3 slots: experts are swapped in, and the logits stay within the f32 rule.
    model fn qwen4exp_expert_cache_adaptive_stays_within_tolerance(device) {
        let dev = device.0;
        let (_, api) = device.clone();
        let opts = GpuOptions { expert_cache: Some(ExpertCacheSize::Slots(3)), adapt_every: 1, ..GpuOptions::default() };
        let g = GpuQwen4Exp::new(model(F32), api, opts).unwrap();
        let s = load_refs("f32").into_iter().nth(1).expect("seq2");
        let mut sess = g.new_session(KvType::F16, 512).unwrap();
        let mut got = Vec::new();
        // One token at a time, so the cache adapts between tokens.
        for t in &s.tokens {
            let mut row = Vec::new();
            g.eval(&mut sess, &[*t], Logits::Last, &mut row).unwrap();
            got.extend_from_slice(&row);
        }
        let c = compare(&got, &s.logits.1, g.n_vocab());
        let st = g.expert_cache_stats().unwrap();
        eprintln!("{dev}: {c:?} {st}");
        assert!(c.max_abs <= 1e-3, "{dev}: {c:?}");
        assert!(st.swapped > 0 && st.lookups == s.tokens.len() as u64 * LAYERS * TOP_K, "{st}");
    }
);

fn strata(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{args:?}: {err}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), err)
}

/// The number before `what` on the expert cache's counter line.
fn stat(err: &str, what: &str) -> u64 {
    let line = err
        .lines()
        .find(|l| l.contains("expert cache: ") && l.contains("lookups"))
        .unwrap_or_else(|| panic!("no counters in {err}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let i = words.iter().position(|w| *w == what).unwrap_or_else(|| panic!("{what} in {line}"));
    words[i - 1].trim_start_matches('[').parse().unwrap()
}

/// `strata generate --device emu --expert-cache 3` on the f32 fixture prints the CPU's text and
/// ids and the cache's counters; `--expert-profile-save` writes the run's routing counts and a
/// second run with `--expert-profile` starts with the slots filled (12 = 3 x 4 layers), admits
/// none and hits more, with the same text.
#[test]
fn cli_qwen4exp_expert_cache_prints_counters_and_profile_preloads() {
    let m = crate::models::models_qwen4exp::ref_dir().join(F32);
    let dir = std::env::temp_dir().join(format!("strata-flash-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prof = dir.join("run.strp");
    let base = [
        "generate",
        "-m",
        m.to_str().unwrap(),
        "--tokens",
        "5,42,79,116,153,190,227",
        "-n",
        "8",
        "--temp",
        "0",
        "--show-ids",
    ];
    let with = |extra: &[&str]| strata(&[&base[..], extra].concat());
    let (cpu_text, cpu_err) = with(&["--device", "cpu"]);
    let (emu_text, e1) = with(&[
        "--device",
        "emu",
        "--expert-cache",
        "3",
        "--pool-workers",
        "2",
        "--expert-profile-save",
        prof.to_str().unwrap(),
    ]);
    let ids = |e: &str| e.lines().find(|l| l.starts_with("ids: ")).map(str::to_owned);
    assert_eq!(emu_text, cpu_text);
    assert_eq!(ids(&e1), ids(&cpu_err));
    assert!(e1.contains("3 slots per layer") && e1.contains(" ms, 2 workers)"), "{e1}");
    // 7 prompt tokens + 7 decode steps (the 8th token is sampled, not evaluated).
    assert_eq!(stat(&e1, "lookups"), (7 + 7) * LAYERS * TOP_K, "{e1}");
    let p = strata::experts::Profile::read(&prof).unwrap();
    assert_eq!((p.n_layers, p.n_expert, p.slots), (4, 8, 3));
    let (text2, e2) = with(&["--device", "emu", "--expert-cache", "3", "--expert-profile", prof.to_str().unwrap()]);
    assert_eq!(text2, cpu_text);
    assert!(e2.contains("expert cache: 12 experts copied from"), "{e2}");
    assert_eq!(stat(&e2, "preloaded"), 12, "{e2}");
    assert_eq!(stat(&e2, "admitted"), 0, "{e2}");
    assert!(
        stat(&e2, "hits") >= stat(&e1, "hits"),
        "profile-filled slots hit at least as often as first-use ones:\n{e1}\n{e2}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Decode of the first `n` tokens of the 64-token reference sequence one at a time (so the cache
/// adapts between tokens), Q8_0 model, 3 slots, adapting every token; logits per step.
fn decode_q8(g: &GpuQwen4Exp, n: usize) -> Vec<Vec<f32>> {
    let s = load_refs("q8_0-split").into_iter().nth(1).expect("seq2");
    let mut sess = g.new_session(KvType::F16, 512).unwrap();
    s.tokens[..n]
        .iter()
        .map(|t| {
            let mut row = Vec::new();
            g.eval(&mut sess, &[*t], Logits::Last, &mut row).unwrap();
            row
        })
        .collect()
}

/// How far the CPU's products for the misses (Q8_0 dot products on Q8_0-quantized inputs) may
/// move a Q8_0 logit from the device's (MMVQ over Q8_1 inputs); measured: 0 (the same bits) on the
/// software device.
const HANDOFF_TOL: f32 = 1e-3;

fn q8_cache(device: &strata::gpu::test_device::TestDevice, graphs: bool) -> GpuQwen4Exp {
    let (_, api) = device.clone();
    let opts = GpuOptions {
        expert_cache: Some(ExpertCacheSize::Slots(3)),
        adapt_every: 1,
        graphs,
        pool_workers: 2,
        ..GpuOptions::default()
    };
    GpuQwen4Exp::new(model(Q8), api, opts).unwrap()
}

test_device!(
    /// The expert handoff (gpu-executor/src/experts/handoff.rs) on Flash-Next: decode steps replayed as graphs
    /// give the same bits as eager launches, with experts swapped every token, and stay within
    /// HANDOFF_TOL of the all-resident device run.
    model fn qwen4exp_handoff_graph_replay_equals_eager_launches(device) {
        let dev = device.0;
        let graphs = decode_q8(&q8_cache(device, true), 16);
        let eager = decode_q8(&q8_cache(device, false), 16);
        for (i, (a, b)) in graphs.iter().zip(&eager).enumerate() {
            let n = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            assert_eq!(n, 0, "{dev} step {i}: {n} logits differ between graph replay and eager launches");
        }
        // Against the all-resident run (every expert on the device, no handoff): the CPU's
        // products for the misses move the logits by at most HANDOFF_TOL.
        let (_, api) = device.clone();
        let resident = decode_q8(&GpuQwen4Exp::new(model(Q8), api, GpuOptions::default()).unwrap(), 16);
        let diff = graphs.iter().zip(&resident).flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs())).fold(0f32, f32::max);
        eprintln!("{dev}: handoff vs resident max |diff| {diff:e}");
        assert!(diff <= HANDOFF_TOL, "{dev}: handoff vs resident: {diff:e}");
    }
);

test_device!(
    /// A CPU expert worker that fails during a Flash-Next graph replay: that call is an error
    /// naming the layer, returned at once (the device is answered); the sequence is refused
    /// until reset (its recurrent states may have moved); after a reset, the same tokens give
    /// the clean run's greedy token, its logits within 1e-2 (the failed window's admissions may
    /// move an expert from the CPU to the device).
    model fn qwen4exp_handoff_worker_fault_is_an_error_then_served(device) {
        let dev = device.0;
        let clean = decode_q8(&q8_cache(device, true), 4);
        let g = q8_cache(device, true);
        let s = load_refs("q8_0-split").into_iter().nth(1).expect("seq2");
        let mut sess = g.new_session(KvType::F16, 512).unwrap();
        let mut row = Vec::new();
        for t in &s.tokens[..3] {
            g.eval(&mut sess, &[*t], Logits::Last, &mut row).unwrap();
        }
        g.expert_cache().unwrap().inject_faults(1);
        let start = std::time::Instant::now();
        let err = g.eval(&mut sess, &[s.tokens[3]], Logits::Last, &mut row).expect_err("an injected worker fault must fail the call").to_string();
        assert!(err.contains("injected fault") && err.contains("layer 0"), "{dev}: {err}");
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "{dev}: the failure took {:?}", start.elapsed());
        // The failed window may have advanced the recurrent states: the sequence is refused
        // until it starts over.
        let again = g.eval(&mut sess, &[s.tokens[3]], Logits::Last, &mut row).expect_err("a sequence whose window failed must be refused").to_string();
        assert!(again.contains("reset the session"), "{dev}: {again}");
        sess.reset();
        for t in &s.tokens[..4] {
            g.eval(&mut sess, &[*t], Logits::Last, &mut row).unwrap();
        }
        let argmax = |v: &[f32]| v.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0;
        let diff = row.iter().zip(&clean[3]).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!("{dev}: retry vs clean max |diff| {diff:e}");
        assert!(diff <= 1e-2 && argmax(&row) == argmax(&clean[3]), "{dev}: retry vs clean: {diff:e}");
    }
);

test_device!(
    /// `--pcie-frac` on Flash-Next. Q8_0 decode goes through the handoff: the host gives that
    /// share of the misses back and the device reads them from RAM (gpu-executor/src/experts/pcie.rs) with the
    /// kernels it runs its slots with. Graph replay equals eager launches bit for bit, and the
    /// logits stay within HANDOFF_TOL of the all-resident run; at 1 the CPU computes nothing.
    /// The f32 model (no device dispatch, host path) stages its share in the staging slot, and
    /// its greedy ids stay llama.cpp's.
    model fn qwen4exp_pcie_frac_reads_misses_from_ram_in_handoff_graphs(device) {
        let dev = device.0;
        let (_, api) = device.clone();
        let resident = decode_q8(&GpuQwen4Exp::new(model(Q8), api.clone(), GpuOptions::default()).unwrap(), 12);
        for frac in [0.5, 1.0] {
            let cached = |graphs: bool| {
                let opts = GpuOptions { expert_cache: Some(ExpertCacheSize::Slots(3)), adapt_every: 1, graphs, pcie_frac: frac, pool_workers: 2, ..GpuOptions::default() };
                GpuQwen4Exp::new(model(Q8), api.clone(), opts).unwrap()
            };
            let g = cached(true);
            let graphs = decode_q8(&g, 12);
            let eager = decode_q8(&cached(false), 12);
            for (i, (a, b)) in graphs.iter().zip(&eager).enumerate() {
                let n = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                assert_eq!(n, 0, "{dev} --pcie-frac {frac} step {i}: {n} logits differ between graph replay and eager launches");
            }
            let diff = graphs.iter().zip(&resident).flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs())).fold(0f32, f32::max);
            let st = g.expert_cache_stats().unwrap();
            eprintln!("{dev} --pcie-frac {frac}: vs resident max |diff| {diff:e}; {st}");
            assert!(diff <= HANDOFF_TOL, "{dev} --pcie-frac {frac}: {diff:e}");
            assert_eq!(st.handoff_layers, 12 * LAYERS, "{dev}: every decode layer through the handoff: {st}");
            assert!(st.pcie_read_experts > 0 && st.pcie_read_bytes == st.pcie_read_experts * 3 * 128 * 256 / 32 * 34, "{dev}: {st}");
            assert_eq!(st.streamed_experts, 0, "{dev}: nothing copied to a staging slot in decode: {st}");
            assert_eq!(st.hits + st.cpu + st.streamed, st.lookups, "{dev}: {st}");
            if frac == 1.0 {
                assert_eq!(st.cpu, 0, "{dev}: every miss read from RAM: {st}");
            } else {
                assert!(st.cpu > 0, "{dev}: half of the misses stay on the CPU: {st}");
            }
        }
        let opts = GpuOptions { expert_cache: Some(ExpertCacheSize::Slots(3)), pcie_frac: 0.5, ..GpuOptions::default() };
        let g = GpuQwen4Exp::new(model(F32), api, opts).unwrap();
        let s = load_refs("f32").into_iter().next().expect("seq1");
        let (ids, _) = crate::gpu::gpu_qwen4exp::greedy(&g, &s.tokens, s.greedy.len());
        assert_eq!(ids, s.greedy, "{dev} f32 --pcie-frac 0.5");
        let st = g.expert_cache_stats().unwrap();
        assert!(st.streamed_experts > 0 && st.cpu > 0 && st.pcie_read_experts == 0, "{dev}: f32 stages half its misses: {st}");
    }
);
