//! QSA attention on the device (`GpuOps::qsa_mix`: q/k norm + partial rope, the f16 cache
//! appends, the block indexer's keys, scores and heap-order top-k, the gated attention) against
//! the CPU's `Qsa::mix`, the implementation that matches llama.cpp on the tiny-qwen4exp
//! fixtures. Everything before the softmax is in the CPU's order with the CPU's rope angles, so
//! the caches, the block keys and every token's kept cells must be identical; the attention
//! output differs by `quant::fmath`'s exp and sigmoid (2 ulp of libm), which an f16-rounded
//! probability can turn into one f16 step, hence `QSA_TOL`. A window of up to 8 tokens must
//! equal the same tokens one launch at a time bit for bit. Runs as `<name>::emu` and
//! `<name>::hip` through `test_device!`.

use crate::gpu::gpu_ops::*;
use strata::cpu::prelude::*;
use strata::cpu::qwen4exp::{Numerics, QsaProjections};
use strata::gpu::ops::{GpuOps, KvFormat, QsaBuffers, QsaIndexerShape, QsaShape};
use strata::model::KvRows;
use strata::model::Mat;
use strata::model::qwen4exp::{Indexer, KvType, Qsa};
use strata::rng::SplitMix64;
use strata::test_device;

/// Device attention output against the CPU's: `|gpu − cpu| <= QSA_TOL · max(1, |cpu|)`
/// (one f16 step of a probability times |v| <= 2; shared with `strata device --selftest`).
const QSA_TOL: f32 = strata::kernel_tools::selftest::reference::QSA_TOL as f32;

fn unused() -> Mat {
    Mat::from_f32(1, 1, &[0.0]).expect("1x1")
}

/// (heads, kv heads, head dim, roped dims, indexer (heads, dim, top_k, ratio)).
type Dims = (usize, usize, usize, usize, Option<(usize, usize, usize, usize)>);

/// A QSA layer with random norms (the projections are not part of the mixer).
fn layer(rng: &mut SplitMix64, (h, kv, d, rot, ix): Dims) -> Qsa {
    let norm = |rng: &mut SplitMix64, n: usize| (0..n).map(|_| 1.0 + 0.3 * rng.symmetric()).collect::<Vec<f32>>();
    Qsa {
        n_head: h,
        n_head_kv: kv,
        head_dim: d,
        n_rot: rot,
        rope_base: 10000.0,
        eps: 1e-6,
        q: unused(),
        k: unused(),
        v: unused(),
        o: unused(),
        q_norm: norm(rng, d),
        k_norm: norm(rng, d),
        indexer: ix.map(|(heads, dim, top_k, ratio)| Indexer {
            heads,
            dim,
            top_k,
            ratio,
            q: unused(),
            k: unused(),
            q_norm: norm(rng, dim),
            k_norm: norm(rng, dim),
        }),
    }
}

fn shape(q: &Qsa, kv: KvType) -> QsaShape {
    QsaShape {
        kv: if kv == KvType::Int8 { KvFormat::Int8 } else { KvFormat::F16 },
        n_head: q.n_head as u32,
        n_head_kv: q.n_head_kv as u32,
        head_dim: q.head_dim as u32,
        n_rot: q.n_rot as u32,
        eps: q.eps,
        indexer: q.indexer.as_ref().map(|ix| QsaIndexerShape {
            heads: ix.heads as u32,
            dim: ix.dim as u32,
            top_k: ix.top_k as u32,
            ratio: ix.ratio as u32,
        }),
    }
}

/// Random projections of `n` tokens (values of a few units, as a trained layer's).
fn projections(rng: &mut SplitMix64, q: &Qsa, n: usize) -> QsaProjections {
    let (h, kv, d) = (q.n_head, q.n_head_kv, q.head_dim);
    let (kappa, iq) = match &q.indexer {
        Some(ix) => (rng.symmetric_vec(n * ix.dim, 2.0), rng.symmetric_vec(n * ix.heads * ix.dim, 2.0)),
        None => (Vec::new(), Vec::new()),
    };
    QsaProjections {
        qf: rng.symmetric_vec(n * h * 2 * d, 3.0),
        kp: rng.symmetric_vec(n * kv * d, 3.0),
        vp: rng.symmetric_vec(n * kv * d, 2.0),
        kappa,
        iq,
    }
}

