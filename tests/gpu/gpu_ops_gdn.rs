//! The Gated DeltaNet mixer on the device (`GpuOps::gdn_mix`: conv + SiLU, q/k L2 norms, the
//! delta rule, the gated norm) against the CPU's `Gdn::mix`, the implementation that matches
//! llama.cpp on the tiny-qwen4exp fixtures. The order of every sum is the CPU's; the device's
//! exp/softplus/sigmoid are `quant::fmath`'s (within 2 ulp of libm), hence `GDN_TOL`. A window
//! of up to 8 tokens must equal the same tokens one launch at a time bit for bit, and the state
//! carries across calls. Runs as `<name>::emu` and `<name>::hip` through `test_device!`.

use crate::gpu::gpu_ops::*;
use strata::cpu::prelude::*;
use strata::cpu::qwen4exp::Numerics;
use strata::gpu::ops::{GdnBuffers, GdnDeviceState, GdnShape, GpuOps};
use strata::model::Mat;
use strata::model::qwen4exp::gdn::{Gdn, GdnMode, GdnState};
use strata::rng::SplitMix64;
use strata::test_device;

/// Device against CPU, relative with a floor of 1 (outputs and states are O(1)); shared with
/// `strata device --selftest`.
const GDN_TOL: f32 = strata::kernel_tools::selftest::reference::GDN_TOL as f32;

fn unused() -> Mat {
    Mat::from_f32(1, 1, &[0.0]).expect("1x1")
}

/// A GDN layer with random constants (the projections are not part of the mixer).
fn layer(rng: &mut SplitMix64, hk: usize, hv: usize, s: usize, k: usize) -> Gdn {
    let c = (2 * hk + hv) * s;
    Gdn {
        hk,
        hv,
        s,
        conv_k: k,
        eps: 1e-6,
        qkv: unused(),
        gate: unused(),
        conv: rng.symmetric_vec(c * k, 0.6),
        dt_bias: (0..hv).map(|_| -1.0 + 0.5 * rng.symmetric()).collect(),
        a: (0..hv).map(|_| -(rng.symmetric()).exp()).collect(),
        beta: unused(),
        alpha: unused(),
        norm: (0..s).map(|_| 1.0 + 0.1 * rng.symmetric()).collect(),
        out: unused(),
    }
}

fn shape(g: &Gdn) -> GdnShape {
    GdnShape { hk: g.hk as u32, hv: g.hv as u32, head_dim: g.s as u32, conv_k: g.conv_k as u32, eps: g.eps }
}

fn max_rel(dev: &str, what: &str, got: &[f32], want: &[f32]) -> f32 {
    assert_rel_floor1(dev, what, got, want, GDN_TOL)
}

/// The device side of one sequence: constants and state uploaded once, inputs per call.
struct DevLayer<'a> {
    ops: &'a GpuOps,
    shape: GdnShape,
    consts: [Buf<'a>; 4],
    conv_state: Buf<'a>,
    delta_state: Buf<'a>,
}

