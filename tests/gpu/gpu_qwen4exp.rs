//! Flash-Next's whole forward pass on the device (`gpu::qwen4exp`) against llama.cpp's
//! recorded logits on the public tiny-qwen4exp fixtures, with the tolerances the CPU backend
//! meets there (tests/models/models_qwen4exp.rs: f32 model with f16 caches 1e-3; the two-shard Q8_0
//! model max 0.6 / mean 0.02, argmax flips only where llama.cpp is nearly tied), and against
//! the CPU backend: greedy tokens, the int8 cache, a reset. The device runs the fast mode (its
//! kernels' named tolerances, Q8_1 activations for Q8_0 weights). Runs as `<name>::emu` and
//! `<name>::hip`.

use crate::models::models_qwen4exp::{argmax, compare, load_refs, model};
use strata::cpu::prelude::*;
use strata::gpu::model::GpuOptions;
use strata::gpu::qwen4exp::GpuQwen4Exp;
use strata::model::Logits;
use strata::model::qwen4exp::KvType;
use strata::test_device;

const F32: &str = "tiny-qwen4exp-public-f32.gguf";
const Q8: &str = "tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf";

fn load(device: &strata::gpu::test_device::TestDevice, file: &str) -> GpuQwen4Exp {
    let (_, api) = device.clone();
    GpuQwen4Exp::new(model(file), api, GpuOptions::default()).unwrap_or_else(|e| panic!("{file}: {e}"))
}

test_device!(
    /// Prompt logits of every reference sequence (8, 64 and 300 tokens: the last exercises the
    /// indexer's sparse selection) within the CPU backend's tolerances of llama.cpp's.
    model fn gpu_qwen4exp_logits_match_llama_cpp(device) {
        let dev = device.0;
        for (file, variant, seqs) in [(F32, "f32", 3usize), (Q8, "q8_0-split", 2)] {
            let g = load(device, file);
            let v = g.n_vocab();
            for s in load_refs(variant).into_iter().take(seqs) {
                let mut sess = g.new_session(KvType::F16, 512).unwrap();
                let mut got = Vec::new();
                g.eval(&mut sess, &s.tokens, Logits::All, &mut got).unwrap();
                let c = compare(&got, &s.logits.1, v);
                eprintln!("{dev} {variant} {}: {} tokens {c:?}", s.name, s.tokens.len());
                if variant == "f32" {
                    assert!(c.max_abs <= 1e-3, "{dev} {variant} {}: {c:?}", s.name);
                } else {
                    assert!(c.max_abs <= 0.6 && c.mean_abs <= 0.02 && c.max_flip_gap <= 0.05, "{dev} {variant} {}: {c:?}", s.name);
                }
            }
        }
    }
);

test_device!(
    /// Greedy generation (the prompt, then one token a window) prints llama.cpp's greedy ids,
    /// as the CPU backend does, on the f32 model.
    model fn gpu_qwen4exp_greedy_matches_llama_cpp(device) {
        let dev = device.0;
        let g = load(device, F32);
        for s in load_refs("f32").into_iter().take(2) {
            let (ids, n_past) = greedy(&g, &s.tokens, s.greedy.len());
            assert_eq!(ids, s.greedy, "{dev} {}", s.name);
            assert_eq!(n_past, s.tokens.len() + s.greedy.len() - 1);
        }
    }
);

/// `n` greedy ids after `prompt` (the prompt in one evaluation, then one token a window), and
/// the session's position at the end.
pub(crate) fn greedy(g: &GpuQwen4Exp, prompt: &[u32], n: usize) -> (Vec<u32>, usize) {
    let mut sess = g.new_session(KvType::F16, 512).unwrap();
    let ids = greedy_in(g, &mut sess, prompt, n);
    (ids, sess.n_past)
}

/// [`greedy`] in the session `sess`.
pub(crate) fn greedy_in(
    g: &GpuQwen4Exp,
    sess: &mut strata::gpu::qwen4exp::GpuQwen4ExpSession,
    prompt: &[u32],
    n: usize,
) -> Vec<u32> {
    let mut l = Vec::new();
    g.eval(sess, prompt, Logits::Last, &mut l).unwrap();
    let mut ids = vec![argmax(&l) as u32];
    while ids.len() < n {
        g.eval(sess, &ids[ids.len() - 1..], Logits::Last, &mut l).unwrap();
        ids.push(argmax(&l) as u32);
    }
    ids
}

