//! The MTP head on the device (`gpu::qwen4exp::GpuMtp`) against the CPU head (`MtpCpu`, which
//! tests/models/spec_mtp.rs and models_qwen4exp check against a plain f64 reference of the published
//! layout):
//! - the trunk's wide residuals read back with the logits (`eval_hidden`) equal the CPU's
//!   `forward_hidden` within the fast mode's tolerance;
//! - given the same wide residuals, the device head's logits and output streams equal the CPU
//!   head's within that tolerance: real pairs in windows of up to 8 (12 pairs: two windows),
//!   a chained step on its own output, and again after a truncation (cells overwritten);
//!   F32 and Q8_0 heads (Q8_0: experts by device dispatch), own output mixer or the model's,
//!   own tables or the model's;
//! - speculative decoding with the device head drafting for the device trunk prints the plain
//!   greedy ids (lossless), accepts every draft of the echo head on the public-shape model as
//!   the CPU head does, and rolls back the random head's drafts.

use std::path::PathBuf;

use strata::cpu::prelude::*;
use strata::gpu::model::GpuOptions;
use strata::gpu::qwen4exp::{GpuMtp, GpuMtpHead, GpuQwen4Exp};
use strata::model::Logits;
use strata::model::qwen4exp::{KvType, Mtp, Qwen4Exp};
use strata::spec::{MtpDrafter, MtpHead, SpecConfig, generate_greedy_spec};
use strata::synth::qwen4exp::{SynthConfig, SynthMtp, write, write_mtp};
use strata::test_device;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-gpu-mtp-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// A synthetic trunk and head (written once per name), opened twice: for the CPU and for the
/// device.
fn synth(what: &str, cfg: &SynthConfig, head: &SynthMtp, seed: u64) -> (Qwen4Exp, Mtp, PathBuf, PathBuf) {
    let trunk = tmp(&format!("{what}-trunk"));
    let paths = write(cfg, seed, &trunk, false).unwrap();
    let mp = tmp(&format!("{what}-mtp.gguf"));
    write_mtp(cfg, head, seed + 100, &mp).unwrap();
    let m = Qwen4Exp::open(&paths[0]).unwrap();
    let h = Mtp::open(&m, &mp).unwrap_or_else(|e| panic!("{what}: {e}"));
    (m, h, paths[0].clone(), mp)
}

/// Largest |a - b| over the largest |b| (at least 1).
fn rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn argmaxes(l: &[f32], v: usize) -> Vec<usize> {
    l.chunks_exact(v).map(|r| r.iter().enumerate().fold(0, |b, (i, x)| if *x > r[b] { i } else { b })).collect()
}