impl<'a> DevLayer<'a> {
    fn new(ops: &'a GpuOps, g: &Gdn, st: &GdnState) -> DevLayer<'a> {
        DevLayer {
            ops,
            shape: shape(g),
            consts: [upf(ops, &g.conv), upf(ops, &g.dt_bias), upf(ops, &g.a), upf(ops, &g.norm)],
            conv_state: upf(ops, &st.conv),
            delta_state: upf(ops, &st.m),
        }
    }
    /// Runs `n` tokens; returns `o [n][Hv S]`.
    fn mix(&self, m: &[f32], z: &[f32], beta: &[f32], alpha: &[f32], n: usize) -> Vec<f32> {
        self.run(m, z, beta, alpha, n, None)
    }
    /// Runs `n` tokens with every sum in the CPU's order (`gdn_mix_in_order`, the ordered mode).
    fn mix_in_order(&self, m: &[f32], z: &[f32], beta: &[f32], alpha: &[f32], n: usize) -> Vec<f32> {
        self.run(m, z, beta, alpha, n, Some(0))
    }
    /// Runs a prompt of `n` tokens through the chunked kernel (`chunk` > 0).
    fn prefill(&self, m: &[f32], z: &[f32], beta: &[f32], alpha: &[f32], n: usize, chunk: usize) -> Vec<f32> {
        self.run(m, z, beta, alpha, n, Some(chunk))
    }
    fn run(&self, m: &[f32], z: &[f32], beta: &[f32], alpha: &[f32], n: usize, chunk: Option<usize>) -> Vec<f32> {
        let ops = self.ops;
        let (mb, zb, bb, ab) = (upf(ops, m), upf(ops, z), upf(ops, beta), upf(ops, alpha));
        let c = self.shape.channels() as usize;
        let vd = (self.shape.hv * self.shape.head_dim) as usize;
        let (u, o) = (zeros(ops, n * c * 4), zeros(ops, n * vd * 4));
        let b = GdnBuffers {
            m: mb.ptr,
            z: zb.ptr,
            beta: bb.ptr,
            alpha: ab.ptr,
            taps: self.consts[0].ptr,
            dt_bias: self.consts[1].ptr,
            ssm_a: self.consts[2].ptr,
            norm: self.consts[3].ptr,
            conv_state: self.conv_state.ptr,
            delta_state: self.delta_state.ptr,
            u: u.ptr,
            o: o.ptr,
            o_q8_1: 0,
        };
        match chunk {
            Some(0) => {
                ops.gdn_mix_in_order(&S, &self.shape, &b, n as u32).expect("gdn_mix_in_order");
                o.f32s()
            }
            Some(ch) => {
                let delta = zeros(ops, 2 * (self.shape.hv * self.shape.head_dim) as usize * ch * 4);
                ops.gdn_prefill(&S, &self.shape, &b, n as u32, ch as u32, delta.ptr).expect("gdn_prefill");
                o.f32s()
            }
            None => {
                ops.gdn_mix(&S, &self.shape, &b, n as u32).expect("gdn_mix");
                o.f32s()
            }
        }
    }
}

/// Random per-token inputs of `n` tokens: (m, z, beta logits, alpha logits).
fn inputs(rng: &mut SplitMix64, g: &Gdn, n: usize) -> [Vec<f32>; 4] {
    let c = (2 * g.hk + g.hv) * g.s;
    [
        rng.symmetric_vec(n * c, 2.0),
        rng.symmetric_vec(n * g.hv * g.s, 3.0),
        rng.symmetric_vec(n * g.hv, 3.0),
        rng.symmetric_vec(n * g.hv, 2.0),
    ]
}

test_device!(
    fn gpu_ops_gdn_mix_matches_cpu(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x6d4);
        // (Hk, Hv, S, K): the fixtures' two layer shapes, Hv not a multiple of Hk, the real
        // head dim of Flash-Next (128) with a state wider than one work-item a column.
        for (hk, hv, s, k) in [(2usize, 4usize, 32usize, 4usize), (1, 2, 32, 3), (2, 3, 16, 2), (1, 2, 128, 4), (1, 1, 8, 1)] {
            let g = layer(&mut rng, hk, hv, s, k);
            let mut st = g.new_state();
            // A state as after earlier tokens.
            st.conv = rng.symmetric_vec(st.conv.len(), 1.5);
            st.m = rng.symmetric_vec(st.m.len(), 0.3);
            let dl = DevLayer::new(ops, &g, &st);
            let mut worst = 0f32;
            for (call, n) in [1usize, 8, 3, 1].into_iter().enumerate() {
                let [m, z, b, a] = inputs(&mut rng, &g, n);
                let want = g.mix(&m, &z, &b, &a, n, &mut st, GdnMode::Recurrent);
                let got = dl.mix(&m, &z, &b, &a, n);
                let what = format!("Hk={hk} Hv={hv} S={s} K={k} call {call} ({n} tokens)");
                worst = worst.max(max_rel(dev, &format!("{what}: o"), &got, &want));
                worst = worst.max(max_rel(dev, &format!("{what}: conv state"), &dl.conv_state.f32s(), &st.conv));
                worst = worst.max(max_rel(dev, &format!("{what}: delta state"), &dl.delta_state.f32s(), &st.m));
            }
            println!("{dev} gdn_mix Hk={hk} Hv={hv} S={s} K={k}: worst relative error {worst:e} (tolerance {GDN_TOL:e})");
        }
    }
);

