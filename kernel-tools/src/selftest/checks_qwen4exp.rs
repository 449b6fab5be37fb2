//! Selftest checks of Flash-Next's layer kernels against the CPU implementation that matches
//! llama.cpp: the Gated DeltaNet kernels (conv + SiLU, q/k L2 norms, delta rule, gated norm),
//! launched together as `GpuOps::gdn_mix`, against `qwen4exp::gdn::Gdn::mix` (outputs and both
//! states); the hyper-connection kernels against `qwen4exp::gr::HyperConn`'s steps.
use super::reference::{GDN_TOL, GR_TOL, PLE_TOL, QSA_TOL};
use super::{Check, CheckResultOf, Cx};
use cpu_executor::kv_cache::KvType;
use cpu_executor::prelude::*;
use cpu_executor::qwen4exp::linear::sigmoid;
use cpu_executor::qwen4exp::{PleBlock, QsaProjections};
use gpu_executor::abi;
use gpu_executor::ops::{
    GdnBuffers, GdnShape, GpuOps, GrShape, KvFormat, PleBuffers, PleShape, QsaBuffers, QsaIndexerShape, QsaShape,
};
use model::Mat;
use model::qwen4exp::gdn::{Gdn, GdnMode};
use model::qwen4exp::gr::HyperConn;
use model::qwen4exp::{Indexer, Qsa};

pub fn checks() -> Vec<Check> {
    vec![
        Check::new(
            "gdn_mix",
            vec![abi::GDN_CONV_SILU, abi::GDN_L2_NORM, abi::GDN_DELTA_RULE_S128, abi::GDN_GATED_NORM],
            "qwen4exp::gdn::Gdn::mix (recurrent)",
            |cx| gdn_mix(cx, 128, None),
        ),
        Check::new(
            "gdn_mix head dim 64",
            vec![abi::GDN_CONV_SILU, abi::GDN_L2_NORM, abi::GDN_DELTA_RULE, abi::GDN_GATED_NORM],
            "qwen4exp::gdn::Gdn::mix (recurrent)",
            |cx| gdn_mix(cx, 64, None),
        ),
        Check::new(
            "gdn_prefill chunked",
            vec![abi::GDN_CONV_SILU, abi::GDN_L2_NORM, abi::GDN_DELTA_CHUNKED, abi::GDN_GATED_NORM],
            "qwen4exp::gdn::Gdn::mix (chunked)",
            |cx| gdn_mix(cx, 128, Some(16)),
        ),
        Check::new(
            "gr read and write",
            vec![abi::GR_STREAM_NORM, abi::GR_LOWRANK_ACT, abi::GR_GATE_MIX, abi::GR_COMBINE],
            "qwen4exp::gr::HyperConn (norm_streams bitwise, lowrank_act, gate_mix, combine)",
            gr,
        ),
        Check::new("ple_block", vec![abi::PLE_GATE, abi::PLE_CONV], "PleBlock::mix (cpu::qwen4exp::ple)", ple_block),
        Check::new(
            "qsa_mix",
            vec![abi::QSA_NORM_ROPE, abi::QSA_BLOCK_KEYS, abi::QSA_INDEX_SCORES, abi::QSA_SELECT_TOPK, abi::QSA_ATTEND],
            "Qsa::mix (cpu::qwen4exp::qsa: kept cells exact, output within QSA_TOL)",
            |cx| qsa_mix(cx, KvType::F16),
        ),
        Check::new(
            "qsa_mix int8 cache",
            vec![
                abi::QSA_NORM_ROPE,
                abi::QSA_BLOCK_KEYS_I8,
                abi::QSA_INDEX_SCORES,
                abi::QSA_SELECT_TOPK,
                abi::QSA_ATTEND_I8,
            ],
            "Qsa::mix on an int8 QsaCache (kept cells exact, output within QSA_TOL)",
            |cx| qsa_mix(cx, KvType::Int8),
        ),
        Check::new(
            abi::MOE_SHARED_ADD,
            vec![abi::MOE_SHARED_ADD],
            "qwen4exp::moe's shared-expert add (libm sigmoid)",
            moe_shared_add,
        ),
    ]
}