test_device!(
    /// Device head = CPU head on the same inputs (see the module docs).
    model fn gpu_mtp_head_matches_cpu_head(device) {
        let dev = device.0;
        let mut public = SynthConfig::public();
        public.tied = true;
        let mut tiny_q8 = SynthConfig::tiny();
        tiny_q8.matrix_type = quant::GgmlType::Q8_0;
        let q8_head = SynthMtp { matrix_type: quant::GgmlType::Q8_0, ratio: 2, own_tables: true, ..SynthMtp::default() };
        let no_hc_head = SynthMtp { hc_head: false, ..SynthMtp::default() };
        // (case, trunk, head, tolerance on logits and streams relative to their largest value)
        for (what, cfg, head, tol) in [
            ("public-f32", &public, SynthMtp::default(), 2e-4f32),
            ("public-f32-model-mixer", &public, no_hc_head, 2e-4),
            ("tiny-q8_0-own", &tiny_q8, q8_head, 2e-2),
        ] {
            let (m, h, trunk, head_path) = synth(what, cfg, &head, 7);
            let v = m.hp.n_vocab;
            let w = h.width();
            let prompt: Vec<u32> = (0..13u32).map(|i| (i * 37 + 5) % v as u32).collect();
            // The trunk's wide residuals, CPU and device.
            let (_, want_hidden) = m.forward_hidden(&mut m.new_state(KvType::F16), &prompt, 0).unwrap();
            let (_, api) = device.clone();
            let g = GpuQwen4Exp::new(Qwen4Exp::open(&trunk).unwrap(), api, GpuOptions::default()).unwrap();
            let mut sess = g.new_session(KvType::F16, 64).unwrap();
            let (mut logits, mut hidden) = (Vec::new(), Vec::new());
            g.eval_hidden(&mut sess, &prompt, Logits::Last, &mut logits, Some(&mut hidden)).unwrap();
            let r = rel(&hidden, &want_hidden);
            eprintln!("{dev} {what}: trunk wide residuals rel {r:.2e}");
            assert!(r <= tol, "{dev} {what}: trunk wide residuals differ by {r:.2e} (tolerance {tol:.0e})");
            assert_eq!(logits.len(), v);

            // The head: 12 real pairs (two windows on the device), a chained step, a truncation.
            let gh = GpuMtp::new(&g, Mtp::open(&g.m, &head_path).unwrap()).unwrap();
            let mut dh = GpuMtpHead::new(&gh, KvType::F16, 64).unwrap();
            let mut ch = strata::spec::CpuMtpHead::new(&m, &h, KvType::F16);
            let pairs = 12;
            let (toks, wide) = (&prompt[1..=pairs], &want_hidden[..pairs * w]);
            let step = |dh: &mut GpuMtpHead, ch: &mut strata::spec::CpuMtpHead, t: &[u32], x: &[f32], tag: &str| {
                let got = dh.forward(t, x, true).unwrap();
                let want = ch.forward(t, x, true).unwrap();
                let (rl, rh) = (rel(&got.logits, &want.logits), rel(&got.hidden, &want.hidden));
                eprintln!("{dev} {what} {tag}: logits rel {rl:.2e}, streams rel {rh:.2e}");
                assert!(rl <= tol && rh <= tol, "{dev} {what} {tag}: logits {rl:.2e}, streams {rh:.2e} (tolerance {tol:.0e})");
                if tol < 1e-3 {
                    assert_eq!(argmaxes(&got.logits, v), argmaxes(&want.logits, v), "{dev} {what} {tag}: drafts differ");
                }
                want.hidden
            };
            let out = step(&mut dh, &mut ch, toks, wide, "12 real pairs");
            let last = &out[(pairs - 1) * w..];
            step(&mut dh, &mut ch, &[prompt[0]], last, "chained step");
            assert_eq!(dh.cells(), pairs + 1);
            dh.truncate(5);
            ch.truncate(5);
            step(&mut dh, &mut ch, &toks[5..9], &wide[5 * w..9 * w], "after truncation to 5 cells");
            // Bad input is an error, not a fault.
            assert!(dh.forward(&[v as u32], &wide[..w], false).is_err(), "{dev}: a token beyond the vocabulary");
            assert!(dh.forward(&[1], &wide[..w - 1], false).is_err(), "{dev}: a short wide residual");
        }
    }
);

