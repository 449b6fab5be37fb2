//! The PLE block on the device (`GpuOps::ple_block`: the per-stream key/query gate, the gated
//! value's norm, the dilated causal conv with the residual update) against the CPU's
//! `PleBlock::mix`, the part of `PleCpu::forward` after the row gather and the projections (the
//! implementation that matches llama.cpp on the tiny-qwen4exp fixtures). The order of every sum
//! is the CPU's; sigmoid and SiLU are `quant::fmath`'s (within 2 ulp of libm), hence `PLE_TOL`.
//! A window of up to 8 tokens must equal the same tokens one launch at a time bit for bit, and
//! the conv history carries across calls. Runs as `<name>::emu` and `<name>::hip`.

use crate::gpu::gpu_ops::*;
use strata::cpu::qwen4exp::{Numerics, PleBlock};
use strata::gpu::ops::{GpuOps, PleBuffers, PleShape};
use strata::rng::SplitMix64;
use strata::test_device;

/// Device against CPU, relative with a floor of 1; shared with `strata device --selftest`.
const PLE_TOL: f32 = strata::kernel_tools::selftest::reference::PLE_TOL as f32;

/// The block's constants: (norm_key, norm_query, norm_conv, conv taps).
struct Consts {
    norms: [Vec<f32>; 3],
    conv: Vec<f32>,
}

fn consts(rng: &mut SplitMix64, hc: usize, e: usize, kp: usize) -> Consts {
    let mut g = || (0..hc * e).map(|_| 1.0 + 0.2 * rng.symmetric()).collect::<Vec<f32>>();
    let norms = [g(), g(), g()];
    Consts { norms, conv: rng.symmetric_vec(hc * e * kp, 0.6) }
}

fn block<'a>(c: &'a Consts, hc: usize, e: usize, kp: usize, dil: usize) -> PleBlock<'a> {
    PleBlock {
        hc,
        e,
        eps: 1e-6,
        conv_kernel: kp,
        dilation: dil,
        norm_key: &c.norms[0],
        norm_query: &c.norms[1],
        norm_conv: &c.norms[2],
        conv: &c.conv,
    }
}

fn shape(b: &PleBlock) -> PleShape {
    PleShape {
        hc: b.hc as u32,
        e: b.e as u32,
        conv_kernel: b.conv_kernel as u32,
        dilation: b.dilation as u32,
        eps: b.eps,
    }
}

/// One sequence on the device: constants and history uploaded once.
struct DevBlock<'a> {
    ops: &'a GpuOps,
    shape: PleShape,
    norms: Buf<'a>,
    taps: Buf<'a>,
    hist: Buf<'a>,
}

impl<'a> DevBlock<'a> {
    fn new(ops: &'a GpuOps, b: &PleBlock, hist: &[f32]) -> DevBlock<'a> {
        let norms: Vec<f32> = [b.norm_key, b.norm_query, b.norm_conv].concat();
        DevBlock { ops, shape: shape(b), norms: upf(ops, &norms), taps: upf(ops, b.conv), hist: upf(ops, hist) }
    }
    /// Runs `n` tokens; returns the updated streams.
    fn mix(&self, key: &[f32], val: &[f32], r: &[f32], n: usize) -> Vec<f32> {
        let ops = self.ops;
        let (kb, vb, rb) = (upf(ops, key), upf(ops, val), upf(ops, r));
        let (gv, nn) = (zeros(ops, r.len() * 4), zeros(ops, r.len() * 4));
        let b = PleBuffers {
            key: kb.ptr,
            val: vb.ptr,
            r: rb.ptr,
            norms: self.norms.ptr,
            taps: self.taps.ptr,
            hist: self.hist.ptr,
            gv: gv.ptr,
            nn: nn.ptr,
        };
        ops.ple_block(&S, &self.shape, &b, n as u32).expect("ple_block");
        rb.f32s()
    }
}

/// Random window inputs of `n` tokens: (key, val, r).
fn inputs(rng: &mut SplitMix64, hc: usize, e: usize, n: usize) -> [Vec<f32>; 3] {
    [rng.symmetric_vec(n * hc * e, 2.0), rng.symmetric_vec(n * e, 2.0), rng.symmetric_vec(n * hc * e, 3.0)]
}

fn max_rel(dev: &str, what: &str, got: &[f32], want: &[f32]) -> f32 {
    assert_rel_floor1(dev, what, got, want, PLE_TOL)
}

test_device!(
    fn gpu_ops_ple_block_matches_cpu(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x91e);
        // (hc, E, Kp, N): the fixtures' shape, Flash-Next's 4 streams of 2560 with a 4-tap conv of
        // dilation 3, a one-tap conv (no history).
        for (hc, e, kp, dil) in [(4usize, 64usize, 4usize, 3usize), (2, 48, 3, 2), (4, 2560, 4, 3), (1, 40, 1, 3)] {
            let c = consts(&mut rng, hc, e, kp);
            let b = block(&c, hc, e, kp, dil);
            let mut hist = rng.symmetric_vec((kp - 1) * dil * hc * e, 1.0);
            let db = DevBlock::new(ops, &b, &hist);
            let mut worst = 0f32;
            let windows: &[usize] = if e > 1000 { &[1, 3] } else { &[1, 8, 3, 1] };
            for (call, &n) in windows.iter().enumerate() {
                let [key, val, r] = inputs(&mut rng, hc, e, n);
                let got = db.mix(&key, &val, &r, n);
                let mut want = r.clone();
                b.mix(&key, &val, &mut want, n, &mut hist);
                let what = format!("hc={hc} E={e} Kp={kp} N={dil} call {call} ({n} tokens)");
                worst = worst.max(max_rel(dev, &format!("{what}: streams"), &got, &want));
                worst = worst.max(max_rel(dev, &format!("{what}: conv history"), &db.hist.f32s(), &hist));
            }
            println!("{dev} ple_block hc={hc} E={e} Kp={kp} N={dil}: worst relative error {worst:e} (tolerance {PLE_TOL:e})");
        }
    }
);