test_device!(
    /// Routed experts by device dispatch (`mmvq_moe_*` read the router's choice on the device,
    /// the default for quantized experts) give the host-readback path's logits bit for bit on the
    /// two-shard Q8_0 model, fused and unfused gate/up, over a 64-token prompt (windows of 8:
    /// 80 slots, two launches of 6 and 2 tokens) and single-token decode windows.
    model fn gpu_qwen4exp_device_dispatch_equals_host_readback(device) {
        use strata::gpu::model::MoePath;
        let dev = device.0;
        let s = load_refs("q8_0-split").into_iter().nth(1).expect("seq2");
        let run = |moe: MoePath, fused_glu: bool| {
            let (_, api) = device.clone();
            let g = GpuQwen4Exp::new(model(Q8), api, GpuOptions { moe, fused_glu, ..GpuOptions::default() }).unwrap();
            let mut sess = g.new_session(KvType::F16, 512).unwrap();
            let mut all = Vec::new();
            g.eval(&mut sess, &s.tokens[..56], Logits::All, &mut all).unwrap();
            for t in &s.tokens[56..] {
                let mut row = Vec::new();
                g.eval(&mut sess, &[*t], Logits::Last, &mut row).unwrap();
                all.extend_from_slice(&row);
            }
            all
        };
        let host = run(MoePath::Host, true);
        for fused in [true, false] {
            let device_path = run(MoePath::Auto, fused);
            let differ = host.iter().zip(&device_path).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(differ, 0, "{dev}, fused {fused}: {differ} of {} logits differ", host.len());
        }
    }
);

test_device!(
    /// Decode windows as graphs (captured once per window size, replayed with the inputs in
    /// device buffers; the default with every expert resident in an MMVQ type) equal eager
    /// launches bit for bit on the Q8_0 model: a 56-token prompt (windows of 8), 8 single-token
    /// windows and a 3-token window, with the f16 and the int8 cache.
    model fn gpu_qwen4exp_graph_replay_equals_eager_launches(device) {
        let dev = device.0;
        let s = load_refs("q8_0-split").into_iter().nth(1).expect("seq2");
        for kv in [KvType::F16, KvType::Int8] {
            let run = |graphs: bool| {
                let (_, api) = device.clone();
                let g = GpuQwen4Exp::new(model(Q8), api, GpuOptions { graphs, ..GpuOptions::default() }).unwrap();
                let mut sess = g.new_session(kv, 512).unwrap();
                let mut all = Vec::new();
                g.eval(&mut sess, &s.tokens[..56], Logits::All, &mut all).unwrap();
                for w in [&s.tokens[56..57], &s.tokens[57..58], &s.tokens[58..59], &s.tokens[59..60], &s.tokens[60..61], &s.tokens[61..64]] {
                    let mut rows = Vec::new();
                    g.eval(&mut sess, w, Logits::All, &mut rows).unwrap();
                    all.extend_from_slice(&rows);
                }
                (all, sess.graph_replays, sess.eager_windows)
            };
            let (eager, r0, e0) = run(false);
            let (graph, r1, e1) = run(true);
            assert_eq!((r0, e0), (0, 7 + 6), "{dev}: graphs off: every window eager");
            assert_eq!((r1, e1), (7 + 6, 0), "{dev}: graphs on: every window replayed");
            let differ = eager.iter().zip(&graph).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(differ, 0, "{dev} {kv:?}: {differ} of {} logits differ", eager.len());
        }
    }
);

