//! Hyper-connection (GR) kernels on the device against `HyperConn` on the CPU: a whole GR read
//! (stream norm bit for bit, then the host's down/up matmuls, low-rank activation and gate mix
//! within `GR_TOL`) ends at the CPU's `HyperConn::mix` block input; the write (`combine`)
//! likewise; and a window of 8 tokens equals the same 8 tokens launched one at a time, bit for
//! bit. Runs as `<name>::emu` and `<name>::hip` through `test_device!`.

use crate::gpu::gpu_ops::*;
use strata::cpu::prelude::*;
use strata::cpu::qwen4exp::Numerics;
use strata::gpu::ops::{GpuOps, GrShape};
use strata::model::Mat;
use strata::model::qwen4exp::gr::HyperConn;
use strata::rng::SplitMix64;
use strata::test_device;

const GR_TOL: f32 = strata::kernel_tools::selftest::reference::GR_TOL as f32;

fn mixer(rng: &mut SplitMix64, hc: usize, e: usize, lr: usize) -> HyperConn {
    let mut mat = |rows: usize, cols: usize| {
        Mat::from_f32(rows, cols, &rng.symmetric_vec(rows * cols, 0.05)).expect("f32 matrix")
    };
    let (down, up, inject) = (mat(lr, hc * e), mat(hc * e, lr), Some(mat(hc, hc * e)));
    HyperConn {
        hc,
        n_embd: e,
        eps: 1e-6,
        norm: (0..hc * e).map(|i| 1.0 + 0.01 * (i % 17) as f32).collect(),
        down,
        up,
        inject,
    }
}

fn assert_close(dev: &str, what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{dev} {what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let e = (g - w).abs() / w.abs().max(1.0);
        assert!(e <= GR_TOL, "{dev} {what}: element {i}: gpu {g:e} cpu {w:e} (rel {e:e} > {GR_TOL:e})");
    }
}

/// One GR read on the device, the matmuls on the host between the kernels (in the float order
/// `num` names): (flat, block input).
fn read_on_device(ops: &GpuOps, h: &HyperConn, r: &[f32], n: usize, num: Numerics) -> (Vec<f32>, Vec<f32>) {
    let (hc, e, lr) = (h.hc, h.n_embd, h.down.rows);
    let shape = GrShape { hc: hc as u32, e: e as u32, eps: h.eps };
    let (rb, gb, fb) = (upf(ops, r), upf(ops, &h.norm), zeros(ops, n * hc * e * 4));
    ops.gr_stream_norm(&S, &shape, rb.ptr, gb.ptr, fb.ptr, None, n as u32).unwrap();
    let flat = fb.f32s();
    let mut lo = vec![0f32; n * lr];
    num.matmul(&h.down, &flat, n, &mut lo);
    let lob = upf(ops, &lo);
    ops.gr_lowrank_act(&S, &shape, lob.ptr, None, (n * lr) as u32).unwrap();
    let lo = lob.f32s();
    let mut gate = vec![0f32; n * hc * e];
    num.matmul(&h.up, &lo, n, &mut gate);
    let (gab, xb) = (upf(ops, &gate), zeros(ops, n * e * 4));
    ops.gr_gate_mix(&S, &shape, fb.ptr, gab.ptr, xb.ptr, n as u32).unwrap();
    (flat, xb.f32s())
}

test_device!(
    fn gpu_ops_gr_read_and_write_match_cpu(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x6e);
        // The fixture's width, and Flash-Next's 4 x 2560 with low rank 320.
        for (hc, e, lr, n) in [(4usize, 64usize, 16usize, 3usize), (2, 96, 8, 1), (4, 2560, 320, 2)] {
            let h = mixer(&mut rng, hc, e, lr);
            let r = rng.symmetric_vec(n * hc * e, 2.0);
            let (flat, x) = read_on_device(ops, &h, &r, n, Numerics::Llama);
            assert_bits(dev, &format!("hc={hc} E={e}: stream norm"), &flat, &h.norm_streams(&r, n));
            let mut want_x = vec![0f32; n * e];
            let mut inj = vec![0f32; n * hc];
            h.mix(&r, n, &mut want_x, Some(&mut inj));
            assert_close(dev, &format!("hc={hc} E={e}: block input"), &x, &want_x);

            let y = rng.symmetric_vec(n * e, 1.0);
            let mut want_r = r.clone();
            h.combine(&mut want_r, n, &y, &inj);
            let shape = GrShape { hc: hc as u32, e: e as u32, eps: h.eps };
            let (rb, yb, ib) = (upf(ops, &r), upf(ops, &y), upf(ops, &inj));
            ops.gr_combine(&S, &shape, rb.ptr, yb.ptr, ib.ptr, n as u32).unwrap();
            assert_close(dev, &format!("hc={hc} E={e}: combine"), &rb.f32s(), &want_r);
        }
    }
);

