//! The shipped kernels in the software device's race mode (docs/emulator.md, "Race mode"):
//! every family of gpu-kernels (quantizers, dequantizers, MMVQ, fused GLU and expert-dispatch
//! MMVQ, MMQ in both variants, the forward-pass element-wise ops, KV store, ordered and fast
//! attention, the MoE router and combine, the ordered-numerics kernels) runs through `GpuOps`
//! on fixed inputs under three race seeds. Each launch's waves run in a seeded random
//! interleaving and every LDS/global access is checked against the other waves of its
//! workgroup: a race fails the launch with a report naming kernel, both PCs, both waves and the
//! address. Results must also equal the normal mode's bit for bit (the kernels are
//! deterministic, so an interleaving-dependent result would be a race the checker missed).

use std::sync::Arc;
use strata::gpu::abi::WType;
use strata::gpu::device::{DevicePtr, EmuApi, Stream};
use strata::gpu::ops::{AttnMode, GluAct, GpuOps, KvFormat, MmqVariant, RowType};
use strata::kernel_tools::bench::random_blocks;
use strata::rng::SplitMix64;

const S: Stream = Stream::DEFAULT;
/// Three seeds (the tests run each workload once per seed plus once in the normal mode).
const SEEDS: [u64; 3] = [1, 0x005e_ed0f_7ace, 0xfeed_f00d_dead_beef];

/// `GpuOps` over a fresh software device, race mode on with `seed` (or explicitly off, so an
/// inherited `STRATA_EMU_RACE_SEED` does not change the reference run).
fn ops_with(seed: Option<u64>) -> GpuOps {
    let dev = emulator::Device::new();
    dev.set_race_seed(seed);
    GpuOps::new(Arc::new(EmuApi::with_device(dev))).expect("the kernels load on the software device")
}

/// Device buffers of one workload, and the outputs it records by name.
struct Run<'a> {
    ops: &'a GpuOps,
    bufs: Vec<DevicePtr>,
    outputs: Vec<(String, Vec<u8>)>,
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        for p in self.bufs.drain(..) {
            let _ = self.ops.api().free(p);
        }
    }
}

