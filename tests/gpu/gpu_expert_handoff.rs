//! The expert cache's per-layer handoff (gpu-executor/src/experts/handoff.rs, issue 12 item 4) on the
//! synthetic MoE model (tiny-qwen3moe q8_0: 2 layers, 8 experts, top 2), fast mode: decode
//! windows with a partial cache run as captured graphs — the device maps the router's choice
//! through its slot table, computes the hits from their slots and takes the misses' rows from a
//! host thread through mapped memory.
//!
//! Checked against independent runs: the all-resident device run (device dispatch, no cache)
//! and the CPU backend. Graph replay equals eager launches bit for bit; a failing CPU worker is
//! an error for that call (not a hang), and the next call is served normally.

use strata::cpu::prelude::*;
use strata::gpu::model::{ExpertCacheSize, GpuModel, GpuOptions};
use strata::gpu::test_device::TestDevice;
use strata::kv_cache::KvType;
use strata::model::{Decoder, Logits};
use strata::test_device;

use crate::models::models_util::reference;

const Q8: &str = "tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf";
const STEPS: usize = 12;

fn prompt() -> Vec<u32> {
    (0..13).map(|i| (i * 37 + 5) % 1024).collect()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
}

fn gpu(device: &TestDevice, opts: GpuOptions) -> GpuModel {
    GpuModel::new(Decoder::load(&reference(Q8)).unwrap(), device.1.clone(), opts).unwrap()
}

fn cached(slots: u32, adapt_every: usize, graphs: bool) -> GpuOptions {
    GpuOptions {
        expert_cache: Some(ExpertCacheSize::Slots(slots)),
        adapt_every,
        graphs,
        pool_workers: 2,
        ..GpuOptions::default()
    }
}

/// Decode logits of `STEPS` greedy steps after the prompt, the tokens, and the session's graph
/// replays and eager windows.
fn decode(g: &GpuModel) -> (Vec<Vec<f32>>, Vec<u32>, usize, usize) {
    let mut s = g.new_session(KvType::F16, 64, 512).unwrap();
    let mut out = Vec::new();
    g.eval(&mut s, &prompt(), Logits::Last, &mut out).unwrap();
    let (mut logits, mut toks) = (Vec::new(), vec![argmax(&out)]);
    for _ in 0..STEPS {
        g.eval(&mut s, &[*toks.last().unwrap()], Logits::Last, &mut out).unwrap();
        logits.push(out.clone());
        toks.push(argmax(&out));
    }
    (logits, toks, s.graph_replays, s.eager_windows)
}

fn cpu_tokens() -> Vec<u32> {
    let m = Decoder::load(&reference(Q8)).unwrap();
    let mut s = m.new_session(KvType::F16, 64, 512);
    let mut out = Vec::new();
    m.eval(&mut s, &prompt(), Logits::Last, &mut out).unwrap();
    let mut toks = vec![argmax(&out)];
    for _ in 0..STEPS {
        m.eval(&mut s, &[*toks.last().unwrap()], Logits::Last, &mut out).unwrap();
        toks.push(argmax(&out));
    }
    toks
}

/// Largest |a - b| over the largest |b| of each step.
fn max_rel(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let scale = y.iter().fold(0f32, |m, v| m.max(v.abs()));
            x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs())) / scale
        })
        .fold(0f32, f32::max)
}

/// How far the misses' CPU products (the CPU backend's Q8_0 dot products) may move a logit from
/// the device's own (MMVQ over Q8_1 activations): relative to the step's largest logit.
const FAST_TOL: f32 = 2e-3;