test_device!(
    fn gpu_ops_gr_window_of_8_equals_8_single_tokens_bitwise(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x6f);
        let (hc, e, lr, n) = (4usize, 64usize, 16usize, 8usize);
        let h = mixer(&mut rng, hc, e, lr);
        let r = rng.symmetric_vec(n * hc * e, 2.0);
        let (flat, x) = read_on_device(ops, &h, &r, n, Numerics::Llama);
        let row = hc * e;
        for t in 0..n {
            let (f1, x1) = read_on_device(ops, &h, &r[t * row..(t + 1) * row], 1, Numerics::Llama);
            assert_bits(dev, &format!("token {t}: stream norm"), &flat[t * row..(t + 1) * row], &f1);
            assert_bits(dev, &format!("token {t}: block input"), &x[t * e..(t + 1) * e], &x1);
        }
        let bad = GrShape { hc: 0, e: 64, eps: 1e-6 };
        assert!(ops.gr_stream_norm(&S, &bad, 0, 0, 0, None, 1).is_err());
        // A fused Q8_1 output needs rows of whole 32-value blocks.
        let odd = GrShape { hc: 2, e: 48, eps: 1e-6 };
        let (rb, fb, qb) = (zeros(ops, 2 * 48 * 4), zeros(ops, 2 * 48 * 4), zeros(ops, 2 * 48 * 4));
        assert!(ops.gr_stream_norm(&S, &odd, rb.ptr, rb.ptr, fb.ptr, Some(qb.ptr), 1).is_err(), "rows of 48");
        assert!(ops.gr_lowrank_act(&S, &odd, fb.ptr, Some((qb.ptr, 48)), 96).is_err(), "rows of 48");
        assert!(ops.gr_lowrank_act(&S, &odd, fb.ptr, Some((qb.ptr, 64)), 96).is_err(), "96 values in rows of 64");
        assert!(ops.gr_combine(&S, &GrShape { hc: 4, ..bad }, 0, 0, 0, 0).is_err());
    }
);

test_device!(
    /// In the ordered mode's float order (the host's products `Numerics::Ordered`, as
    /// `mmv_ordered` computes them) the read and the write equal the CPU's
    /// `HyperConn::{mix_with, combine_with}` bit for bit: the kernels' sums are in the CPU's
    /// order and their sigmoid and SiLU are `quant::fmath`'s.
    fn gpu_ops_gr_read_and_write_equal_cpu_ordered_bitwise(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x70);
        for (hc, e, lr, n) in [(4usize, 64usize, 16usize, 3usize), (2, 96, 8, 1), (4, 256, 32, 8)] {
            let h = mixer(&mut rng, hc, e, lr);
            let r = rng.symmetric_vec(n * hc * e, 2.0);
            let (_, x) = read_on_device(ops, &h, &r, n, Numerics::Ordered);
            let (mut want_x, mut inj) = (vec![0f32; n * e], vec![0f32; n * hc]);
            h.mix_with(Numerics::Ordered, &r, n, &mut want_x, Some(&mut inj));
            assert_bits(dev, &format!("hc={hc} E={e}: block input"), &x, &want_x);
            let y = rng.symmetric_vec(n * e, 1.0);
            let mut want_r = r.clone();
            h.combine_with(Numerics::Ordered, &mut want_r, n, &y, &inj);
            let shape = GrShape { hc: hc as u32, e: e as u32, eps: h.eps };
            let (rb, yb, ib) = (upf(ops, &r), upf(ops, &y), upf(ops, &inj));
            ops.gr_combine(&S, &shape, rb.ptr, yb.ptr, ib.ptr, n as u32).unwrap();
            assert_bits(dev, &format!("hc={hc} E={e}: combine"), &rb.f32s(), &want_r);
        }
    }
);