impl<'a> Run<'a> {
    fn new(ops: &'a GpuOps) -> Self {
        Run { ops, bufs: Vec::new(), outputs: Vec::new() }
    }
    fn up(&mut self, bytes: &[u8]) -> DevicePtr {
        let api = self.ops.api();
        let p = api.malloc(bytes.len().max(16)).expect("malloc");
        api.memcpy_htod(p, bytes).expect("htod");
        self.bufs.push(p);
        p
    }
    fn zeros(&mut self, n: usize) -> DevicePtr {
        self.up(&vec![0u8; n])
    }
    fn f32s(&mut self, v: &[f32]) -> DevicePtr {
        self.up(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
    }
    fn u32s(&mut self, v: &[u32]) -> DevicePtr {
        self.up(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
    }
    /// Run `op` (a `GpuOps` call); a launch error — a race report in race mode — fails the
    /// test naming the op. Then record `n` bytes at `out`.
    fn op(
        &mut self,
        what: &str,
        out: DevicePtr,
        n: usize,
        op: impl FnOnce(&GpuOps) -> strata::gpu::device::Result<()>,
    ) {
        if let Err(e) = op(self.ops) {
            panic!("{what}: {e}\n  caused by: {}", source_chain(&e));
        }
        let api = self.ops.api();
        api.synchronize().expect("synchronize");
        let mut v = vec![0u8; n];
        api.memcpy_dtoh(&mut v, out).expect("dtoh");
        self.outputs.push((what.to_string(), v));
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = Vec::new();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push(c.to_string());
        cur = c.source();
    }
    s.join(" / ")
}

fn q8_1(x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; x.len() / 32 * 36];
    quant::quantize_row(quant::GgmlType::Q8_1, x, &mut q).unwrap();
    q
}

/// Runs `workload` in the normal mode and under every seed; outputs must agree bit for bit.
fn check(family: &str, workload: impl Fn(&mut Run)) {
    let reference = {
        let ops = ops_with(None);
        let mut r = Run::new(&ops);
        workload(&mut r);
        std::mem::take(&mut r.outputs)
    };
    assert!(!reference.is_empty());
    for seed in SEEDS {
        let ops = ops_with(Some(seed));
        let mut r = Run::new(&ops);
        workload(&mut r);
        assert_eq!(r.outputs.len(), reference.len());
        for ((what, want), (_, got)) in reference.iter().zip(&r.outputs) {
            if let Some(i) = want.iter().zip(got).position(|(a, b)| a != b) {
                panic!(
                    "{family}: {what} under race seed {seed:#x} differs from the normal mode at byte {i} (an interleaving-dependent result)"
                );
            }
        }
        println!("{family}: {} outputs race-free and equal under seed {seed:#x}", reference.len());
    }
}

#[test]
fn quantize_and_dequant() {
    check("quantize/dequant", |r| {
        let mut rng = SplitMix64::new(1);
        let x = rng.symmetric_vec(4096 * 2, 3.0);
        let xb = r.f32s(&x);
        let n = x.len();
        let y = r.zeros(n / 32 * 36);
        r.op("quantize_q8_1", y, n / 32 * 36, |o| o.quantize_q8_1(&S, xb, y, n as u32));
        let y = r.zeros(n / 256 * 292);
        r.op("quantize_q8_k", y, n / 256 * 292, |o| o.quantize_q8_k(&S, xb, y, n as u32));
        for ty in WType::ALL {
            let nblocks = 300usize;
            let w = random_blocks(ty, nblocks, &mut rng);
            let wb = r.up(&w);
            let vals = nblocks * ty.block_k() as usize;
            for f16 in [false, true] {
                let bytes = vals * if f16 { 2 } else { 4 };
                let y = r.zeros(bytes);
                r.op(&format!("dequant {ty:?} f16={f16}"), y, bytes, |o| o.dequant(&S, ty, f16, wb, y, nblocks as u32));
            }
        }
    });
}

#[test]
fn mmvq_glu_and_expert_dispatch() {
    check("mmvq", |r| {
        let mut rng = SplitMix64::new(2);
        for ty in WType::ALL {
            let bk = ty.block_k() as usize;
            // 70 rows: two workgroups for one column; 1, 4 and 8 staged columns; a row list
            let (nrows, k) = (70usize, 1024usize);
            let w = random_blocks(ty, nrows * k / bk, &mut rng);
            let wu = random_blocks(ty, nrows * k / bk, &mut rng);
            let (wb, wub) = (r.up(&w), r.up(&wu));
            let xq = q8_1(&rng.symmetric_vec(8 * k, 1.0));
            let xb = r.up(&xq);
            for nc in [1u32, 4, 8] {
                let y = r.zeros(nc as usize * nrows * 4);
                r.op(&format!("mmvq {ty:?} c{nc}"), y, nc as usize * nrows * 4, |o| {
                    o.mmvq(&S, ty, nc, wb, xb, y, None, nrows as u32, k as u32, nrows as u32)
                });
            }
            let ids: Vec<u32> = (0..nrows as u32).rev().step_by(3).collect();
            let rb = r.u32s(&ids);
            let n = ids.len() as u32;
            let y = r.zeros(2 * n as usize * 4);
            r.op(&format!("mmvq {ty:?} rows"), y, 2 * n as usize * 4, |o| {
                o.mmvq(&S, ty, 2, wb, xb, y, Some(rb), n, k as u32, n)
            });
            for (nc, act) in [(1u32, GluAct::Silu), (3, GluAct::GeluTanh)] {
                let y = r.zeros(nc as usize * nrows * 4);
                r.op(&format!("mmvq_glu {ty:?} c{nc}"), y, nc as usize * nrows * 4, |o| {
                    o.mmvq_glu(&S, ty, nc, wb, wub, xb, y, None, nrows as u32, k as u32, nrows as u32, act)
                });
            }
            // expert dispatch: 3 tokens x 2 of 4 experts of 33 rows, plain and GLU
            let (ne, er, ek, nt, ku) = (4usize, 33usize, 256usize, 3usize, 2usize);
            let mat = er * ek / bk * ty.block_bytes() as usize;
            let eg = random_blocks(ty, ne * er * ek / bk, &mut rng);
            let eu = random_blocks(ty, ne * er * ek / bk, &mut rng);
            let (egb, eub) = (r.up(&eg), r.up(&eu));
            let ns = nt * ku;
            let eids: Vec<u32> = vec![2, 0, 1, 3, 3, 2];
            let ib = r.u32s(&eids);
            let exq = q8_1(&rng.symmetric_vec(ns * ek, 1.0));
            let exb = r.up(&exq);
            for glu in [false, true] {
                let y = r.zeros(ns * er * 4);
                let g = glu.then_some((eub, GluAct::Silu));
                r.op(&format!("mmvq_moe {ty:?} glu={glu}"), y, ns * er * 4, |o| {
                    o.mmvq_moe(
                        &S, ty, g, egb, mat as u64, ne as u32, exb, 1, ib, ns as u32, y, er as u32, ek as u32,
                        nt as u32,
                    )
                });
            }
        }
    });
}

#[test]
fn mmq_wmma_and_dot4() {
    check("mmq", |r| {
        let mut rng = SplitMix64::new(3);
        for ty in WType::ALL {
            // two row tiles and a ragged column tile
            let (m, n, k) = (300usize, 37usize, 256usize);
            let w = random_blocks(ty, m * k / ty.block_k() as usize, &mut rng);
            let xq = q8_1(&rng.symmetric_vec(n * k, 1.0));
            let (wb, xb) = (r.up(&w), r.up(&xq));
            for variant in [MmqVariant::Wmma, MmqVariant::Dot4] {
                let y = r.zeros(n * m * 4);
                r.op(&format!("mmq {ty:?} {variant:?}"), y, n * m * 4, |o| {
                    o.mmq(&S, ty, variant, wb, xb, y, m as u32, n as u32, k as u32, m as u32)
                });
            }
        }
    });
}

#[test]
fn forward_pass_elementwise_ops() {
    check("elementwise", |r| {
        let mut rng = SplitMix64::new(4);
        for (n, rows) in [(4096usize, 2usize), (100, 3), (2560, 9)] {
            let x = rng.symmetric_vec(n * rows, 4.0);
            let w = rng.symmetric_vec(n, 2.0);
            let (xb, wb) = (r.f32s(&x), r.f32s(&w));
            for ggml in [false, true] {
                let y = r.zeros(n * rows * 4);
                r.op(&format!("rms_norm n={n} ggml={ggml}"), y, n * rows * 4, |o| {
                    if ggml {
                        o.rms_norm_ggml(&S, xb, wb, y, n as u32, rows as u32, 1e-6)
                    } else {
                        o.rms_norm(&S, xb, wb, y, n as u32, rows as u32, 1e-6)
                    }
                });
            }
            let sb = r.f32s(&x.iter().map(|v| v * 5.0).collect::<Vec<f32>>());
            r.op(&format!("softmax n={n}"), sb, n * rows * 4, |o| o.softmax(&S, sb, n as u32, rows as u32));
        }
        let (hd, nh, nt) = (128usize, 4usize, 3usize);
        let x = rng.symmetric_vec(nt * nh * hd, 2.0);
        let xb = r.f32s(&x);
        let table = GpuOps::rope_table(10000.0, 1.0, hd, 64);
        let (pb, tb) = (r.u32s(&[63, 5, 17]), r.f32s(&table));
        r.op("rope", xb, x.len() * 4, |o| {
            o.rope(&S, xb, pb, tb, nt as u32, nh as u32, hd as u32, hd as u32, true, false)
        });
        let n = 3000usize;
        let (g, u) = (rng.symmetric_vec(n, 12.0), rng.symmetric_vec(n, 3.0));
        let (gb, ub) = (r.f32s(&g), r.f32s(&u));
        for act in [GluAct::Silu, GluAct::GeluTanh] {
            let o_ = r.zeros(n * 4);
            r.op(&format!("glu {act:?}"), o_, n * 4, |o| o.glu(&S, gb, ub, o_, n as u32, act));
        }
        let (b, xa) = (rng.symmetric_vec(4 * 300, 5.0), rng.symmetric_vec(4 * 300, 5.0));
        let (bb, xab) = (r.f32s(&b), r.f32s(&xa));
        r.op("add_rows", xab, xa.len() * 4, |o| o.add_rows(&S, xab, bb, 300, 4, 300));
        r.op("scale", xab, xa.len() * 4, |o| o.scale(&S, xab, 1200, 0.3));
        let y = r.zeros(n * 2);
        r.op("convert_f32_f16", y, n * 2, |o| o.convert_f32_f16(&S, gb, y, n as u32));
        let y = r.zeros(n * 2);
        r.op("convert_f32_bf16", y, n * 2, |o| o.convert_f32_bf16(&S, gb, y, n as u32));
        // get_rows: f32, f16 and a quantized table
        let ids = r.u32s(&[3, 0, 7, 3, 1]);
        let k = 512usize;
        let tf = r.f32s(&rng.symmetric_vec(8 * k, 1.0));
        let out = r.zeros(5 * k * 4);
        r.op("get_rows f32", out, 5 * k * 4, |o| o.get_rows(&S, RowType::F32, tf, ids, 5, k as u32, out, 1.0));
        let th: Vec<u8> = (0..8 * k).flat_map(|i| quant::f32_to_f16((i % 97) as f32 * 0.01).to_le_bytes()).collect();
        let thb = r.up(&th);
        let out = r.zeros(5 * k * 4);
        r.op("get_rows f16", out, 5 * k * 4, |o| o.get_rows(&S, RowType::F16, thb, ids, 5, k as u32, out, 2.5));
        for ty in [WType::Q4K, WType::Q8_0] {
            let tq = r.up(&random_blocks(ty, 8 * k / ty.block_k() as usize, &mut rng));
            let out = r.zeros(5 * k * 4);
            r.op(&format!("get_rows {ty:?}"), out, 5 * k * 4, |o| {
                o.get_rows(&S, RowType::W(ty), tq, ids, 5, k as u32, out, 1.0)
            });
        }
        // KV store, f16 and int8, 8 tokens of 4 heads of 128
        let (nkv, hd, nt, cap) = (4usize, 128usize, 8usize, 20usize);
        let src = r.f32s(&rng.symmetric_vec(nt * nkv * hd, 3.0));
        let pos = r.u32s(&(0..nt as u32).map(|i| (i * 7 + 3) % cap as u32).collect::<Vec<u32>>());
        let cache = r.zeros(cap * nkv * hd * 2);
        r.op("kv_store f16", cache, cap * nkv * hd * 2, |o| {
            o.kv_store(&S, KvFormat::F16, src, cache, 0, pos, nt as u32, nkv as u32, hd as u32)
        });
        let (cache, scales) = (r.zeros(cap * nkv * hd), r.zeros(cap * nkv * 4));
        r.op("kv_store int8", cache, cap * nkv * hd, |o| {
            o.kv_store(&S, KvFormat::Int8, src, cache, scales, pos, nt as u32, nkv as u32, hd as u32)
        });
        // MoE router (128 experts, top 8, ties) and combine
        let (ne, kk, nt) = (128usize, 8usize, 5usize);
        let mut logits = rng.symmetric_vec(nt * ne, 4.0);
        logits[3] = 9.0;
        logits[7] = 9.0;
        let lb = r.f32s(&logits);
        let (ib, wb) = (r.zeros(nt * kk * 4), r.zeros(nt * kk * 4));
        r.op("moe_router ids", ib, nt * kk * 4, |o| {
            o.moe_router(&S, lb, ib, wb, nt as u32, ne as u32, kk as u32, true)
        });
        r.op("moe_router weights", wb, nt * kk * 4, |_| Ok(()));
        let (d, ny) = (300usize, 40usize);
        let yb = r.f32s(&rng.symmetric_vec(ny * d, 2.0));
        let map = r.u32s(&(0..nt * kk).map(|i| (i * 13 % ny) as u32).collect::<Vec<u32>>());
        let mw = r.f32s(&rng.symmetric_vec(nt * kk, 1.0));
        let out = r.zeros(nt * d * 4);
        r.op("moe_combine", out, nt * d * 4, |o| o.moe_combine(&S, yb, map, mw, out, d as u32, nt as u32, kk as u32));
    });
}

#[test]
fn attention_ordered_and_fast() {
    check("attention", |r| {
        let mut rng = SplitMix64::new(5);
        // (int8 cache, head_dim, n_head, n_head_kv, n_tokens, last position, window)
        for (int8, hd, nh, nkv, nt, last, window) in [
            (false, 64usize, 4usize, 2usize, 1usize, 77usize, 0u32),
            (false, 128, 8, 2, 8, 300, 0),
            (true, 64, 4, 2, 3, 150, 32),
            (true, 128, 4, 1, 2, 40, 0),
        ] {
            let cap = last + 10;
            let cell = nkv * hd;
            let raw = |rng: &mut SplitMix64| -> Vec<u8> {
                if int8 {
                    (0..cap * cell).map(|_| (rng.next_u64() % 255) as u8).collect()
                } else {
                    (0..cap * cell).flat_map(|_| quant::f32_to_f16(rng.symmetric()).to_le_bytes()).collect()
                }
            };
            let (kr, vr) = (raw(&mut rng), raw(&mut rng));
            let (kb, vb) = (r.up(&kr), r.up(&vr));
            let (ks, vs) = if int8 {
                (
                    r.f32s(&rng.symmetric_vec(cap * nkv, 0.02).iter().map(|s| s.abs() + 0.001).collect::<Vec<f32>>()),
                    r.f32s(&rng.symmetric_vec(cap * nkv, 0.02).iter().map(|s| s.abs() + 0.001).collect::<Vec<f32>>()),
                )
            } else {
                (0, 0)
            };
            let q = r.f32s(&rng.symmetric_vec(nt * nh * hd, 1.0));
            let pos = r.u32s(&(0..nt).map(|i| (last + 1 - nt + i) as u32).collect::<Vec<u32>>());
            let fmt = if int8 { KvFormat::Int8 } else { KvFormat::F16 };
            for mode in [AttnMode::Ordered, AttnMode::Fast] {
                let out = r.zeros(nt * nh * hd * 4);
                r.op(
                    &format!("attention {mode:?} int8={int8} hd={hd} nt={nt} pos={last}"),
                    out,
                    nt * nh * hd * 4,
                    |o| {
                        o.attention(
                            &S,
                            mode,
                            fmt,
                            q,
                            kb,
                            ks,
                            vb,
                            vs,
                            out,
                            pos,
                            nt as u32,
                            nh as u32,
                            nkv as u32,
                            hd as u32,
                            window,
                            1.0 / (hd as f32).sqrt(),
                        )
                    },
                );
            }
        }
    });
}

#[test]
fn ordered_numerics_kernels() {
    check("ordered", |r| {
        let mut rng = SplitMix64::new(6);
        let x = rng.symmetric_vec(1024, 2.0);
        let xb = r.f32s(&x);
        for (ty, bytes) in [(quant::GgmlType::Q8_1, 1024 / 32 * 36), (quant::GgmlType::Q8K, 1024 / 256 * 292)] {
            let y = r.zeros(bytes);
            r.op(&format!("quantize_ref {ty:?}"), y, bytes, |o| o.quantize_ref(&S, ty, xb, y, 1024));
        }
        let (nrows, k) = (40usize, 512usize);
        let w = random_blocks(WType::Q4K, nrows * k / 256, &mut rng);
        let wb = r.up(&w);
        // Q4_K's dot type is Q8_K
        let mut aq = vec![0u8; 2 * k / 256 * 292];
        quant::quantize_row(quant::GgmlType::Q8K, &rng.symmetric_vec(2 * k, 1.0), &mut aq).unwrap();
        let a = r.up(&aq);
        let y = r.zeros(2 * nrows * 4);
        r.op("mmv_ordered Q4_K", y, 2 * nrows * 4, |o| {
            o.mmv_ordered(&S, quant::GgmlType::Q4K, wb, a, y, nrows as u32, 2, k as u32)
        });
    });
}

/// The checker is live on this path: `add_rows` with `b` aliasing `x` 32 floats further on
/// makes each wave read what the next wave of its workgroup writes — a real race (caused by the
/// arguments, not the kernel), reported from the launch under every seed, silent in the normal
/// mode.
#[test]
fn an_aliased_launch_is_reported() {
    for seed in [None, Some(SEEDS[0]), Some(SEEDS[2])] {
        let ops = ops_with(seed);
        let mut r = Run::new(&ops);
        let x = r.f32s(&(0..512).map(|i| i as f32).collect::<Vec<f32>>());
        let res = ops.add_rows(&S, x, x + 32 * 4, 256, 1, 0);
        match seed {
            None => res.unwrap(),
            Some(s) => {
                let e = res.expect_err("aliased add_rows must race");
                let text = format!("{e} / {}", source_chain(&e));
                for part in ["data race on global", "add_rows", "wave", &format!("race seed {s}")] {
                    assert!(text.contains(part), "{part:?} missing from: {text}");
                }
                println!("{text}");
            }
        }
    }
}