test_device!(
    /// 0, 3 and 7 of 8 slots, static and adapting after every token: decode windows are graph
    /// replays, the tokens are the CPU backend's and the all-resident run's, the logits stay
    /// within FAST_TOL of the all-resident run; the counters add up (every decision is a hit or
    /// a CPU expert, deferred admissions included).
    model fn handoff_decode_graphs_match_the_resident_run_and_the_cpu(device) {
        let want_toks = cpu_tokens();
        let (resident, resident_toks, _, _) = decode(&gpu(device, GpuOptions::default()));
        assert_eq!(resident_toks, want_toks, "all-resident device run vs CPU");
        for (slots, adapt) in [(0, 0), (3, 0), (7, 0), (3, 1)] {
            let g = gpu(device, cached(slots, adapt, true));
            let (logits, toks, replays, eager) = decode(&g);
            let what = format!("{slots} slots, adapt every {adapt}");
            assert_eq!(toks, want_toks, "{what}: greedy tokens");
            let rel = max_rel(&logits, &resident);
            eprintln!("{what}: logits {rel:e} from the resident run, {replays} replays");
            assert!(rel <= FAST_TOL, "{what}: logits {rel:e} from the resident run");
            // The 13-token prompt is one eager window (host readback); every decode step a replay.
            assert_eq!((replays, eager), (STEPS, 1), "{what}");
            let s = g.expert_cache_stats().unwrap();
            assert_eq!(s.lookups as usize, (13 + STEPS) * 2 * 2, "{what}: {s}");
            assert_eq!(s.handoff_layers as usize, STEPS * 2, "{what}: every decode step hands off both MoE layers: {s}");
            if slots == 0 {
                // The prompt window's misses stream through the staging slot, the decode steps'
                // run on the CPU.
                assert_eq!((s.hits, s.streamed, s.cpu), (0, 13 * 2 * 2, STEPS as u64 * 2 * 2), "{what}: {s}");
            } else {
                assert!(s.hits > 0 && s.cpu > 0, "{what}: both sides compute: {s}");
            }
            if adapt > 0 {
                assert!(s.swapped > 0, "{what}: {s}");
            }
        }
    }
);

test_device!(
    /// The same decode with graphs off (every launch eager, the host thread answering each
    /// layer as it comes) gives the same bits as the replayed graphs.
    model fn handoff_graph_replay_equals_eager_launches(device) {
        let (graphs, _, replays, _) = decode(&gpu(device, cached(3, 1, true)));
        let (eager, _, none, eager_windows) = decode(&gpu(device, cached(3, 1, false)));
        assert_eq!((replays, none, eager_windows), (STEPS, 0, STEPS + 1));
        for (i, (a, b)) in graphs.iter().zip(&eager).enumerate() {
            let n = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            assert_eq!(n, 0, "step {i}: {n} logits differ between graph replay and eager launches");
        }
    }
);

test_device!(
    /// A CPU worker that fails during a graph replay: that call is an error naming the layer,
    /// returned promptly (the device is answered, not left waiting); the mailboxes are reset and
    /// the same token evaluated again gives a clean run's logits (within FAST_TOL) and token.
    model fn handoff_worker_failure_is_an_error_then_the_next_call_is_served(device) {
        let (clean, _, _, _) = decode(&gpu(device, cached(3, 0, true)));
        let g = gpu(device, cached(3, 0, true));
        let mut s = g.new_session(KvType::F16, 64, 512).unwrap();
        let mut out = Vec::new();
        g.eval(&mut s, &prompt(), Logits::Last, &mut out).unwrap();
        let t0 = argmax(&out);
        g.eval(&mut s, &[t0], Logits::Last, &mut out).unwrap(); // captures the decode graph
        let t1 = argmax(&out);
        g.expert_cache().unwrap().inject_faults(1);
        let start = std::time::Instant::now();
        let err = g.eval(&mut s, &[t1], Logits::Last, &mut out).expect_err("an injected worker fault must fail the call").to_string();
        assert!(err.contains("injected fault") && err.contains("layer 0"), "{err}");
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "the failure took {:?}", start.elapsed());
        g.eval(&mut s, &[t1], Logits::Last, &mut out).unwrap();
        // The failed window's lookups may have admitted experts, so the retry can compute on
        // the device what the clean run computed on the CPU: equal within FAST_TOL.
        let rel = max_rel(&[out.clone()], &clean[1..2]);
        assert!(rel <= FAST_TOL, "after the fault, step 1 is {rel:e} from a clean run");
        assert_eq!(argmax(&out), argmax(&clean[1]));
    }
);