/// One sequence on the device: its norms, rope table, cache and scratch for windows of up to 8.
struct DevLayer<'a> {
    ops: &'a GpuOps,
    shape: QsaShape,
    capacity: usize,
    consts: [Buf<'a>; 5],
    /// K, V, κ, block keys, then the int8 scales of K, V, κ (unused for f16).
    cache: [Buf<'a>; 7],
    scratch: [Buf<'a>; 6],
    cells: usize,
}

impl<'a> DevLayer<'a> {
    fn new(ops: &'a GpuOps, q: &Qsa, kv_type: KvType, capacity: usize) -> DevLayer<'a> {
        let (kv, d, hd) = (q.n_head_kv, q.head_dim, q.n_head * q.head_dim);
        let (ih, idim, ratio, budget) =
            q.indexer.as_ref().map_or((1, 1, 1, 1), |ix| (ix.heads, ix.dim, ix.ratio, ix.top_k + ix.ratio - 1));
        let ixn = |f: fn(&Indexer) -> &Vec<f32>| q.indexer.as_ref().map_or(vec![0.0], |ix| f(ix).clone());
        let table = GpuOps::rope_table_ggml(q.rope_base, 1.0, q.n_rot, capacity);
        let n = 8;
        DevLayer {
            ops,
            shape: shape(q, kv_type),
            capacity,
            consts: [
                upf(ops, &q.q_norm),
                upf(ops, &q.k_norm),
                upf(ops, &ixn(|ix| &ix.q_norm)),
                upf(ops, &ixn(|ix| &ix.k_norm)),
                upf(ops, &table),
            ],
            cache: [
                zeros(ops, capacity * kv * d * 2),
                zeros(ops, capacity * kv * d * 2),
                zeros(ops, capacity * idim * 2),
                zeros(ops, (capacity / ratio).max(1) * idim * 4),
                zeros(ops, capacity * kv * 4),
                zeros(ops, capacity * kv * 4),
                zeros(ops, capacity * 4),
            ],
            scratch: [
                zeros(ops, n * hd * 4),
                zeros(ops, n * kv * d * 4),
                zeros(ops, n * ih * idim * 4),
                zeros(ops, n * (capacity / ratio).max(1) * 4),
                zeros(ops, n * budget * 4),
                zeros(ops, n * 4),
            ],
            cells: 0,
        }
    }

    /// Runs the window `p` of `n` tokens; returns the output `[n][H·D]` and, with an indexer,
    /// each token's kept cells.
    fn mix(&mut self, p: &QsaProjections, n: usize) -> (Vec<f32>, Vec<Vec<usize>>) {
        let ops = self.ops;
        let start = self.cells;
        let pos: Vec<u32> = (start..start + n).map(|c| c as u32).collect();
        let (qf, kp, vp) = (upf(ops, &p.qf), upf(ops, &p.kp), upf(ops, &p.vp));
        let (kappa, iq) = (upf(ops, &p.kappa), upf(ops, &p.iq));
        let posb = upu(ops, &pos);
        let out = zeros(ops, n * (self.shape.n_head * self.shape.head_dim) as usize * 4);
        let [qn, kn, iqn, ikn, table] = &self.consts;
        let [kc, vc, kappac, blocks, ks, vs, kappas] = &self.cache;
        let [q, k, iqs, score, sel, sel_n] = &self.scratch;
        let b = QsaBuffers {
            qf: qf.ptr,
            kp: kp.ptr,
            vp: vp.ptr,
            kappa_p: kappa.ptr,
            iq_p: iq.ptr,
            q_norm: qn.ptr,
            k_norm: kn.ptr,
            iq_norm: iqn.ptr,
            ik_norm: ikn.ptr,
            rope_table: table.ptr,
            pos: posb.ptr,
            k_cache: kc.ptr,
            v_cache: vc.ptr,
            kappa_cache: kappac.ptr,
            k_scale: ks.ptr,
            v_scale: vs.ptr,
            kappa_scale: kappas.ptr,
            blocks: blocks.ptr,
            q: q.ptr,
            k: k.ptr,
            iq: iqs.ptr,
            score: score.ptr,
            sel: sel.ptr,
            sel_n: sel_n.ptr,
            out: out.ptr,
        };
        ops.qsa_mix(&S, &self.shape, &b, n as u32, start as u32, self.capacity as u32).expect("qsa_mix");
        self.cells += n;
        let mut kept = Vec::new();
        if let Some(ix) = self.shape.indexer {
            let (sel, counts) = (sel.u32s(), sel_n.u32s());
            let w = ix.budget() as usize;
            for t in 0..n {
                kept.push(sel[t * w..t * w + counts[t] as usize].iter().map(|&c| c as usize).collect());
            }
        }
        (out.f32s(), kept)
    }

    /// Cache `which` (0 K, 1 V, 2 κ) of `values` values against the CPU's buffer: the same f16
    /// bits, or the same int8 rows and scales.
    fn assert_cache_eq(&self, dev: &str, which: usize, values: usize, cpu: &KvRows) {
        let bytes = self.cache[which].bytes();
        match cpu {
            KvRows::F16(v) => {
                let got: Vec<u16> =
                    bytes[..values * 2].chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
                assert_eq!(&got, v, "{dev}: f16 cache {which}");
            }
            KvRows::Int8 { q, scale, .. } => {
                let got: Vec<i8> = bytes[..values].iter().map(|&b| b as i8).collect();
                assert_eq!(&got, q, "{dev}: int8 cache {which}");
                let scales = self.cache[4 + which].f32s();
                assert_bits(dev, &format!("int8 cache {which} scales"), &scales[..scale.len()], scale);
            }
            KvRows::F32(_) => panic!("the device has no f32 cache"),
        }
    }
}

fn max_rel(dev: &str, what: &str, got: &[f32], want: &[f32]) -> f32 {
    assert_rel_floor1(dev, what, got, want, QSA_TOL)
}

/// Runs `tokens` in windows cycling through `windows` on the CPU (in the float order `num`
/// names) and the device, checking every window's output (bit for bit in `Numerics::Ordered`,
/// else within `QSA_TOL`), kept cells, caches and block keys; returns (worst error, tokens whose
/// selection was sparse).
fn run_sequence(
    ops: &GpuOps,
    q: &Qsa,
    kv: KvType,
    rng: &mut SplitMix64,
    tokens: usize,
    windows: &[usize],
    num: Numerics,
) -> (f32, usize) {
    let dev = device_name(ops);
    let mut dl = DevLayer::new(ops, q, kv, tokens);
    let mut cache = q.new_cache(kv);
    let (mut worst, mut sparse, mut done, mut call) = (0f32, 0usize, 0usize, 0usize);
    while done < tokens {
        let n = windows[call % windows.len()].min(tokens - done);
        let p = projections(rng, q, n);
        let (want, want_sel) = q.mix_with(num, &p, n, done, &mut cache, true);
        let (got, got_sel) = dl.mix(&p, n);
        let what = format!("{:?} window {call} at {done} ({n} tokens)", shape(q, kv));
        if q.indexer.is_some() {
            for t in 0..n {
                assert_eq!(got_sel[t], want_sel[t], "{dev} {what}: kept cells of token {}", done + t);
                sparse += (want_sel[t].len() < done + t + 1) as usize;
            }
        }
        if num == Numerics::Ordered {
            assert_bits(dev, &format!("{what}: out"), &got, &want);
        } else {
            worst = worst.max(max_rel(dev, &format!("{what}: out"), &got, &want));
        }
        done += n;
        call += 1;
    }
    let (kvh, d) = (q.n_head_kv, q.head_dim);
    dl.assert_cache_eq(dev, 0, tokens * kvh * d, &cache.k);
    dl.assert_cache_eq(dev, 1, tokens * kvh * d, &cache.v);
    if let Some(ix) = &q.indexer {
        dl.assert_cache_eq(dev, 2, tokens * ix.dim, &cache.kappa);
        let blocks = dl.cache[3].f32s();
        assert_bits(dev, "block keys", &blocks[..cache.blocks.len()], &cache.blocks);
    }
    (worst, sparse)
}

test_device!(
    fn gpu_ops_qsa_mix_matches_cpu_with_identical_selection(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x05a);
        // The fixtures' shape (small heads, ratio 4), one indexer head (ties of zero scores
        // across blocks), Flash-Next's head dim 256 with 64 roped dims, and dense attention.
        let cases: [(Dims, usize); 4] = [
            ((4, 2, 32, 16, Some((2, 32, 8, 4))), 300),
            ((2, 1, 16, 8, Some((1, 16, 5, 3))), 120),
            ((4, 2, 256, 64, Some((2, 128, 6, 4))), 40),
            ((2, 2, 32, 32, None), 40),
        ];
        for kv in [KvType::F16, KvType::Int8] {
            for (dims, tokens) in cases {
                let q = layer(&mut rng, dims);
                let (worst, sparse) = run_sequence(ops, &q, kv, &mut rng, tokens, &[1, 8, 3, 1, 5, 2], Numerics::Llama);
                if q.indexer.is_some() {
                    assert!(sparse > tokens / 2, "{dev} {dims:?}: only {sparse} of {tokens} tokens had a sparse selection");
                }
                println!("{dev} qsa_mix {kv:?} {dims:?}, {tokens} tokens: {sparse} sparse selections, worst relative error {worst:e} (tolerance {QSA_TOL:e})");
            }
        }
    }
);

test_device!(
    /// `qsa_mix` equals the CPU's `Qsa::mix_with` in `Numerics::Ordered` (the ordered mode:
    /// `quant::fmath`'s softmax exp and gate sigmoid) bit for bit, over 300 tokens of sparse
    /// selection and a dense layer, f16 and int8 caches.
    fn gpu_ops_qsa_mix_equals_cpu_ordered_bitwise(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x05b);
        let cases: [(Dims, usize); 3] = [((4, 2, 32, 16, Some((2, 32, 8, 4))), 300), ((4, 2, 256, 64, Some((2, 128, 6, 4))), 40), ((2, 2, 32, 32, None), 40)];
        for kv in [KvType::F16, KvType::Int8] {
            for (dims, tokens) in cases {
                let q = layer(&mut rng, dims);
                let (_, sparse) = run_sequence(ops, &q, kv, &mut rng, tokens, &[1, 8, 3, 1, 5, 2], Numerics::Ordered);
                println!("{dev} qsa_mix ordered {kv:?} {dims:?}, {tokens} tokens: {sparse} sparse selections, bit for bit");
            }
        }
    }
);

test_device!(
    fn gpu_ops_qsa_window_equals_single_tokens_bitwise(ops) {
        let dev = device_name(ops);
        let mut rng = SplitMix64::new(0x8a);
        let q = layer(&mut rng, (4, 2, 32, 16, Some((2, 32, 8, 4))));
        for kv in [KvType::F16, KvType::Int8] {
        let (mut window, mut single) = (DevLayer::new(ops, &q, kv, 64), DevLayer::new(ops, &q, kv, 64));
        // A prefix long enough for sparse selection, then an 8-token window across a block edge.
        for n in [8usize, 8, 8, 3] {
            let p = projections(&mut rng, &q, n);
            let _ = window.mix(&p, n);
            let _ = single.mix(&p, n);
        }
        let n = 8;
        let p = projections(&mut rng, &q, n);
        let (got, got_sel) = window.mix(&p, n);
        let (mut want, mut want_sel) = (Vec::new(), Vec::new());
        let (hd, kvd) = (q.n_head * 2 * q.head_dim, q.n_head_kv * q.head_dim);
        let ix = q.indexer.as_ref().expect("indexer");
        for t in 0..n {
            let r = |v: &[f32], w: usize| v[t * w..(t + 1) * w].to_vec();
            let pt = QsaProjections {
                qf: r(&p.qf, hd),
                kp: r(&p.kp, kvd),
                vp: r(&p.vp, kvd),
                kappa: r(&p.kappa, ix.dim),
                iq: r(&p.iq, ix.heads * ix.dim),
            };
            let (o, s) = single.mix(&pt, 1);
            want.extend(o);
            want_sel.extend(s);
        }
        assert_eq!(got_sel, want_sel, "{dev} {kv:?}: kept cells, window vs single tokens");
        assert_bits(dev, &format!("{kv:?}: 8-token window vs 8 single tokens: out"), &got, &want);
        }
    }
);

test_device!(
    fn gpu_ops_qsa_refuses_unsupported_shapes(ops) {
        let z = QsaBuffers {
            qf: 0, kp: 0, vp: 0, kappa_p: 0, iq_p: 0, q_norm: 0, k_norm: 0, iq_norm: 0, ik_norm: 0, rope_table: 0, pos: 0,
            k_cache: 0, v_cache: 0, kappa_cache: 0, k_scale: 0, v_scale: 0, kappa_scale: 0, blocks: 0, q: 0, k: 0, iq: 0, score: 0, sel: 0, sel_n: 0, out: 0,
        };
        let ix = QsaIndexerShape { heads: 1, dim: 32, top_k: 4, ratio: 4 };
        let ok = QsaShape { n_head: 2, n_head_kv: 1, head_dim: 32, n_rot: 16, eps: 1e-6, indexer: Some(ix), kv: KvFormat::F16 };
        let cases = [
            (ok, 0u32, 0u32, 64u32, "0 tokens"),
            (ok, 4, 62, 64, "a window past the capacity"),
            (QsaShape { head_dim: 512, n_rot: 64, ..ok }, 1, 0, 64, "head dim 512"),
            (QsaShape { n_rot: 7, ..ok }, 1, 0, 64, "odd n_rot"),
            (QsaShape { n_head: 3, n_head_kv: 2, ..ok }, 1, 0, 64, "heads not a multiple of kv heads"),
            (QsaShape { indexer: Some(QsaIndexerShape { ratio: 0, ..ix }), ..ok }, 1, 0, 64, "ratio 0"),
            (QsaShape { indexer: None, ..ok }, 1, 20_000, 32_768, "dense attention beyond the LDS"),
        ];
        for (shape, n, start, capacity, what) in cases {
            let e = ops.qsa_mix(&S, &shape, &z, n, start, capacity).expect_err(what);
            assert!(e.to_string().contains("qsa"), "{what}: {e}");
        }
    }
);