test_device!(
    /// The int8 cache (the engine's own format) against the CPU backend's int8 cache: the same
    /// rows, so the logits differ only by the fast mode's rounding; and a reset session gives the
    /// first evaluation's logits again, bit for bit.
    model fn gpu_qwen4exp_int8_cache_matches_cpu_and_reset_replays(device) {
        let dev = device.0;
        let g = load(device, F32);
        let cpu = model(F32);
        let v = g.n_vocab();
        let s = load_refs("f32").into_iter().nth(1).expect("seq2");
        let mut sess = g.new_session(KvType::Int8, 128).unwrap();
        let mut got = Vec::new();
        g.eval(&mut sess, &s.tokens, Logits::All, &mut got).unwrap();
        let mut st = cpu.new_state(KvType::Int8);
        let want = cpu.forward(&mut st, &s.tokens, 0).unwrap();
        let c = compare(&got, &want, v);
        eprintln!("{dev} int8 cache vs CPU int8: {c:?}");
        assert!(c.max_abs <= 1e-3 && c.argmax_agree == 1.0, "{dev}: {c:?}");
        sess.reset();
        let mut again = Vec::new();
        g.eval(&mut sess, &s.tokens, Logits::All, &mut again).unwrap();
        assert!(got.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits()), "{dev}: a reset session must replay bit for bit");
    }
);

test_device!(
    /// What the device path does not take is refused with the reason: an f32 cache, tokens
    /// outside the vocabulary, a window past the capacity (the ordered mode's refusals are in
    /// tests/gpu/gpu_qwen4exp_ordered.rs).
    model fn gpu_qwen4exp_refuses_with_reasons(device) {
        let g = load(device, F32);
        let e = g.new_session(KvType::F32, 16).err().expect("f32 cache");
        assert!(e.to_string().contains("--kv f32"), "{e}");
        let mut sess = g.new_session(KvType::F16, 4).unwrap();
        let mut out = Vec::new();
        let e = g.eval(&mut sess, &[1, 2, 3, 4, 5], Logits::Last, &mut out).unwrap_err();
        assert!(e.to_string().contains("5"), "{e}");
        let e = g.eval(&mut sess, &[g.n_vocab() as u32], Logits::Last, &mut out).unwrap_err();
        assert!(e.to_string().contains("outside the vocabulary"), "{e}");
        assert_eq!(sess.n_past, 0);
    }
);

/// Drafts the known greedy continuation, with draft `wrong_at` of every window made wrong, so
/// windows both accept drafts and roll back.
struct Oracle {
    truth: Vec<u32>,
    wrong_at: usize,
    n_vocab: u32,
}

impl strata::spec::Drafter for Oracle {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<strata::spec::Draft> {
        let at = history.len();
        (0..max)
            .filter_map(|i| self.truth.get(at + i).map(|&t| (i, t)))
            .map(|(i, t)| strata::spec::Draft {
                token: if i == self.wrong_at { (t + 1) % self.n_vocab } else { t },
                p: 1.0,
            })
            .collect()
    }
}

test_device!(
    /// Speculative decoding on the device (the GDN and PLE states rolled back through their
    /// device snapshots, the attention cells overwritten) prints the plain greedy ids, with
    /// drafts both accepted and rejected, for the suffix drafter and a drafter that is right
    /// then wrong mid-window.
    model fn gpu_qwen4exp_speculative_equals_greedy(device) {
        use strata::spec::{SpecConfig, SpecStats, SuffixDrafter, generate_greedy_spec};
        let dev = device.0;
        let g = load(device, F32);
        let s = load_refs("f32").into_iter().next().expect("seq1");
        let prompt: Vec<u32> = s.tokens.iter().chain(&s.tokens).copied().collect();
        let n = 16;
        let mut sess = g.new_session(KvType::F16, 128).unwrap();
        let mut l = Vec::new();
        g.eval(&mut sess, &prompt, Logits::Last, &mut l).unwrap();
        let mut want = vec![argmax(&l) as u32];
        while want.len() < n {
            g.eval(&mut sess, &want[want.len() - 1..], Logits::Last, &mut l).unwrap();
            want.push(argmax(&l) as u32);
        }
        let truth: Vec<u32> = prompt.iter().chain(&want).copied().collect();
        let mut total = SpecStats::default();
        for (n_draft, wrong_at) in [(2usize, 1usize), (4, 2), (8, 5), (4, usize::MAX)] {
            let oracle = Oracle { truth: truth.clone(), wrong_at, n_vocab: g.n_vocab() as u32 };
            let suffix = SuffixDrafter { min_match: 1, ..SuffixDrafter::default() };
            let drafters: [Box<dyn strata::spec::Drafter>; 2] = [Box::new(oracle), Box::new(suffix)];
            for mut d in drafters {
                let mut sess: Box<dyn strata::engine::Session> = Box::new(g.new_session(KvType::F16, 128).unwrap());
                let loaded: &dyn strata::engine::LoadedModel = &g;
                let (got, st) = generate_greedy_spec(loaded, &mut sess, &prompt, n, &mut *d, SpecConfig { n_draft, min_p: 0.0 }).unwrap();
                assert_eq!(got, want, "{dev} --spec {n_draft}, wrong at {wrong_at}");
                assert_eq!(sess.n_past(), prompt.len() + n - 1, "{dev} --spec {n_draft}: position");
                total.drafted += st.drafted;
                total.accepted += st.accepted;
                total.rollbacks += st.rollbacks;
            }
        }
        eprintln!("{dev}: {} drafted, {} accepted, {} rollbacks", total.drafted, total.accepted, total.rollbacks);
        assert!(total.accepted > 0 && total.rollbacks > 0, "{dev}: the test must accept and reject drafts: {total:?}");
    }
);