fn moe_shared_add(cx: &mut Cx) -> CheckResultOf<()> {
    let (d, n) = if cx.full { (2560usize, 8usize) } else { (300, 3) };
    let (out, sh, gate) = (cx.rand_f32(n * d, 2.0), cx.rand_f32(n * d, 2.0), cx.rand_f32(n, 6.0));
    let mut want = out.clone();
    for t in 0..n {
        let g = sigmoid(gate[t]);
        want[t * d..(t + 1) * d].iter_mut().zip(&sh[t * d..(t + 1) * d]).for_each(|(a, &b)| *a += g * b);
    }
    let (ob, sb, gb) = (cx.upf(&out)?, cx.upf(&sh)?, cx.upf(&gate)?);
    cx.ops.moe_shared_add(cx.s, ob, sb, gb, d as u32, n as u32)?;
    let got = cx.read_f32(ob, n * d)?;
    cx.cmp_rel_floor1("out", &got, &want, GR_TOL);
    cx.set_shape(format!("{n} x {d}"));
    cx.bench((n * d * 12 + n * 4) as u64, &|o, s| o.moe_shared_add(s, ob, sb, gb, d as u32, n as u32))
}

/// `s` = 128: the register-state kernel; any other head dim: the generic one; `chunk`: the
/// chunked (prefill) kernel over a prompt of several chunks.
fn gdn_mix(cx: &mut Cx, s: usize, chunk: Option<usize>) -> CheckResultOf<()> {
    // Flash-Next's layer (16 key / 48 value heads of 128, K = 4) on a card; fewer heads on emu.
    let (hk, hv, k, n) = match (cx.full, chunk) {
        (true, None) => (16usize, 48usize, 4usize, 8usize),
        (true, Some(_)) => (16, 48, 4, 512),
        (false, None) => (2, 4, 4, 3),
        (false, Some(_)) => (2, 4, 4, 40),
    };
    let c = (2 * hk + hv) * s;
    let unused = || Mat::from_f32(1, 1, &[0.0]).expect("1x1 matrix");
    let g = Gdn {
        hk,
        hv,
        s,
        conv_k: k,
        eps: 1e-6,
        qkv: unused(),
        gate: unused(),
        conv: cx.rand_f32(c * k, 0.6),
        dt_bias: cx.rand_f32(hv, 0.5).iter().map(|v| v - 1.0).collect(),
        a: cx.rand_f32(hv, 1.0).iter().map(|v| -v.exp()).collect(),
        beta: unused(),
        alpha: unused(),
        norm: cx.rand_f32(s, 0.1).iter().map(|v| 1.0 + v).collect(),
        out: unused(),
    };
    let mut st = g.new_state();
    st.conv = cx.rand_f32(st.conv.len(), 1.5);
    st.m = cx.rand_f32(st.m.len(), 0.3);
    let (m, z) = (cx.rand_f32(n * c, 2.0), cx.rand_f32(n * hv * s, 3.0));
    let (beta, alpha) = (cx.rand_f32(n * hv, 3.0), cx.rand_f32(n * hv, 2.0));
    let shape = GdnShape { hk: hk as u32, hv: hv as u32, head_dim: s as u32, conv_k: k as u32, eps: g.eps };
    let b = GdnBuffers {
        m: cx.upf(&m)?,
        z: cx.upf(&z)?,
        beta: cx.upf(&beta)?,
        alpha: cx.upf(&alpha)?,
        taps: cx.upf(&g.conv)?,
        dt_bias: cx.upf(&g.dt_bias)?,
        ssm_a: cx.upf(&g.a)?,
        norm: cx.upf(&g.norm)?,
        conv_state: cx.upf(&st.conv)?,
        delta_state: cx.upf(&st.m)?,
        u: cx.zeros(n * c * 4)?,
        o: cx.zeros(n * hv * s * 4)?,
        // The output's Q8_1 rows as well, when whole blocks.
        o_q8_1: if s.is_multiple_of(32) { cx.zeros(n * hv * s / 32 * 36)? } else { 0 },
    };
    let mode = chunk.map_or(GdnMode::Recurrent, GdnMode::Chunked);
    let want = g.mix(&m, &z, &beta, &alpha, n, &mut st, mode);
    let delta = cx.zeros(2 * hv * chunk.unwrap_or(1) * s * 4)?;
    match chunk {
        Some(c) => cx.ops.gdn_prefill(cx.s, &shape, &b, n as u32, c as u32, delta)?,
        None => cx.ops.gdn_mix(cx.s, &shape, &b, n as u32)?,
    }
    let got = cx.read_f32(b.o, n * hv * s)?;
    cx.cmp_rel_floor1("o", &got, &want, GDN_TOL);
    if b.o_q8_1 != 0 {
        // Of the device's own output (within GDN_TOL of the host's, not equal): `quant`'s bytes.
        let mut want_q = vec![0u8; got.len() / 32 * 36];
        quant::quantize_row(quant::GgmlType::Q8_1, &got, &mut want_q)
            .map_err(|e| format!("quantize_row(Q8_1): {e:?}"))?;
        let got_q = cx.read(b.o_q8_1, want_q.len())?;
        cx.cmp_bytes("o, its Q8_1", &got_q, &want_q);
    }
    let got = cx.read_f32(b.conv_state, st.conv.len())?;
    cx.cmp_rel_floor1("conv state", &got, &st.conv, GDN_TOL);
    let got = cx.read_f32(b.delta_state, st.m.len())?;
    cx.cmp_rel_floor1("delta state", &got, &st.m, GDN_TOL);
    let chunks = chunk.map_or(1, |c| n.div_ceil(c));
    cx.set_shape(match chunk {
        Some(c) => format!("Hk {hk} Hv {hv} S {s} K {k}, {n} tokens in chunks of {c}"),
        None => format!("Hk {hk} Hv {hv} S {s} K {k}, {n} tokens"),
    });
    // Ideal bytes: the state read and written once (once a chunk when chunked), inputs and
    // outputs once.
    let ideal = 4 * (2 * chunks * st.m.len() + 2 * st.conv.len() + n * (c + 2 * hv * s + 2 * hv) + n * hv * s);
    cx.bench(ideal as u64, &|o, s_| match chunk {
        Some(ch) => o.gdn_prefill(s_, &shape, &b, n as u32, ch as u32, delta),
        None => o.gdn_mix(s_, &shape, &b, n as u32),
    })
}