test_device!(
    /// The ordered mode's mixer (`gdn_mix_in_order`) equals the CPU's `Gdn::mix_with` in
    /// `Numerics::Ordered` (`quant::fmath`'s exp, softplus, sigmoid, SiLU) bit for bit, outputs
    /// and states, at every head dim (128 included, where the fast mode adds two halves).
    fn gpu_ops_gdn_mix_in_order_equals_cpu_ordered_bitwise(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x0d4);
        for (hk, hv, s, k) in [(2usize, 4usize, 32usize, 4usize), (2, 3, 16, 2), (1, 2, 128, 4), (1, 1, 8, 1)] {
            let g = layer(&mut rng, hk, hv, s, k);
            let mut st = g.new_state();
            st.conv = rng.symmetric_vec(st.conv.len(), 1.5);
            st.m = rng.symmetric_vec(st.m.len(), 0.3);
            let dl = DevLayer::new(ops, &g, &st);
            for (call, n) in [1usize, 8, 3].into_iter().enumerate() {
                let [m, z, b, a] = inputs(&mut rng, &g, n);
                let want = g.mix_with(Numerics::Ordered, &m, &z, &b, &a, n, &mut st, GdnMode::Recurrent);
                let got = dl.mix_in_order(&m, &z, &b, &a, n);
                let what = format!("Hk={hk} Hv={hv} S={s} K={k} call {call} ({n} tokens)");
                assert_bits(dev, &format!("{what}: o"), &got, &want);
                assert_bits(dev, &format!("{what}: conv state"), &dl.conv_state.f32s(), &st.conv);
                assert_bits(dev, &format!("{what}: delta state"), &dl.delta_state.f32s(), &st.m);
            }
        }
    }
);

test_device!(
    fn gpu_ops_gdn_window_equals_single_tokens_bitwise(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x77);
        // The generic kernel (S = 32) and the register-state one (S = 128).
        for s in [32, 128] {
        let g = layer(&mut rng, 2, 4, s, 4);
        let mut st = g.new_state();
        st.m = rng.symmetric_vec(st.m.len(), 0.3);
        let (window, single) = (DevLayer::new(ops, &g, &st), DevLayer::new(ops, &g, &st));
        let n = 8;
        let [m, z, b, a] = inputs(&mut rng, &g, n);
        let got = window.mix(&m, &z, &b, &a, n);
        let (c, vd) = ((2 * g.hk + g.hv) * g.s, g.hv * g.s);
        let mut want = Vec::new();
        for t in 0..n {
            let r = |v: &[f32], w: usize| v[t * w..(t + 1) * w].to_vec();
            want.extend(single.mix(&r(&m, c), &r(&z, vd), &r(&b, g.hv), &r(&a, g.hv), 1));
        }
        assert_bits(dev, &format!("S={s}: 8-token window vs 8 single tokens: o"), &got, &want);
        assert_bits(dev, &format!("S={s}: conv state"), &window.conv_state.f32s(), &single.conv_state.f32s());
        assert_bits(dev, &format!("S={s}: delta state"), &window.delta_state.f32s(), &single.delta_state.f32s());
        }
    }
);

test_device!(
    /// Speculative rollback: snapshot the state, run a window, restore, run other tokens: the
    /// outputs and state equal a sequence that never ran the rejected window, bit for bit.
    fn gpu_ops_gdn_state_snapshot_and_restore(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x5a);
        for s in [32usize, 128] {
            let g = layer(&mut rng, 1, 2, s, 4);
            let mut st = g.new_state();
            st.m = rng.symmetric_vec(st.m.len(), 0.3);
            let (spec, plain) = (DevLayer::new(ops, &g, &st), DevLayer::new(ops, &g, &st));
            let snap = DevLayer::new(ops, &g, &g.new_state());
            let [m0, z0, b0, a0] = inputs(&mut rng, &g, 2);
            let [m1, z1, b1, a1] = inputs(&mut rng, &g, 4);
            let [m2, z2, b2, a2] = inputs(&mut rng, &g, 3);
            let _ = spec.mix(&m0, &z0, &b0, &a0, 2);
            let _ = plain.mix(&m0, &z0, &b0, &a0, 2);
            let state = |l: &DevLayer| GdnDeviceState { conv: l.conv_state.ptr, delta: l.delta_state.ptr };
            ops.gdn_state_copy(&S, &spec.shape, state(&spec), state(&snap)).unwrap();
            let _ = spec.mix(&m1, &z1, &b1, &a1, 4); // the rejected drafts
            ops.gdn_state_copy(&S, &spec.shape, state(&snap), state(&spec)).unwrap();
            let got = spec.mix(&m2, &z2, &b2, &a2, 3);
            let want = plain.mix(&m2, &z2, &b2, &a2, 3);
            assert_bits(dev, &format!("S={s}: o after the restore"), &got, &want);
            assert_bits(dev, &format!("S={s}: delta state"), &spec.delta_state.f32s(), &plain.delta_state.f32s());
            assert_bits(dev, &format!("S={s}: conv state"), &spec.conv_state.f32s(), &plain.conv_state.f32s());
        }
    }
);