test_device!(
    /// The published IQ3_XXS files' expert mix: gate and up IQ3_XXS, down IQ4_NL (its rows, as
    /// wide as the expert FFN, are not whole IQ3_XXS blocks: llama.cpp's quantizer falls back to
    /// IQ4_NL). Both run as stored by device dispatch, bit for bit what the host-readback path
    /// gives, and the logits stay within the Q8_0 model's tolerance of the CPU backend's.
    model fn gpu_qwen4exp_iq3_xxs_experts_with_iq4_nl_down(device) {
        use strata::gpu::model::MoePath;
        use strata::synth::qwen4exp::{SynthConfig, write};
        let dev = device.0;
        let mut cfg = SynthConfig::public();
        cfg.matrix_type = quant::GgmlType::Q8_0;
        cfg.expert_type = Some(quant::GgmlType::IQ3XXS);
        let dir = std::env::temp_dir().join(format!("strata-gpu-iq4nl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = write(&cfg, 5, &dir.join("iq3"), false).unwrap().remove(0);
        let m = strata::model::qwen4exp::Qwen4Exp::open(&path).unwrap();
        let types: Vec<_> = [&m.layers[0].moe.experts[0].gate, &m.layers[0].moe.experts[0].up, &m.layers[0].moe.experts[0].down].iter().map(|w| w.ty).collect();
        assert_eq!(types, [quant::GgmlType::IQ3XXS, quant::GgmlType::IQ3XXS, quant::GgmlType::IQ4NL], "the synthetic model's expert types");
        let prompt: Vec<u32> = (0..20u32).map(|i| (i * 53 + 7) % cfg.n_vocab as u32).collect();
        let want = m.forward(&mut m.new_state(KvType::F16), &prompt, 0).unwrap();
        let run = |moe: MoePath| {
            let (_, api) = device.clone();
            let g = GpuQwen4Exp::new(strata::model::qwen4exp::Qwen4Exp::open(&path).unwrap(), api, GpuOptions { moe, ..GpuOptions::default() }).unwrap();
            let mut sess = g.new_session(KvType::F16, 64).unwrap();
            let mut all = Vec::new();
            g.eval(&mut sess, &prompt, Logits::All, &mut all).unwrap();
            all
        };
        let (dispatch, host) = (run(MoePath::Auto), run(MoePath::Host));
        let differ = host.iter().zip(&dispatch).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "{dev}: device dispatch vs host readback: {differ} of {} logits differ", host.len());
        let c = compare(&dispatch, &want, cfg.n_vocab);
        eprintln!("{dev}: IQ3_XXS/IQ4_NL experts vs the CPU backend: {c:?}");
        assert!(c.max_abs <= 0.6 && c.mean_abs <= 0.02 && c.max_flip_gap <= 0.05, "{dev}: {c:?}");
    }
);