fn gr(cx: &mut Cx) -> CheckResultOf<()> {
    // Flash-Next: 4 streams of 2560, low rank 320 (the matmuls run on the host here).
    let (hc, e, lr, n) = if cx.full { (4usize, 2560usize, 320usize, 8usize) } else { (4, 256, 32, 3) };
    let mat = |cx: &mut Cx, rows: usize, cols: usize| {
        Mat::from_f32(rows, cols, &cx.rand_f32(rows * cols, 0.05)).expect("f32 matrix")
    };
    let h = HyperConn {
        hc,
        n_embd: e,
        eps: 1e-6,
        norm: cx.rand_f32(hc * e, 0.1).iter().map(|v| 1.0 + v).collect(),
        down: mat(cx, lr, hc * e),
        up: mat(cx, hc * e, lr),
        inject: None,
    };
    let shape = GrShape { hc: hc as u32, e: e as u32, eps: h.eps };
    let r = cx.rand_f32(n * hc * e, 2.0);
    let want_flat = h.norm_streams(&r, n);
    let (rb, gb, fb) = (cx.upf(&r)?, cx.upf(&h.norm)?, cx.zeros(n * hc * e * 4)?);
    let q8_1 = |x: &[f32]| -> CheckResultOf<Vec<u8>> {
        let mut q = vec![0u8; x.len() / 32 * 36];
        quant::quantize_row(quant::GgmlType::Q8_1, x, &mut q).map_err(|e| format!("quantize_row(Q8_1): {e:?}"))?;
        Ok(q)
    };
    // The fused Q8_1 output: `quant`'s bytes for the rows (those `quantize_q8_1` writes).
    let fq = cx.zeros(n * hc * e / 32 * 36)?;
    cx.ops.gr_stream_norm(cx.s, &shape, rb, gb, fb, Some(fq), n as u32)?;
    let got = cx.read_f32(fb, n * hc * e)?;
    cx.cmp_bits("stream norm", &got, &want_flat);
    let got = cx.read(fq, n * hc * e / 32 * 36)?;
    cx.cmp_bytes("stream norm, its Q8_1", &got, &q8_1(&want_flat)?);

    let mut lo = vec![0f32; n * lr];
    h.down.matmul(&want_flat, n, &mut lo);
    let lob = cx.upf(&lo)?;
    h.lowrank_act(&mut lo);
    let lq = cx.zeros(n * lr / 32 * 36)?;
    cx.ops.gr_lowrank_act(cx.s, &shape, lob, Some((lq, lr as u32)), (n * lr) as u32)?;
    let got = cx.read_f32(lob, n * lr)?;
    cx.cmp_rel_floor1("low-rank act", &got, &lo, GR_TOL);
    // Of the device's own values (the act is within GR_TOL of the host's, not equal).
    let want_q = q8_1(&got)?;
    let got = cx.read(lq, n * lr / 32 * 36)?;
    cx.cmp_bytes("low-rank act, its Q8_1", &got, &want_q);

    let mut gate = vec![0f32; n * hc * e];
    h.up.matmul(&lo, n, &mut gate);
    let mut want_x = vec![0f32; n * e];
    h.gate_mix(&want_flat, &gate, n, &mut want_x);
    let (gab, xb) = (cx.upf(&gate)?, cx.zeros(n * e * 4)?);
    cx.ops.gr_gate_mix(cx.s, &shape, fb, gab, xb, n as u32)?;
    let got = cx.read_f32(xb, n * e)?;
    cx.cmp_rel_floor1("gate mix", &got, &want_x, GR_TOL);

    let (y, inj) = (cx.rand_f32(n * e, 1.0), cx.rand_f32(n * hc, 4.0));
    let mut want_r = r.clone();
    h.combine(&mut want_r, n, &y, &inj);
    let (yb, ib) = (cx.upf(&y)?, cx.upf(&inj)?);
    cx.ops.gr_combine(cx.s, &shape, rb, yb, ib, n as u32)?;
    let got = cx.read_f32(rb, n * hc * e)?;
    cx.cmp_rel_floor1("combine", &got, &want_r, GR_TOL);
    cx.set_shape(format!("{hc} streams x {e}, {n} tokens"));
    cx.bench((n * hc * e * 8 + hc * e * 4) as u64, &|o, s| o.gr_stream_norm(s, &shape, rb, gb, fb, None, n as u32))
}