test_device!(
    fn gpu_ops_ple_window_equals_single_tokens_bitwise(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x3c);
        let (hc, e, kp, dil) = (4usize, 64usize, 4usize, 3usize);
        let c = consts(&mut rng, hc, e, kp);
        let b = block(&c, hc, e, kp, dil);
        let hist = rng.symmetric_vec((kp - 1) * dil * hc * e, 1.0);
        let (window, single) = (DevBlock::new(ops, &b, &hist), DevBlock::new(ops, &b, &hist));
        let n = 8;
        let [key, val, r] = inputs(&mut rng, hc, e, n);
        let got = window.mix(&key, &val, &r, n);
        let mut want = Vec::new();
        for t in 0..n {
            let row = |v: &[f32], w: usize| v[t * w..(t + 1) * w].to_vec();
            want.extend(single.mix(&row(&key, hc * e), &row(&val, e), &row(&r, hc * e), 1));
        }
        assert_bits(dev, "8-token window vs 8 single tokens: streams", &got, &want);
        assert_bits(dev, "conv history", &window.hist.f32s(), &single.hist.f32s());
    }
);

test_device!(
    fn gpu_ops_ple_refuses_unsupported_shapes(ops) {
        let z = PleBuffers { key: 0, val: 0, r: 0, norms: 0, taps: 0, hist: 0, gv: 0, nn: 0 };
        let ok = PleShape { hc: 4, e: 64, conv_kernel: 4, dilation: 3, eps: 1e-6 };
        for (shape, n, what) in [
            (ok, 0u32, "0 tokens"),
            (PleShape { e: 0, ..ok }, 1, "width 0"),
            (PleShape { conv_kernel: 0, ..ok }, 1, "no conv taps"),
            (PleShape { dilation: 0, ..ok }, 1, "dilation 0"),
        ] {
            let e = ops.ple_block(&S, &shape, &z, n).expect_err(what).to_string();
            assert!(e.contains("ple"), "{what}: {e}");
        }
    }
);

test_device!(
    /// `ple_block` equals the CPU's `PleBlock::mix_with` in `Numerics::Ordered` (the ordered
    /// mode: `quant::fmath`'s sigmoid and SiLU) bit for bit, streams and conv history.
    fn gpu_ops_ple_block_equals_cpu_ordered_bitwise(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x91f);
        for (hc, e, kp, dil) in [(4usize, 64usize, 4usize, 3usize), (2, 48, 3, 2), (1, 40, 1, 3)] {
            let c = consts(&mut rng, hc, e, kp);
            let b = block(&c, hc, e, kp, dil);
            let mut hist = rng.symmetric_vec((kp - 1) * dil * hc * e, 1.0);
            let db = DevBlock::new(ops, &b, &hist);
            for (call, n) in [1usize, 8, 3].into_iter().enumerate() {
                let [key, val, r] = inputs(&mut rng, hc, e, n);
                let got = db.mix(&key, &val, &r, n);
                let mut want = r.clone();
                b.mix_with(Numerics::Ordered, &key, &val, &mut want, n, &mut hist);
                let what = format!("hc={hc} E={e} Kp={kp} N={dil} call {call} ({n} tokens)");
                assert_bits(dev, &format!("{what}: streams"), &got, &want);
                assert_bits(dev, &format!("{what}: conv history"), &db.hist.f32s(), &hist);
            }
        }
    }
);
