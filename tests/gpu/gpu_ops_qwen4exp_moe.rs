//! Flash-Next's MoE FFN with its device kernels against the CPU's `qwen4exp::moe::Moe::forward`:
//! router (`moe_router`, 512 experts top-10 renormalised), the routed experts' outputs combined
//! on the device (`moe_combine`, rank order; the CPU adds in expert order, hence a tolerance),
//! the sigmoid-gated shared expert (`moe_shared_add`, and added by the combine's own launch,
//! `moe_combine_with`, bit for bit the same). The expert FFNs themselves run on the
//! host here (their device matmuls are the existing MMVQ paths). Runs as `<name>::emu` and
//! `<name>::hip` through `test_device!`. In the ordered mode's float order the same launches
//! equal the CPU bit for bit.

use crate::gpu::gpu_ops::*;
use strata::cpu::prelude::*;
use strata::cpu::qwen4exp::Numerics;
use strata::model::Mat;
use strata::model::qwen4exp::moe::{Moe, SwiGlu};
use strata::rng::SplitMix64;
use strata::test_device;

/// Combined FFN output, device against CPU: relative with a floor of 1.
const MOE_TOL: f32 = 1e-5;

fn mat(rng: &mut SplitMix64, rows: usize, cols: usize, scale: f32) -> Mat {
    Mat::from_f32(rows, cols, &rng.symmetric_vec(rows * cols, scale)).expect("f32 matrix")
}

fn swiglu(rng: &mut SplitMix64, e: usize, ff: usize) -> SwiGlu {
    SwiGlu { gate: mat(rng, ff, e, 0.3), up: mat(rng, ff, e, 0.3), down: mat(rng, e, ff, 0.3) }
}

/// A layer of `ne` experts top-`k` over width `e`, expert FFN width `ff`.
fn layer(rng: &mut SplitMix64, e: usize, ff: usize, ne: usize, k: usize) -> Moe {
    Moe {
        spec: strata::model::qwen4exp::moe::spec(ne, k, ff, ff),
        router: mat(rng, ne, e, 1.0),
        experts: (0..ne).map(|_| swiglu(rng, e, ff)).collect(),
        shared_gate: mat(rng, 1, e, 1.0),
        shared: swiglu(rng, e, ff),
    }
}

/// The MoE FFN of `n` rows of `x` with the device's router, combine and shared-expert add, the
/// products (router, experts, shared expert) on the host in the float order `num` names:
/// (expert ids, weights, output).
fn on_device(
    ops: &strata::gpu::ops::GpuOps,
    moe: &Moe,
    x: &[f32],
    n: usize,
    num: Numerics,
) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let (e, ne, k) = (moe.router.cols, moe.router.rows, moe.spec.n_expert_used);
    let mut logits = vec![0f32; n * ne];
    num.matmul(&moe.router, x, n, &mut logits);
    let lb = upf(ops, &logits);
    let (ib, wb) = (zeros(ops, n * k * 4), zeros(ops, n * k * 4));
    ops.moe_router(&S, lb.ptr, ib.ptr, wb.ptr, n as u32, ne as u32, k as u32, true).unwrap();
    let ids = ib.u32s();
    // Every (token, rank) slot's expert output, one row per slot; the map is the slot.
    let mut y = vec![0f32; n * k * e];
    for t in 0..n {
        for j in 0..k {
            let ex = &moe.experts[ids[t * k + j] as usize];
            ex.forward_with(num, &x[t * e..(t + 1) * e], 1, &mut y[(t * k + j) * e..(t * k + j + 1) * e]);
        }
    }
    let map: Vec<u32> = (0..(n * k) as u32).collect();
    let (yb, mb, out) = (upf(ops, &y), upu(ops, &map), zeros(ops, n * e * 4));
    ops.moe_combine(&S, yb.ptr, mb.ptr, wb.ptr, out.ptr, e as u32, n as u32, k as u32).unwrap();
    let mut sh = vec![0f32; n * e];
    moe.shared.forward_with(num, x, n, &mut sh);
    let mut gate = vec![0f32; n];
    num.matmul(&moe.shared_gate, x, n, &mut gate);
    let (shb, gb) = (upf(ops, &sh), upf(ops, &gate));
    ops.moe_shared_add(&S, out.ptr, shb.ptr, gb.ptr, e as u32, n as u32).unwrap();
    // The executor's form: the shared expert added by the combine's own launch, the same bits.
    let fused = zeros(ops, n * e * 4);
    ops.moe_combine_with(&S, yb.ptr, mb.ptr, wb.ptr, fused.ptr, Some((shb.ptr, gb.ptr)), e as u32, n as u32, k as u32)
        .unwrap();
    assert_bits(device_name(ops), "combine with the shared expert in one launch", &fused.f32s(), &out.f32s());
    assert!(
        ops.moe_combine_with(&S, yb.ptr, mb.ptr, wb.ptr, fused.ptr, Some((0, gb.ptr)), e as u32, n as u32, k as u32)
            .is_err(),
        "shared rows at 0"
    );
    (ids, wb.f32s(), out.f32s())
}