/// A prefix long enough for sparse selection, then a window of `n` tokens measured: its output
/// against `Qsa::mix`, its kept cells exactly.
fn qsa_mix(cx: &mut Cx, kv_type: KvType) -> CheckResultOf<()> {
    // Flash-Next's attention (24 / 2 heads of 256, 64 roped dims) at 4096 cells on a card; a
    // small layer on emu.
    let ((h, kv, d, rot), (ih, idim, top_k, ratio), (ctx, n)) = if cx.full {
        ((24usize, 2usize, 256usize, 64usize), (4usize, 128usize, 1024usize, 4usize), (4096usize, 8usize))
    } else {
        ((4, 2, 32, 16), (2, 32, 8, 4), (40, 3))
    };
    let unused = || Mat::from_f32(1, 1, &[0.0]).expect("1x1 matrix");
    let norm = |cx: &mut Cx, len: usize| cx.rand_f32(len, 0.3).iter().map(|v| 1.0 + v).collect::<Vec<f32>>();
    let q = Qsa {
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
        q_norm: norm(cx, d),
        k_norm: norm(cx, d),
        indexer: Some(Indexer {
            heads: ih,
            dim: idim,
            top_k,
            ratio,
            q: unused(),
            k: unused(),
            q_norm: norm(cx, idim),
            k_norm: norm(cx, idim),
        }),
    };
    let shape = QsaShape {
        n_head: h as u32,
        n_head_kv: kv as u32,
        head_dim: d as u32,
        n_rot: rot as u32,
        eps: q.eps,
        indexer: Some(QsaIndexerShape { heads: ih as u32, dim: idim as u32, top_k: top_k as u32, ratio: ratio as u32 }),
        kv: if kv_type == KvType::Int8 { KvFormat::Int8 } else { KvFormat::F16 },
    };
    let budget = top_k + ratio - 1;
    let max_blocks = ctx / ratio;
    let m = ctx - n;
    let proj = |cx: &mut Cx, t: usize| QsaProjections {
        qf: cx.rand_f32(t * h * 2 * d, 3.0),
        kp: cx.rand_f32(t * kv * d, 3.0),
        vp: cx.rand_f32(t * kv * d, 2.0),
        kappa: cx.rand_f32(t * idim, 2.0),
        iq: cx.rand_f32(t * ih * idim, 2.0),
    };
    let consts = [cx.upf(&q.q_norm)?, cx.upf(&q.k_norm)?];
    let ix = q.indexer.as_ref().expect("indexer");
    let (iqn, ikn) = (cx.upf(&ix.q_norm)?, cx.upf(&ix.k_norm)?);
    let table = cx.upf(&GpuOps::rope_table_ggml(q.rope_base, 1.0, rot, ctx))?;
    let cache = [
        cx.zeros(ctx * kv * d * 2)?,
        cx.zeros(ctx * kv * d * 2)?,
        cx.zeros(ctx * idim * 2)?,
        cx.zeros(max_blocks.max(1) * idim * 4)?,
    ];
    let scales = [cx.zeros(ctx * kv * 4)?, cx.zeros(ctx * kv * 4)?, cx.zeros(ctx * 4)?];
    let t_max = m.max(n);
    let scratch = [
        cx.zeros(t_max * h * d * 4)?,
        cx.zeros(t_max * kv * d * 4)?,
        cx.zeros(t_max * ih * idim * 4)?,
        cx.zeros(t_max * max_blocks.max(1) * 4)?,
        cx.zeros(t_max * budget * 4)?,
        cx.zeros(t_max * 4)?,
        cx.zeros(t_max * h * d * 4)?,
    ];
    let mut cpu_cache = q.new_cache(kv_type);
    let mut want = (Vec::new(), Vec::new());
    let mut launch = None;
    for (start, t) in [(0usize, m), (m, n)] {
        let p = proj(cx, t);
        let pos: Vec<u32> = (start..start + t).map(|c| c as u32).collect();
        let b = QsaBuffers {
            qf: cx.upf(&p.qf)?,
            kp: cx.upf(&p.kp)?,
            vp: cx.upf(&p.vp)?,
            kappa_p: cx.upf(&p.kappa)?,
            iq_p: cx.upf(&p.iq)?,
            q_norm: consts[0],
            k_norm: consts[1],
            iq_norm: iqn,
            ik_norm: ikn,
            rope_table: table,
            pos: cx.upu(&pos)?,
            k_cache: cache[0],
            v_cache: cache[1],
            kappa_cache: cache[2],
            k_scale: scales[0],
            v_scale: scales[1],
            kappa_scale: scales[2],
            blocks: cache[3],
            q: scratch[0],
            k: scratch[1],
            iq: scratch[2],
            score: scratch[3],
            sel: scratch[4],
            sel_n: scratch[5],
            out: scratch[6],
        };
        want = q.mix(&p, t, start, &mut cpu_cache, true);
        cx.ops.qsa_mix(cx.s, &shape, &b, t as u32, start as u32, ctx as u32)?;
        launch = Some(b);
    }
    let b = launch.expect("two windows");
    let got = cx.read_f32(b.out, n * h * d)?;
    cx.cmp_rel_floor1("out", &got, &want.0, QSA_TOL);
    let (sel, counts) = (cx.read_u32(b.sel, n * budget)?, cx.read_u32(b.sel_n, n)?);
    let (mut got_ids, mut want_ids) = (Vec::new(), Vec::new());
    for t in 0..n {
        got_ids.extend_from_slice(&sel[t * budget..t * budget + (counts[t] as usize).min(budget)]);
        want_ids.extend(want.1[t].iter().map(|&c| c as u32));
    }
    cx.cmp_ids("kept cells", &got_ids, &want_ids);
    cx.set_shape(format!("H {h}/{kv} D {d} rot {rot}, indexer {ih}x{idim} top {top_k} r {ratio}, {n} tokens at {m}"));
    // Ideal bytes: the kept K and V rows (f16) and the block keys scored, once per token.
    let cells = budget.min(ctx);
    let ideal = n * (kv * cells * d * 2 * 2 + max_blocks * idim * 4);
    // Re-running the window on the same cells rewrites them with the same values.
    cx.bench(ideal as u64, &|o, s| o.qsa_mix(s, &shape, &b, n as u32, m as u32, ctx as u32))
}

