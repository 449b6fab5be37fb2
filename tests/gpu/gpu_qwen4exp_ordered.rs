//! The ordered-numerics mode on Flash-Next (`GpuOptions::ordered` on the device,
//! `SeqState::numerics` = `Ordered` on the CPU; the CLI's `--ordered`): the residual streams after every
//! layer (the traces) and the logits are bit-identical (`to_bits`) between the CPU backend and the device on
//! the public tiny-qwen4exp fixtures (f32, two-shard Q8_0), for prompts of one window, of
//! several windows and of 300 tokens (the QSA indexer's sparse selection), and for greedy
//! decode steps; the ordered CPU stays within its fast mode's tolerances of llama.cpp's
//! recorded logits. Runs as `<name>::emu` and `<name>::hip`.

use crate::models::models_qwen4exp::{argmax, compare, load_refs, model};
use strata::cpu::prelude::*;
use strata::gpu::model::GpuOptions;
use strata::gpu::qwen4exp::GpuQwen4Exp;
use strata::model::Logits;
use strata::model::qwen4exp::{KvType, Qwen4Exp, Trace};
use strata::test_device;

const F32: &str = "tiny-qwen4exp-public-f32.gguf";
const Q8: &str = "tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf";

/// `file` on the CPU (its sequences in the ordered mode: [`ordered`]).
fn cpu(file: &str) -> Qwen4Exp {
    model(file)
}

/// A fresh sequence of `c` in the ordered mode.
fn ordered(c: &Qwen4Exp, kv: KvType) -> strata::model::qwen4exp::SeqState {
    let mut st = c.new_state(kv);
    st.numerics = strata::engine::Numerics::Ordered;
    st
}

fn device(device: &strata::gpu::test_device::TestDevice, file: &str) -> GpuQwen4Exp {
    let (_, api) = device.clone();
    GpuQwen4Exp::new(model(file), api, GpuOptions { ordered: true, ..GpuOptions::default() })
        .unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Panics with the first differing element unless `a` and `b` are equal bit for bit.
pub(crate) fn assert_bits(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits()) {
        let n = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        panic!("{what}: {n} of {} differ, first at {i}: {} vs {}, max |diff| {worst}", a.len(), a[i], b[i]);
    }
}

test_device!(
    /// Prompt logits and every layer's residual streams of every reference sequence (8, 64 and 300 tokens:
    /// one window, 8 windows, 38 windows with sparse selection from position 40 on) on both
    /// fixtures: the device equals the ordered CPU bit for bit, and the ordered CPU is within
    /// the fast CPU's tolerances of llama.cpp's logits (f32 with f16 caches 1e-3; Q8_0 max 0.6,
    /// mean 0.02, argmax flips only where llama.cpp is nearly tied).
    model fn gpu_qwen4exp_ordered_prompts_equal_cpu(device_) {
        let dev = device_.0;
        for (file, variant) in [(F32, "f32"), (Q8, "q8_0-split")] {
            let (c, g) = (cpu(file), device(device_, file));
            let v = c.n_vocab();
            for s in load_refs(variant) {
                let what = format!("{dev} {variant} {} ({} tokens)", s.name, s.tokens.len());
                let (mut st, mut tr) = (ordered(&c, KvType::F16), Trace::default());
                let want = c.forward_traced(&mut st, &s.tokens, 0, Some(&mut tr)).unwrap();
                let mut sess = g.new_session(KvType::F16, 512).unwrap();
                sess.trace = Some(Vec::new());
                let mut got = Vec::new();
                g.eval(&mut sess, &s.tokens, Logits::All, &mut got).unwrap();
                let layers = sess.trace.take().unwrap();
                assert_eq!((layers.len(), tr.residuals.len()), (c.layers.len(), c.layers.len()), "{what}: traced layers");
                for (il, (a, b)) in layers.iter().zip(&tr.residuals).enumerate() {
                    assert_eq!(a.len(), s.tokens.len() * c.hp.hc * c.hp.n_embd, "{what}: layer {il}'s trace");
                    assert_bits(&format!("{what}: residual streams after layer {il}"), a, b);
                }
                assert_bits(&format!("{what}: logits"), &got, &want);
                let cmp = compare(&want, &s.logits.1, v);
                eprintln!("{what}: ordered CPU = device, against llama.cpp {cmp:?}");
                if variant == "f32" {
                    assert!(cmp.max_abs <= 1e-3, "{what}: {cmp:?}");
                } else {
                    assert!(cmp.max_abs <= 0.6 && cmp.mean_abs <= 0.02 && cmp.max_flip_gap <= 0.05, "{what}: {cmp:?}");
                }
            }
        }
    }
);