test_device!(
    /// Speculative decoding with the device head drafting for the device trunk is lossless, the
    /// echo head's drafts are all accepted (as on the CPU), a random head's are rolled back.
    model fn gpu_mtp_speculative_equals_greedy(device) {
        let dev = device.0;
        let mut public = SynthConfig::public();
        public.tied = true;
        let mut tiny_q8 = SynthConfig::tiny();
        tiny_q8.matrix_type = quant::GgmlType::Q8_0;
        tiny_q8.tied = true;
        let echo = SynthMtp { echo: true, ..SynthMtp::default() };
        let random_q8 = SynthMtp { matrix_type: quant::GgmlType::Q8_0, ..SynthMtp::default() };
        for (what, cfg, head, full_acceptance) in [("public-f32-echo", &public, echo, true), ("tiny-q8_0-random", &tiny_q8, random_q8, false)] {
            let (m, h, trunk, head_path) = synth(what, cfg, &head, 11);
            let nv = cfg.n_vocab as u32;
            let prompt: Vec<u32> = (0..16u32).map(|i| (i.wrapping_mul(2_654_435_761) % nv).max(3)).collect();
            let n = 32;
            let (_, api) = device.clone();
            let g = GpuQwen4Exp::new(Qwen4Exp::open(&trunk).unwrap(), api, GpuOptions::default()).unwrap();
            // The CPU trunk through the engine's interface, for the side-by-side run.
            let cpu = strata::cpu::CpuQwen4Exp(Qwen4Exp::open(&trunk).unwrap());
            let plain = crate::gpu::gpu_qwen4exp::greedy(&g, &prompt, n).0;
            let cpu_plain = m.generate_greedy(&mut m.new_state(KvType::F16), &prompt, n).unwrap();
            eprintln!("{dev} {what}: device greedy {} CPU greedy", if plain == cpu_plain { "==" } else { "!=" });
            let gh = GpuMtp::new(&g, Mtp::open(&g.m, &head_path).unwrap()).unwrap();
            for n_draft in [1usize, 4, 8] {
                let cfg = SpecConfig { n_draft, min_p: 0.0 };
                let mut d = MtpDrafter::with_head(GpuMtpHead::new(&gh, KvType::F16, 128).unwrap(), 0.0);
                let mut sess: Box<dyn strata::engine::Session> = Box::new(g.new_session(KvType::F16, 128).unwrap());
                let loaded: &dyn strata::engine::LoadedModel = &g;
                let (ids, s) = generate_greedy_spec(loaded, &mut sess, &prompt, n, &mut d, cfg).unwrap();
                assert_eq!(ids, plain, "{dev} {what} N={n_draft}: ids differ from plain greedy ({s:?})");
                assert_eq!(sess.n_past(), prompt.len() + n - 1, "{dev} {what} N={n_draft}: position");
                assert_eq!((d.stats.desyncs, d.stats.errors), (0, 0), "{dev} {what} N={n_draft}: {:?}", d.stats);
                // The CPU head drafting for the CPU trunk, side by side.
                let mut cd = MtpDrafter::new(&m, &h, KvType::F16, 0.0);
                let mut cpu_sess = crate::support::session(&cpu, KvType::F16, 128);
                let loaded: &dyn strata::engine::LoadedModel = &cpu;
                let (_, cs) = generate_greedy_spec(loaded, &mut cpu_sess, &prompt, n, &mut cd, cfg).unwrap();
                eprintln!("{dev} {what} N={n_draft}: device {}/{} drafts accepted, {} rollbacks; CPU {}/{}", s.accepted, s.drafted, s.rollbacks, cs.accepted, cs.drafted);
                assert!(s.drafted > 0, "{dev} {what} N={n_draft}: {s:?}");
                if full_acceptance {
                    assert_eq!((s.accepted, s.rollbacks), (s.drafted, 0), "{dev} {what} N={n_draft}: {s:?}");
                    assert_eq!((s.accepted, s.drafted), (cs.accepted, cs.drafted), "{dev} {what} N={n_draft}: the CPU head's counts");
                } else {
                    assert!(s.rollbacks > 0, "{dev} {what} N={n_draft}: {s:?}");
                }
            }
        }
    }
);