test_device!(
    fn gpu_ops_qwen4exp_moe_with_shared_expert_matches_cpu(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x4d6f65);
        let (e, ff, ne, k, n) = (32usize, 16usize, 512usize, 10usize, 3usize);
        let moe = layer(&mut rng, e, ff, ne, k);
        let x = rng.symmetric_vec(n * e, 1.0);
        let mut want = vec![0f32; n * e];
        moe.forward(&x, n, &mut want);
        let (_, _, got) = on_device(ops, &moe, &x, n, Numerics::Llama);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let err = (g - w).abs() / w.abs().max(1.0);
            assert!(err <= MOE_TOL, "{dev} MoE output {i}: gpu {g:e} cpu {w:e} (rel {err:e})");
        }
        assert!(ops.moe_shared_add(&S, 0, 0, 0, e as u32, 0).is_err(), "no tokens is an error");
    }
);

test_device!(
    /// In the ordered mode's float order the device's router, rank-order combine and shared
    /// add equal the CPU's `Moe::forward_layer_with(Numerics::Ordered)` bit for bit (the
    /// router's softmax in `moe_router`'s order, the outputs added in rank order from 0), and
    /// the choice equals `Moe::route_with`: the same experts, the same weights.
    fn gpu_ops_qwen4exp_moe_equals_cpu_ordered_bitwise(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x4d6f66);
        for (e, ff, ne, k, n) in [(32usize, 16usize, 512usize, 10usize, 3usize), (64, 32, 8, 2, 8)] {
            let moe = layer(&mut rng, e, ff, ne, k);
            let x = rng.symmetric_vec(n * e, 1.0);
            let mut want = vec![0f32; n * e];
            moe.forward_layer_with(Numerics::Ordered, None, &x, n, &mut want);
            let (ids, w, got) = on_device(ops, &moe, &x, n, Numerics::Ordered);
            let mut logits = vec![0f32; n * ne];
            Numerics::Ordered.matmul(&moe.router, &x, n, &mut logits);
            for t in 0..n {
                let r = moe.route_with(Numerics::Ordered, &logits[t * ne..(t + 1) * ne]);
                let (want_ids, want_w): (Vec<u32>, Vec<f32>) = r.into_iter().map(|(id, w)| (id as u32, w)).unzip();
                assert_eq!(ids[t * k..(t + 1) * k], want_ids[..], "{dev} {ne} experts: token {t}'s experts");
                assert_bits(dev, &format!("{ne} experts: token {t}'s weights"), &w[t * k..(t + 1) * k], &want_w);
            }
            assert_bits(dev, &format!("{ne} experts top-{k}: MoE output"), &got, &want);
        }
    }
);