/// The PLE block over a window with a conv history, against `PleBlock::mix`.
fn ple_block(cx: &mut Cx) -> CheckResultOf<()> {
    // Flash-Next's block (4 streams of 2560, 4 taps of dilation 3) on a card; narrower on emu.
    let (hc, e, kp, dil, n) = if cx.full { (4usize, 2560usize, 4usize, 3usize, 8usize) } else { (4, 64, 4, 3, 3) };
    let hce = hc * e;
    let norms: Vec<f32> = cx.rand_f32(3 * hce, 0.2).iter().map(|v| 1.0 + v).collect();
    let conv = cx.rand_f32(hce * kp, 0.6);
    let blk = PleBlock {
        hc,
        e,
        eps: 1e-6,
        conv_kernel: kp,
        dilation: dil,
        norm_key: &norms[..hce],
        norm_query: &norms[hce..2 * hce],
        norm_conv: &norms[2 * hce..],
        conv: &conv,
    };
    let mut hist = cx.rand_f32((kp - 1) * dil * hce, 1.0);
    let (key, val, r) = (cx.rand_f32(n * hce, 2.0), cx.rand_f32(n * e, 2.0), cx.rand_f32(n * hce, 3.0));
    let shape = PleShape { hc: hc as u32, e: e as u32, conv_kernel: kp as u32, dilation: dil as u32, eps: blk.eps };
    let b = PleBuffers {
        key: cx.upf(&key)?,
        val: cx.upf(&val)?,
        r: cx.upf(&r)?,
        norms: cx.upf(&norms)?,
        taps: cx.upf(&conv)?,
        hist: cx.upf(&hist)?,
        gv: cx.zeros(n * hce * 4)?,
        nn: cx.zeros(n * hce * 4)?,
    };
    let mut want = r.clone();
    blk.mix(&key, &val, &mut want, n, &mut hist);
    cx.ops.ple_block(cx.s, &shape, &b, n as u32)?;
    let got = cx.read_f32(b.r, n * hce)?;
    cx.cmp_rel_floor1("streams", &got, &want, PLE_TOL);
    let got = cx.read_f32(b.hist, hist.len())?;
    cx.cmp_rel_floor1("conv history", &got, &hist, PLE_TOL);
    cx.set_shape(format!("hc {hc} E {e} Kp {kp} N {dil}, {n} tokens"));
    // Ideal bytes: key, r (read and written), gv and nn (written, read), val, the history
    // (read and written), the constants once.
    let ideal = 4 * (n * hce * 6 + n * e + 2 * hist.len() + 3 * hce + hce * kp);
    cx.bench(ideal as u64, &|o, s| o.ple_block(s, &shape, &b, n as u32))
}