test_device!(
    /// Head windows with Q8_0 experts (device dispatch: nothing reads back) are captured as graphs
    /// once per window size and replayed; the logits and output streams equal eager launches bit
    /// for bit over real pairs (windows of 8 and 4), chained steps and a truncation.
    model fn gpu_mtp_head_graph_replay_equals_eager(device) {
        let dev = device.0;
        let mut cfg = SynthConfig::tiny();
        cfg.matrix_type = quant::GgmlType::Q8_0;
        let head = SynthMtp { matrix_type: quant::GgmlType::Q8_0, ..SynthMtp::default() };
        let (m, h, trunk, head_path) = synth("graphs-q8_0", &cfg, &head, 9);
        let w = h.width();
        let prompt: Vec<u32> = (0..13u32).map(|i| (i * 41 + 3) % cfg.n_vocab as u32).collect();
        let (_, wide) = m.forward_hidden(&mut m.new_state(KvType::F16), &prompt, 0).unwrap();
        let run = |graphs: bool| {
            let (_, api) = device.clone();
            let g = GpuQwen4Exp::new(Qwen4Exp::open(&trunk).unwrap(), api, GpuOptions { graphs, ..GpuOptions::default() }).unwrap();
            let gh = GpuMtp::new(&g, Mtp::open(&g.m, &head_path).unwrap()).unwrap();
            let mut dh = GpuMtpHead::new(&gh, KvType::F16, 64).unwrap();
            let mut bits = Vec::new();
            let mut keep = |o: strata::model::qwen4exp::mtp::MtpOut| {
                bits.extend(o.logits.iter().chain(&o.hidden).map(|x| x.to_bits()));
                o.hidden
            };
            let out = keep(dh.forward(&prompt[1..13], &wide[..12 * w], true).unwrap());
            let mut last = out[11 * w..].to_vec();
            for t in [5u32, 6, 7] {
                last = keep(dh.forward(&[t], &last, false).unwrap());
            }
            dh.truncate(4);
            keep(dh.forward(&prompt[5..9], &wide[4 * w..8 * w], true).unwrap());
            (bits, dh.windows())
        };
        let (eager, (r0, e0)) = run(false);
        let (graph, (r1, e1)) = run(true);
        assert_eq!((r0, e0), (0, 6), "{dev}: graphs off: every head window eager");
        assert_eq!((r1, e1), (6, 0), "{dev}: graphs on: every head window replayed");
        let differ = eager.iter().zip(&graph).filter(|(a, b)| a != b).count();
        assert_eq!((differ, eager.len()), (0, graph.len()), "{dev}: graph replay vs eager launches");
    }
);

test_device!(
    /// In the ordered mode (`GpuOptions::ordered`, `SeqState::numerics` = `Ordered`) the device head equals
    /// the CPU head bit for bit: the trunk's wide residuals, then the head's logits and output
    /// streams for 12 real pairs (two windows) and a chained step; F32 and Q8_0 heads.
    model fn gpu_mtp_head_ordered_equals_cpu_head_bitwise(device) {
        let dev = device.0;
        let mut public = SynthConfig::public();
        public.tied = true;
        let mut tiny_q8 = SynthConfig::tiny();
        tiny_q8.matrix_type = quant::GgmlType::Q8_0;
        let q8_head = SynthMtp { matrix_type: quant::GgmlType::Q8_0, ratio: 2, own_tables: true, ..SynthMtp::default() };
        for (what, cfg, head) in [("ordered-public-f32", &public, SynthMtp::default()), ("ordered-tiny-q8_0-own", &tiny_q8, q8_head)] {
            let (m, h, trunk, head_path) = synth(what, cfg, &head, 7);
            let mut ordered_state = m.new_state(KvType::F16);
            ordered_state.numerics = strata::engine::Numerics::Ordered;
            let (v, w) = (m.hp.n_vocab, h.width());
            let prompt: Vec<u32> = (0..13u32).map(|i| (i * 37 + 5) % v as u32).collect();
            let (want_logits, want_hidden) = m.forward_hidden(&mut ordered_state, &prompt, 0).unwrap();
            let (_, api) = device.clone();
            let g = GpuQwen4Exp::new(Qwen4Exp::open(&trunk).unwrap(), api, GpuOptions { ordered: true, ..GpuOptions::default() }).unwrap();
            let mut sess = g.new_session(KvType::F16, 64).unwrap();
            let (mut logits, mut hidden) = (Vec::new(), Vec::new());
            g.eval_hidden(&mut sess, &prompt, Logits::All, &mut logits, Some(&mut hidden)).unwrap();
            let same = |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same(&hidden, &want_hidden), "{dev} {what}: trunk wide residuals differ");
            assert!(same(&logits, &want_logits), "{dev} {what}: trunk logits differ");
            let gh = GpuMtp::new(&g, Mtp::open(&g.m, &head_path).unwrap()).unwrap();
            let mut dh = GpuMtpHead::new(&gh, KvType::F16, 64).unwrap();
            let mut ch = strata::spec::CpuMtpHead::with_numerics(&m, &h, KvType::F16, strata::engine::Numerics::Ordered);
            let pairs = 12;
            let got = dh.forward(&prompt[1..=pairs], &want_hidden[..pairs * w], true).unwrap();
            let want = ch.forward(&prompt[1..=pairs], &want_hidden[..pairs * w], true).unwrap();
            assert!(same(&got.logits, &want.logits) && same(&got.hidden, &want.hidden), "{dev} {what}: 12 pairs: logits rel {:.2e}, streams rel {:.2e}", rel(&got.logits, &want.logits), rel(&got.hidden, &want.hidden));
            let last = &want.hidden[(pairs - 1) * w..];
            let got = dh.forward(&[prompt[0]], last, true).unwrap();
            let want = ch.forward(&[prompt[0]], last, true).unwrap();
            assert!(same(&got.logits, &want.logits) && same(&got.hidden, &want.hidden), "{dev} {what}: chained step");
            eprintln!("{dev} {what}: trunk and head bit-identical");
        }
    }
);