/// Device chunked against the recurrence (llama.cpp's order) on the CPU: the sums are
/// reassociated (a chunk's state update and forward substitution instead of token by token), so
/// `|gpu − cpu| <= GDN_CHUNK_TOL · max(1, |cpu|)`, over prompts of several chunks.
const GDN_CHUNK_TOL: f32 = 2e-5;

test_device!(
    /// The chunked prefill form: equal to the CPU's chunked form within GDN_TOL (same sums,
    /// fmath's exp), to the token-by-token recurrence within GDN_CHUNK_TOL, and a decode window
    /// after it continues from the state it left.
    fn gpu_ops_gdn_prefill_chunked_matches_cpu(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0xc4);
        for ((hk, hv, s, k), n, chunk) in [((2usize, 4usize, 32usize, 4usize), 100usize, 16usize), ((1, 2, 128, 4), 70, 64), ((2, 3, 16, 2), 37, 5), ((1, 1, 8, 1), 9, 1)] {
            let g = layer(&mut rng, hk, hv, s, k);
            let mut st = g.new_state();
            st.conv = rng.symmetric_vec(st.conv.len(), 1.5);
            st.m = rng.symmetric_vec(st.m.len(), 0.3);
            let mut st_rec = st.clone();
            let dl = DevLayer::new(ops, &g, &st);
            let [m, z, b, a] = inputs(&mut rng, &g, n);
            let got = dl.prefill(&m, &z, &b, &a, n, chunk);
            let want = g.mix(&m, &z, &b, &a, n, &mut st, GdnMode::Chunked(chunk));
            let rec = g.mix(&m, &z, &b, &a, n, &mut st_rec, GdnMode::Recurrent);
            let what = format!("Hk={hk} Hv={hv} S={s} K={k}, {n} tokens in chunks of {chunk}");
            let worst = max_rel(dev, &format!("{what}: o vs CPU chunked"), &got, &want);
            max_rel(dev, &format!("{what}: delta state vs CPU chunked"), &dl.delta_state.f32s(), &st.m);
            let worst_rec = assert_rel_floor1(dev, &format!("{what}: o vs the recurrence"), &got, &rec, GDN_CHUNK_TOL);
            let worst_state = assert_rel_floor1(dev, &format!("{what}: state vs the recurrence"), &dl.delta_state.f32s(), &st_rec.m, GDN_CHUNK_TOL);
            // Decode continues from the prefilled state.
            let [m1, z1, b1, a1] = inputs(&mut rng, &g, 3);
            let got = dl.mix(&m1, &z1, &b1, &a1, 3);
            let want = g.mix(&m1, &z1, &b1, &a1, 3, &mut st, GdnMode::Recurrent);
            max_rel(dev, &format!("{what}: decode after the prefill"), &got, &want);
            println!("{dev} gdn_prefill {what}: vs CPU chunked {worst:e} (tolerance {GDN_TOL:e}); vs the recurrence: o {worst_rec:e}, state {worst_state:e} (tolerance {GDN_CHUNK_TOL:e})");
        }
    }
);

test_device!(
    fn gpu_ops_gdn_refuses_unsupported_shapes(ops) {
        let z = GdnBuffers { m: 0, z: 0, beta: 0, alpha: 0, taps: 0, dt_bias: 0, ssm_a: 0, norm: 0, conv_state: 0, delta_state: 0, u: 0, o: 0, o_q8_1: 0 };
        let ok = GdnShape { hk: 1, hv: 1, head_dim: 8, conv_k: 2, eps: 1e-6 };
        for (shape, n, what) in [(ok, 0u32, "0 tokens"), (ok, 9, "9 tokens"), (GdnShape { head_dim: 0, ..ok }, 1, "head dim 0"), (GdnShape { conv_k: 0, ..ok }, 1, "conv width 0")] {
            let e = ops.gdn_mix(&S, &shape, &z, n).expect_err(what).to_string();
            assert!(e.contains("gdn"), "{what}: {e}");
        }
        for (n, chunk, what) in [(0u32, 16u32, "an empty prompt"), (4097, 16, "a prompt past the limit"), (64, 0, "chunk 0"), (64, 65, "chunk 65")] {
            let e = ops.gdn_prefill(&S, &ok, &z, n, chunk, 0).expect_err(what).to_string();
            assert!(e.contains("gdn"), "{what}: {e}");
        }
        // The chunked kernel stages rows of k and q in LDS: head dims up to 256.
        let wide = GdnShape { head_dim: 264, ..ok };
        let e = ops.gdn_prefill(&S, &wide, &z, 64, 16, 0).expect_err("head dim 264").to_string();
        assert!(e.contains("head dim 264") && e.contains("256"), "{e}");
    }
);