test_device!(
    /// Greedy generation (the prompt in one evaluation, then one token a window; 24 steps)
    /// gives the ordered CPU's tokens and, at every step, its logits and every layer's
    /// residual streams bit for bit, on both
    /// fixtures; on the f32 fixture they are also llama.cpp's greedy ids.
    model fn gpu_qwen4exp_ordered_greedy_equals_cpu(device_) {
        let dev = device_.0;
        for (file, variant) in [(F32, "f32"), (Q8, "q8_0-split")] {
            let (c, g) = (cpu(file), device(device_, file));
            let v = c.n_vocab();
            for s in load_refs(variant).into_iter().take(2) {
                let what = format!("{dev} {variant} {}", s.name);
                let n = s.greedy.len();
                let mut st = ordered(&c, KvType::F16);
                let mut sess = g.new_session(KvType::F16, 512).unwrap();
                let mut want = c.forward(&mut st, &s.tokens, 0).unwrap().split_off((s.tokens.len() - 1) * v);
                let mut got = Vec::new();
                g.eval(&mut sess, &s.tokens, Logits::Last, &mut got).unwrap();
                let mut ids = Vec::new();
                loop {
                    assert_bits(&format!("{what}: step {}", ids.len()), &got, &want);
                    ids.push(argmax(&want) as u32);
                    if ids.len() == n {
                        break;
                    }
                    let t = ids[ids.len() - 1];
                    let (pos, mut tr) = (st.pos, Trace::default());
                    want = c.forward_traced(&mut st, &[t], pos, Some(&mut tr)).unwrap();
                    sess.trace = Some(Vec::new());
                    g.eval(&mut sess, &[t], Logits::Last, &mut got).unwrap();
                    for (il, (a, b)) in sess.trace.take().unwrap().iter().zip(&tr.residuals).enumerate() {
                        assert_bits(&format!("{what}: step {}, residual streams after layer {il}", ids.len()), a, b);
                    }
                }
                if variant == "f32" {
                    assert_eq!(ids, s.greedy, "{what}: llama.cpp's greedy ids");
                }
                eprintln!("{what}: {n} greedy tokens equal");
            }
        }
    }
);

test_device!(
    /// The ordered mode keeps every expert resident: `--expert-cache N` below the expert count
    /// is refused with the reason (the cache's misses would run the CPU's fast products), and
    /// `auto` leaves no cache.
    model fn gpu_qwen4exp_ordered_refuses_an_expert_cache(device_) {
        use strata::gpu::model::ExpertCacheSize;
        let (_, api) = device_.clone();
        let opts = GpuOptions { ordered: true, expert_cache: Some(ExpertCacheSize::Slots(3)), ..GpuOptions::default() };
        let e = GpuQwen4Exp::new(model(F32), api, opts).err().expect("an expert cache with --ordered");
        assert!(e.to_string().contains("--ordered") && e.to_string().contains("--expert-cache 3"), "{e}");
        let (_, api) = device_.clone();
        let opts = GpuOptions { ordered: true, expert_cache: Some(ExpertCacheSize::Auto), ..GpuOptions::default() };
        let g = GpuQwen4Exp::new(model(F32), api, opts).unwrap();
        assert!(g.expert_cache().is_none() && g.opts().expert_cache.is_none(), "{:?}", g.opts());
    }
);

test_device!(
    /// With int8 caches (K, V and the indexer's keys quantized per row on both sides) the
    /// 300-token sequence's traces and logits are bit-identical too, on the f32 fixture.
    model fn gpu_qwen4exp_ordered_int8_cache_equals_cpu(device_) {
        let dev = device_.0;
        let (c, g) = (cpu(F32), device(device_, F32));
        let s = load_refs("f32").into_iter().nth(2).expect("seq3");
        let (mut st, mut tr) = (ordered(&c, KvType::Int8), Trace::default());
        let want = c.forward_traced(&mut st, &s.tokens, 0, Some(&mut tr)).unwrap();
        let mut sess = g.new_session(KvType::Int8, 512).unwrap();
        sess.trace = Some(Vec::new());
        let mut got = Vec::new();
        g.eval(&mut sess, &s.tokens, Logits::All, &mut got).unwrap();
        for (il, (a, b)) in sess.trace.take().unwrap().iter().zip(&tr.residuals).enumerate() {
            assert_bits(&format!("{dev} int8 {}: residual streams after layer {il}", s.name), a, b);
        }
        assert_bits(&format!("{dev} int8 {}: logits", s.name), &got, &want);
    }
);