test_device!(
    /// Drafting without leaving the device (`GpuMtpHead::forward_top` / `chain`): the greedy
    /// token of the head's last row is taken by `logits_top` and a chained step reads the head's
    /// own output streams where they are; only the token and its probability come back. Over
    /// real pairs and three chained steps, the tokens equal the host path's (logits and streams
    /// read back, argmax here) and the probabilities agree within 1e-5.
    model fn gpu_mtp_drafts_on_the_device_equal_the_host_path(device) {
        let dev = device.0;
        let mut cfg = SynthConfig::tiny();
        cfg.matrix_type = quant::GgmlType::Q8_0;
        let head = SynthMtp { matrix_type: quant::GgmlType::Q8_0, ..SynthMtp::default() };
        let (m, h, trunk, head_path) = synth("device-drafts", &cfg, &head, 13);
        let (w, v) = (h.width(), cfg.n_vocab);
        let prompt: Vec<u32> = (0..11u32).map(|i| (i * 29 + 7) % v as u32).collect();
        let (_, wide) = m.forward_hidden(&mut m.new_state(KvType::F16), &prompt, 0).unwrap();
        let (_, api) = device.clone();
        let g = GpuQwen4Exp::new(Qwen4Exp::open(&trunk).unwrap(), api, GpuOptions::default()).unwrap();
        let gh = GpuMtp::new(&g, Mtp::open(&g.m, &head_path).unwrap()).unwrap();
        let top = |l: &[f32]| {
            let t = argmaxes(l, v)[0];
            let sum: f64 = l.iter().map(|&x| ((x - l[t]) as f64).exp()).sum();
            (t as u32, (1.0 / sum) as f32)
        };
        // Host path: logits and streams back, argmax here.
        let mut host = GpuMtpHead::new(&gh, KvType::F16, 64).unwrap();
        let o = host.forward(&prompt[1..11], &wide[..10 * w], false).unwrap();
        let mut want = vec![top(&o.logits)];
        let mut last = o.hidden[9 * w..].to_vec();
        for _ in 0..3 {
            let o = host.forward(&[want.last().unwrap().0], &last, false).unwrap();
            want.push(top(&o.logits));
            last = o.hidden;
        }
        // Device path.
        let mut dh = GpuMtpHead::new(&gh, KvType::F16, 64).unwrap();
        let mut got = vec![dh.forward_top(&prompt[1..11], &wide[..10 * w]).unwrap()];
        for _ in 0..3 {
            got.push(dh.chain(got.last().unwrap().0).unwrap());
        }
        eprintln!("{dev}: device drafts {got:?}, host {want:?}");
        assert_eq!(got.iter().map(|d| d.0).collect::<Vec<_>>(), want.iter().map(|d| d.0).collect::<Vec<_>>(), "{dev}: draft tokens");
        assert!(got.iter().zip(&want).all(|(a, b)| (a.1 - b.1).abs() <= 1e-5), "{dev}: probabilities {got:?} vs {want:?}");
        assert_eq!(dh.cells(), host.cells(), "{dev}: the same cells used");
        // A chain needs a head window before it.
        dh.truncate(2);
        assert!(dh.chain(1).unwrap_err().to_string().contains("without a head window"), "{dev}");
    }
);
