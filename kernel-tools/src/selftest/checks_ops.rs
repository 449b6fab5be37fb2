//! Selftest checks of the forward-pass kernels: rms_norm (both orders), rope (NEOX, normal,
//! ggml), glu, add_rows, scale, converts, softmax, kv_store, attention (ordered and WMMA fast,
//! every head dim and cache format), the MoE router and combine, the ordered GELU table, and
//! the cross-lane reduction kernels. References: `cpu_kernels`, cpu-executor/src/kv_cache.rs,
//! `cpu::attention::{attend, attend_ordered}`, `cpu::moe::top_k`, `quant`'s conversions.
use super::reference::{self as refs, raw_kv_bytes, router_reference};
use super::{Check, CheckResultOf, Cx};
use cpu_executor::attention::{Shape, attend, attend_ordered};
use cpu_executor::kv_cache::{KvCache, KvType, LayerCache};
use gpu_executor::abi;
use gpu_executor::device::{DevicePtr, GpuError, Stream};
use gpu_executor::ops::{AttnMode, GluAct, GpuOps, KvFormat};

type NormLaunch = fn(&GpuOps, &Stream, DevicePtr, DevicePtr, DevicePtr, u32, u32, f32) -> Result<(), GpuError>;
type NormRef = fn(&[f32], &[f32], f32, &mut [f32]);
type RopeRef = fn(&mut [f32], usize, usize, usize, usize, f32, f32);

pub fn checks() -> Vec<Check> {
    let mut v = Vec::new();
    for (name, ggml, launch, reference) in [
        ("rms_norm_f32", false, GpuOps::rms_norm as NormLaunch, cpu_kernels::rms_norm as NormRef),
        ("rms_norm_f32 ggml order", true, GpuOps::rms_norm_ggml as NormLaunch, cpu_kernels::rms_norm_ggml as NormRef),
    ] {
        let r = if ggml { "cpu_kernels::rms_norm_ggml" } else { "cpu_kernels::rms_norm" };
        v.push(Check::new(name, vec![abi::RMS_NORM], r, move |cx| rms_norm(cx, launch, reference)));
    }
    for (name, neox, fma, reference, r) in [
        ("rope_f32 neox", true, false, cpu_kernels::rope_neox as RopeRef, "cpu_kernels::rope_neox"),
        ("rope_f32 normal", false, false, cpu_kernels::rope_norm as RopeRef, "cpu_kernels::rope_norm"),
        ("rope_f32 neox ggml", true, true, cpu_kernels::rope_neox_ggml as RopeRef, "cpu_kernels::rope_neox_ggml"),
    ] {
        v.push(Check::new(name, vec![abi::ROPE], r, move |cx| rope(cx, neox, fma, reference)));
    }
    for (name, act, r) in [
        ("glu_f32 silu", GluAct::Silu, "cpu_kernels::swiglu"),
        ("glu_f32 gelu", GluAct::GeluTanh, "cpu_kernels::geglu"),
    ] {
        v.push(Check::new(name, vec![abi::GLU], r, move |cx| glu(cx, act)));
    }
    v.push(Check::new(abi::ADD_ROWS, vec![abi::ADD_ROWS], "f32 adds on the host", add_rows));
    v.push(Check::new(abi::SCALE, vec![abi::SCALE], "f32 multiplies on the host", scale));
    v.push(Check::new(abi::CONVERT_F32_F16, vec![abi::CONVERT_F32_F16], "quant::f32_to_f16", |cx| convert(cx, false)));
    v.push(Check::new(abi::CONVERT_F32_BF16, vec![abi::CONVERT_F32_BF16], "quant::f32_to_bf16", |cx| {
        convert(cx, true)
    }));
    v.push(Check::new(abi::SOFTMAX, vec![abi::SOFTMAX], "cpu_kernels::softmax", softmax));
    v.push(Check::new(
        abi::LOGITS_TOP,
        vec![abi::LOGITS_TOP],
        "the drafters' argmax and its softmax probability",
        logits_top,
    ));
    v.push(Check::new(abi::KV_STORE_F16, vec![abi::KV_STORE_F16], "kv_cache KvLayer::write (f16)", |cx| {
        kv_store(cx, KvFormat::F16)
    }));
    v.push(Check::new(abi::KV_STORE_I8, vec![abi::KV_STORE_I8], "kv_cache KvLayer::write (int8)", |cx| {
        kv_store(cx, KvFormat::Int8)
    }));
    for &(int8, hd, name) in abi::ATTN_KERNELS {
        v.push(Check::new(name, vec![name], "attention::attend_ordered (bitwise)", move |cx| {
            attention(cx, AttnMode::Ordered, int8, hd as usize)
        }));
    }
    for &(int8, hd, name) in abi::ATTN_FAST_KERNELS {
        v.push(Check::new(name, vec![name], "attention::attend", move |cx| {
            attention(cx, AttnMode::Fast, int8, hd as usize)
        }));
    }
    v.push(Check::new(
        abi::MOE_ROUTER,
        vec![abi::MOE_ROUTER],
        "cpu_kernels::softmax + moe::top_k + renorm",
        moe_router,
    ));
    v.push(Check::new(
        abi::MOE_COMBINE,
        vec![abi::MOE_COMBINE],
        "weighted adds in rank order on the host",
        moe_combine,
    ));
    v.push(Check::new(
        abi::MOE_SLOT_MAP,
        vec![abi::MOE_SLOT_MAP],
        "table lookup and miss rows on the host",
        moe_slot_map,
    ));
    v.push(Check::new(
        abi::MOE_SORT_SLOTS,
        vec![abi::MOE_SORT_SLOTS],
        "stable sort by expert of each block on the host",
        moe_sort_slots,
    ));
    v.push(Check::new(abi::GEGLU_TABLE, vec![abi::GEGLU_TABLE], "cpu_kernels::geglu_ggml", geglu_table));
    for &(method, values, name) in abi::REDUCE_KERNELS {
        v.push(Check::new(name, vec![name], "xor butterfly on the host (bench::butterfly)", move |cx| {
            reduce(cx, name, method, values)
        }));
    }
    v
}

fn rms_norm(cx: &mut Cx, launch: NormLaunch, reference: NormRef) -> CheckResultOf<()> {
    let shapes: &[(usize, usize)] = if cx.full { &[(7, 2), (4096, 64)] } else { &[(7, 2), (100, 3), (2560, 9)] };
    let eps = 1e-6;
    let mut timed = (0, 0, 0, 0, 0);
    for &(n, rows) in shapes {
        let x = cx.rand_f32(n * rows, 4.0);
        let w = cx.rand_f32(n, 2.0);
        let mut want = vec![0f32; n * rows];
        for r in 0..rows {
            reference(&x[r * n..(r + 1) * n], &w, eps, &mut want[r * n..(r + 1) * n]);
        }
        let (xb, wb, y) = (cx.upf(&x)?, cx.upf(&w)?, cx.zeros(n * rows * 4)?);
        launch(cx.ops, cx.s, xb, wb, y, n as u32, rows as u32, eps)?;
        let got = cx.read_f32(y, n * rows)?;
        cx.cmp_bits(&format!("{rows} x {n}"), &got, &want);
        launch(cx.ops, cx.s, xb, wb, xb, n as u32, rows as u32, eps)?;
        let got = cx.read_f32(xb, n * rows)?;
        cx.cmp_bits(&format!("{rows} x {n} in place"), &got, &want);
        timed = (xb, wb, y, n, rows);
    }
    let (xb, wb, y, n, rows) = timed;
    cx.set_shape(format!("{rows} x {n}"));
    cx.bench((rows * n * 8 + n * 4) as u64, &|o, s| launch(o, s, xb, wb, y, n as u32, rows as u32, eps))
}

fn rope(cx: &mut Cx, neox: bool, fma: bool, reference: RopeRef) -> CheckResultOf<()> {
    // (head_dim, rope_dim, heads, tokens): partial rope_dim, head_dim 32..256.
    let mut shapes = vec![(64usize, 64usize, 4usize, 1usize), (128, 64, 3, 2), (256, 256, 1, 8), (32, 32, 4, 5)];
    if cx.full {
        shapes.push((128, 128, 32, 64));
    }
    let (base, fscale) = (10000.0f32, 1.0f32);
    let n_pos = if cx.full { 4096 } else { 300 };
    let mut timed = None;
    for (hd, rd, nh, nt) in shapes {
        let pos: Vec<u32> = (0..nt)
            .map(|i| if i == 0 { n_pos as u32 - 1 } else { (cx.rng.next_u64() % n_pos as u64) as u32 })
            .collect();
        let x = cx.rand_f32(nt * nh * hd, 2.0);
        let table = if fma {
            GpuOps::rope_table_ggml(base, fscale, rd, n_pos)
        } else {
            GpuOps::rope_table(base, fscale, rd, n_pos)
        };
        let mut want = x.clone();
        for (t, &p) in pos.iter().enumerate() {
            reference(&mut want[t * nh * hd..(t + 1) * nh * hd], nh, hd, rd, p as usize, base, fscale);
        }
        let (xb, pb, tb) = (cx.upf(&x)?, cx.upu(&pos)?, cx.upf(&table)?);
        cx.ops.rope(cx.s, xb, pb, tb, nt as u32, nh as u32, hd as u32, rd as u32, neox, fma)?;
        let got = cx.read_f32(xb, x.len())?;
        cx.cmp_bits(&format!("head_dim {hd}, rope_dim {rd}, {nh} heads x {nt} tokens"), &got, &want);
        timed = Some((xb, pb, tb, hd, rd, nh, nt));
    }
    let Some((xb, pb, tb, hd, rd, nh, nt)) = timed else { return Ok(()) };
    cx.set_shape(format!("{nt} tok x {nh} heads x {hd} (rope {rd})"));
    let ideal = nt * nh * hd * 8 + nt * rd * 4 + nt * 4;
    cx.bench(ideal as u64, &|o, s| o.rope(s, xb, pb, tb, nt as u32, nh as u32, hd as u32, rd as u32, neox, fma))
}

fn glu(cx: &mut Cx, act: GluAct) -> CheckResultOf<()> {
    let n = if cx.full { 14336 * 8 } else { 8192 };
    let mut g = cx.rand_f32(n, 12.0);
    g[..6].copy_from_slice(&[0.0, -0.0, 30.0, -30.0, 1e-8, -95.0]);
    let u = cx.rand_f32(n, 3.0);
    let mut want = vec![0f32; n];
    match act {
        GluAct::Silu => cpu_kernels::swiglu(&g, &u, &mut want),
        GluAct::GeluTanh => cpu_kernels::geglu(&g, &u, &mut want),
    }
    let (gb, ub, o) = (cx.upf(&g)?, cx.upf(&u)?, cx.zeros(n * 4)?);
    cx.ops.glu(cx.s, gb, ub, o, n as u32, act)?;
    let got = cx.read_f32(o, n)?;
    cx.cmp_rel_floor1("out", &got, &want, refs::GLU_TOL);
    cx.set_shape(format!("{n}"));
    cx.bench((n * 12) as u64, &|o_, s| o_.glu(s, gb, ub, o, n as u32, act))
}

fn add_rows(cx: &mut Cx) -> CheckResultOf<()> {
    // (n, rows, stride of b; 0 broadcasts one row)
    let shapes: &[(usize, usize, usize)] =
        if cx.full { &[(64, 3, 0), (4096, 64, 4096)] } else { &[(1, 1, 1), (64, 3, 0), (100, 2, 128), (300, 4, 300)] };
    let mut timed = (0, 0, 0, 0, 0);
    for &(n, rows, stride) in shapes {
        let x = cx.rand_f32(n * rows, 5.0);
        let b = cx.rand_f32(stride * rows + n, 5.0);
        let mut want = x.clone();
        for r in 0..rows {
            for i in 0..n {
                want[r * n + i] += b[r * stride + i];
            }
        }
        let (xb, bb) = (cx.upf(&x)?, cx.upf(&b)?);
        cx.ops.add_rows(cx.s, xb, bb, n as u32, rows as u32, stride as u32)?;
        let got = cx.read_f32(xb, n * rows)?;
        cx.cmp_bits(&format!("{rows} x {n}, b stride {stride}"), &got, &want);
        timed = (xb, bb, n, rows, stride);
    }
    let (xb, bb, n, rows, stride) = timed;
    cx.set_shape(format!("{rows} x {n}"));
    let b_bytes = if stride == 0 { n * 4 } else { n * rows * 4 };
    cx.bench((n * rows * 8 + b_bytes) as u64, &|o, s| o.add_rows(s, xb, bb, n as u32, rows as u32, stride as u32))
}

fn scale(cx: &mut Cx) -> CheckResultOf<()> {
    let n = if cx.full { 4096 * 64 } else { 1000 };
    let x = cx.rand_f32(n, 5.0);
    let xb = cx.upf(&x)?;
    cx.ops.scale(cx.s, xb, n as u32, 0.3)?;
    let got = cx.read_f32(xb, n)?;
    let want: Vec<f32> = x.iter().map(|v| v * 0.3).collect();
    cx.cmp_bits("x * 0.3", &got, &want);
    cx.set_shape(format!("{n}"));
    cx.bench((n * 8) as u64, &|o, s| o.scale(s, xb, n as u32, 1.0))
}

fn convert(cx: &mut Cx, bf16: bool) -> CheckResultOf<()> {
    let n_random: i32 = if cx.full { 4096 * 64 } else { 4000 };
    let mut x: Vec<f32> = (0..n_random).map(|i| cx.rng.symmetric() * 2f32.powi(i % 60 - 30)).collect();
    x.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 65504.0, 65520.0, 1e-8, -6e-5, 3.4e38]);
    // Exact ties halfway between two bf16 / f16 values (round to even both ways), NaN payloads.
    x.extend([0x3f80_8000u32, 0x3f81_8000, 0x3f80_1000, 0x3f80_3000, 0x7fc0_0001, 0xff80_0001].map(f32::from_bits));
    let n = x.len();
    let (xb, y) = (cx.upf(&x)?, cx.zeros(n * 2)?);
    let launch = |o: &GpuOps, s: &Stream| {
        if bf16 { o.convert_f32_bf16(s, xb, y, n as u32) } else { o.convert_f32_f16(s, xb, y, n as u32) }
    };
    launch(cx.ops, cx.s)?;
    let got = cx.read_u16(y, n)?;
    let want: Vec<u16> = x.iter().map(|&v| if bf16 { quant::f32_to_bf16(v) } else { quant::f32_to_f16(v) }).collect();
    cx.cmp_halves(if bf16 { "bf16" } else { "f16" }, &got, &want, bf16);
    cx.set_shape(format!("{n} values incl. ties, subnormals, inf, NaN"));
    cx.bench((n * 6) as u64, &launch)
}

fn softmax(cx: &mut Cx) -> CheckResultOf<()> {
    let shapes: &[(usize, usize)] =
        if cx.full { &[(37, 3), (4096, 64)] } else { &[(1, 1), (37, 3), (151, 9), (4096, 2)] };
    let mut timed = (0, 0, 0);
    for &(n, rows) in shapes {
        let mut x = cx.rand_f32(n * rows, 20.0);
        if n > 4 {
            x[1] = f32::NEG_INFINITY; // a masked entry
        }
        let mut want = x.clone();
        want.chunks_mut(n).for_each(cpu_kernels::softmax);
        let xb = cx.upf(&x)?;
        cx.ops.softmax(cx.s, xb, n as u32, rows as u32)?;
        let got = cx.read_f32(xb, n * rows)?;
        cx.cmp_abs(&format!("{rows} x {n}"), &got, &want, refs::PROB_TOL);
        timed = (xb, n, rows);
    }
    // A fully masked row becomes zeros, as on the CPU.
    let xb = cx.upf(&[f32::NEG_INFINITY; 5])?;
    cx.ops.softmax(cx.s, xb, 5, 1)?;
    let got = cx.read_f32(xb, 5)?;
    cx.cmp_bits("fully masked row", &got, &[0.0; 5]);
    let (xb, n, rows) = timed;
    cx.set_shape(format!("{rows} x {n}"));
    cx.bench((n * rows * 8) as u64, &|o, s| o.softmax(s, xb, n as u32, rows as u32))
}

fn logits_top(cx: &mut Cx) -> CheckResultOf<()> {
    let shapes: &[(usize, usize)] =
        if cx.full { &[(1000, 3), (151_936, 2)] } else { &[(1, 1), (31, 2), (1000, 3), (4099, 2)] };
    let mut timed = (0, 0, 0, 0);
    for &(n, rows) in shapes {
        let mut x = cx.rand_f32(n * rows, 8.0);
        // Ties: the largest value again further on (the lower index must win), and -inf.
        for r in 0..rows {
            let row = &mut x[r * n..(r + 1) * n];
            if n > 4 {
                row[3] = 50.0 + r as f32;
                row[n - 1] = row[3];
                row[1] = f32::NEG_INFINITY;
            }
        }
        let want: Vec<(u32, f32)> = x
            .chunks(n)
            .map(|row| {
                let t = row
                    .iter()
                    .enumerate()
                    .fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 || i == 0 { (i, v) } else { b })
                    .0;
                let sum: f64 = row.iter().map(|&l| ((l - row[t]) as f64).exp()).sum();
                (t as u32, (1.0 / sum) as f32)
            })
            .collect();
        let xb = cx.upf(&x)?;
        let ob = cx.upf(&vec![0f32; 2 * rows])?;
        cx.ops.logits_top(cx.s, xb, ob, n as u32, rows as u32)?;
        let got = cx.read_f32(ob, 2 * rows)?;
        let tokens: Vec<f32> = got.chunks(2).map(|w| w[0].to_bits() as f32).collect();
        let probs: Vec<f32> = got.chunks(2).map(|w| w[1]).collect();
        cx.cmp_bits(&format!("{rows} x {n} tokens"), &tokens, &want.iter().map(|w| w.0 as f32).collect::<Vec<_>>());
        cx.cmp_abs(
            &format!("{rows} x {n} probabilities"),
            &probs,
            &want.iter().map(|w| w.1).collect::<Vec<_>>(),
            refs::PROB_TOL,
        );
        timed = (xb, ob, n, rows);
    }
    let (xb, ob, n, rows) = timed;
    cx.set_shape(format!("{rows} x {n}"));
    cx.bench((n * rows * 8) as u64, &|o, s| o.logits_top(s, xb, ob, n as u32, rows as u32))
}

fn kv_store(cx: &mut Cx, fmt: KvFormat) -> CheckResultOf<()> {
    let ty = if fmt == KvFormat::F16 { KvType::F16 } else { KvType::Int8 };
    let esz = if fmt == KvFormat::F16 { 2 } else { 1 };
    // (kv heads, head_dim, tokens)
    let shapes: &[(usize, usize, usize)] =
        if cx.full { &[(3, 16, 2), (8, 128, 64)] } else { &[(2, 64, 1), (1, 256, 3), (4, 128, 8), (3, 16, 2)] };
    let mut timed = (0, 0, 0, 0, 0, 0, 0);
    for &(nkv, hd, nt) in shapes {
        let cap = (2 * nt).max(20);
        let mut cache = KvCache::new(ty, cap, &[(nkv, hd)]);
        let LayerCache::Attention(layer) = &mut cache.layers[0];
        let pos: Vec<u32> = (0..nt as u32).map(|i| (i * 7 + 3) % cap as u32).collect();
        let mut k = cx.rand_f32(nt * nkv * hd, 3.0);
        let v = cx.rand_f32(nt * nkv * hd, 0.5);
        k[..hd].fill(0.0); // an all-zero row: scale 0
        if k.len() > hd + 1 {
            k[hd + 1] = 1e-30;
        }
        let w = nkv * hd;
        for t in 0..nt {
            layer.write(pos[t] as usize, &k[t * w..(t + 1) * w], &v[t * w..(t + 1) * w]);
        }
        let pb = cx.upu(&pos)?;
        for (what, src, raw) in [("K", &k, layer.k_raw()), ("V", &v, layer.v_raw())] {
            let (want_rows, want_scales) = raw_kv_bytes(raw);
            let (cb, sb, xb) = (cx.zeros(cap * w * esz)?, cx.zeros(cap * nkv * 4)?, cx.upf(src)?);
            let scale_ptr = if fmt == KvFormat::Int8 { sb } else { 0 };
            cx.ops.kv_store(cx.s, fmt, xb, cb, scale_ptr, pb, nt as u32, nkv as u32, hd as u32)?;
            let got = cx.read(cb, cap * w * esz)?;
            cx.cmp_bytes(&format!("{what} rows, {nkv} heads x {hd}, {nt} tokens"), &got, &want_rows);
            if fmt == KvFormat::Int8 {
                let got = cx.read(sb, cap * nkv * 4)?;
                cx.cmp_bytes(&format!("{what} scales"), &got, &want_scales);
            }
            timed = (xb, cb, scale_ptr, pb, nkv, hd, nt);
        }
    }
    let (xb, cb, sp, pb, nkv, hd, nt) = timed;
    cx.set_shape(format!("{nt} tok x {nkv} heads x {hd}"));
    let ideal = nt * nkv * hd * (4 + esz) + nt * 4 + if fmt == KvFormat::Int8 { nt * nkv * 4 } else { 0 };
    cx.bench(ideal as u64, &|o, s| o.kv_store(s, fmt, xb, cb, sp, pb, nt as u32, nkv as u32, hd as u32))
}

/// One attention case per head dim: GQA, windows, verification windows of 8 tokens (small), a
/// decode step over 2048 cells (full).
fn attention(cx: &mut Cx, mode: AttnMode, int8: bool, hd: usize) -> CheckResultOf<()> {
    // (n_head, n_head_kv, tokens, last position, window)
    let mut cases = vec![match hd {
        16 => (2usize, 2usize, 2usize, 33usize, None),
        32 => (4, 2, 5, 9, Some(4usize)),
        64 => (4, 4, 3, 100, Some(17)),
        128 => (8, 2, 1, 77, None),
        _ => (2, 1, 8, 40, None),
    }];
    if cx.full {
        let nh = (4096 / hd).min(64);
        cases.push((nh, nh.min(8), 1, 2047, None));
    }
    for (i, &case) in cases.iter().enumerate() {
        attention_one(cx, mode, int8, hd, case, i + 1 == cases.len())?;
    }
    Ok(())
}

type AttnCase = (usize, usize, usize, usize, Option<usize>);

fn attention_one(cx: &mut Cx, mode: AttnMode, int8: bool, hd: usize, case: AttnCase, timed: bool) -> CheckResultOf<()> {
    let (nh, nkv, nt, last, window) = case;
    let ty = if int8 { KvType::Int8 } else { KvType::F16 };
    // Free cells past the last position, as in a real cache (kernels must not read them).
    let cap = last + 1 + 9;
    let mut cache = KvCache::new(ty, cap, &[(nkv, hd)]);
    let LayerCache::Attention(layer) = &mut cache.layers[0];
    for p in 0..cap {
        let k = cx.rand_f32(nkv * hd, 1.5);
        let v = cx.rand_f32(nkv * hd, 1.0);
        layer.write(p, &k, &v);
    }
    let q = cx.rand_f32(nt * nh * hd, 1.0);
    let pos0 = last + 1 - nt;
    let kq_scale = 1.0 / (hd as f32).sqrt();
    let sh = Shape { n_head: nh, n_head_kv: nkv, head_dim: hd, pos0, window, kq_scale, ggml_exact: false };
    let mut want = vec![0f32; nt * nh * hd];
    if mode == AttnMode::Ordered {
        attend_ordered(layer, &q, &mut want, sh);
    } else {
        attend(layer, &q, &mut want, sh);
    }
    let (kr, ks) = raw_kv_bytes(layer.k_raw());
    let (vr, vs) = raw_kv_bytes(layer.v_raw());
    let fmt = if int8 { KvFormat::Int8 } else { KvFormat::F16 };
    let pos: Vec<u32> = (0..nt).map(|i| (pos0 + i) as u32).collect();
    let (kb, vb, qb, pb) = (cx.up(&kr)?, cx.up(&vr)?, cx.upf(&q)?, cx.upu(&pos)?);
    let (ksp, vsp) = if int8 { (cx.up(&ks)?, cx.up(&vs)?) } else { (0, 0) };
    let ob = cx.zeros(want.len() * 4)?;
    let win = window.unwrap_or(0) as u32;
    let launch = |o: &GpuOps, s: &Stream| {
        o.attention(
            s, mode, fmt, qb, kb, ksp, vb, vsp, ob, pb, nt as u32, nh as u32, nkv as u32, hd as u32, win, kq_scale,
        )
    };
    launch(cx.ops, cx.s)?;
    let got = cx.read_f32(ob, want.len())?;
    let shape = format!(
        "{nt} tok, {nh}/{nkv} heads, {} cells{}",
        last + 1,
        window.map_or(String::new(), |w| format!(", window {w}"))
    );
    if mode == AttnMode::Ordered {
        cx.cmp_bits(&format!("out, {shape}"), &got, &want);
    } else {
        cx.cmp_abs(&format!("out (|V| < 1), {shape}"), &got, &want, refs::FAST_ATTN_TOL);
    }
    if !timed {
        return Ok(());
    }
    cx.set_shape(shape);
    let cells = window.map_or(last + 1, |w| w.min(last + 1));
    let ideal = 2 * nt * nh * hd * 4
        + 2 * cells * nkv * hd * if int8 { 1 } else { 2 }
        + if int8 { 2 * cells * nkv * 4 } else { 0 }
        + nt * 4;
    cx.bench(ideal as u64, &launch)
}

fn moe_router(cx: &mut Cx) -> CheckResultOf<()> {
    // (experts, k, tokens, renorm)
    let mut shapes = vec![
        (8usize, 2usize, 1usize, true),
        (128, 8, 5, true),
        (60, 4, 3, false),
        (256, 8, 2, true),
        (4, 4, 1, true),
        (300, 16, 2, false),
    ];
    if cx.full {
        shapes.push((128, 8, 64, true));
    }
    // Flash-Next's routing (timed).
    shapes.push((512, 10, if cx.full { 8 } else { 3 }, true));
    let mut timed = (0, 0, 0, 0, 0, 0, true);
    for (ne, k, nt, renorm) in shapes {
        let mut logits = cx.rand_f32(nt * ne, 4.0);
        if ne > 8 {
            // exact ties: lower index first
            logits[3] = 9.0;
            logits[7] = 9.0;
            logits[5] = 9.0;
        }
        let (want_ids, want_w) = router_reference(&logits, ne, k, renorm);
        let (lb, ib, wb) = (cx.upf(&logits)?, cx.zeros(nt * k * 4)?, cx.zeros(nt * k * 4)?);
        cx.ops.moe_router(cx.s, lb, ib, wb, nt as u32, ne as u32, k as u32, renorm)?;
        let (ids, ws) = (cx.read_u32(ib, nt * k)?, cx.read_f32(wb, nt * k)?);
        cx.cmp_ids(&format!("ids, {nt} tok, top {k} of {ne}"), &ids, &want_ids);
        cx.cmp_abs(
            &format!("weights, {nt} tok, top {k} of {ne}{}", if renorm { ", renormalised" } else { "" }),
            &ws,
            &want_w,
            refs::PROB_TOL,
        );
        timed = (lb, ib, wb, ne, k, nt, renorm);
    }
    let (lb, ib, wb, ne, k, nt, renorm) = timed;
    cx.set_shape(format!("{nt} tok, top {k} of {ne}"));
    cx.bench((nt * ne * 4 + nt * k * 8) as u64, &|o, s| {
        o.moe_router(s, lb, ib, wb, nt as u32, ne as u32, k as u32, renorm)
    })
}

fn moe_combine(cx: &mut Cx) -> CheckResultOf<()> {
    // (d, tokens, k, expert output rows)
    let shapes: &[(usize, usize, usize, usize)] =
        if cx.full { &[(1, 3, 1, 3), (4096, 8, 8, 64)] } else { &[(64, 1, 2, 4), (300, 5, 8, 40), (1, 3, 1, 3)] };
    let mut timed = (0, 0, 0, 0, 0, 0, 0);
    for &(d, nt, k, ny) in shapes {
        let y = cx.rand_f32(ny * d, 2.0);
        let map: Vec<u32> = (0..nt * k).map(|_| (cx.rng.next_u64() % ny as u64) as u32).collect();
        let w = cx.rand_f32(nt * k, 1.0);
        let mut want = vec![0f32; nt * d];
        for t in 0..nt {
            for j in 0..k {
                let (m, wj) = (map[t * k + j] as usize, w[t * k + j]);
                for i in 0..d {
                    want[t * d + i] += wj * y[m * d + i];
                }
            }
        }
        let (yb, mb, wb, ob) = (cx.upf(&y)?, cx.upu(&map)?, cx.upf(&w)?, cx.zeros(nt * d * 4)?);
        cx.ops.moe_combine(cx.s, yb, mb, wb, ob, d as u32, nt as u32, k as u32)?;
        let got = cx.read_f32(ob, nt * d)?;
        cx.cmp_bits(&format!("{nt} tok x {k} experts x {d}"), &got, &want);
        timed = (yb, mb, wb, ob, d, nt, k);
    }
    let (yb, mb, wb, ob, d, nt, k) = timed;
    cx.set_shape(format!("{nt} tok x {k} experts x {d}"));
    cx.bench((nt * k * d * 4 + nt * d * 4 + nt * k * 8) as u64, &|o, s| {
        o.moe_combine(s, yb, mb, wb, ob, d as u32, nt as u32, k as u32)
    })
}

fn moe_slot_map(cx: &mut Cx) -> CheckResultOf<()> {
    // (slots, experts, cached experts): none, some and every expert with a slot.
    let shapes: &[(usize, usize, usize)] = &[(80, 512, 0), (80, 512, 228), (16, 8, 3), (64, 8, 8)];
    let mut timed = (0, 0, 0, 0, 0, 0);
    for &(ns, ne, cached) in shapes {
        let ids: Vec<u32> = (0..ns).map(|_| (cx.rng.next_u64() % ne as u64) as u32).collect();
        // The first `cached` experts of a shuffled order hold slots 0..cached.
        let mut order: Vec<u32> = (0..ne as u32).collect();
        for i in (1..ne).rev() {
            order.swap(i, (cx.rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let mut table = vec![abi::MOE_SLOT_MISS; ne];
        for (slot, &e) in order.iter().take(cached).enumerate() {
            table[e as usize] = slot as u32;
        }
        let base = 1000;
        let want_slots: Vec<u32> = ids.iter().map(|&e| table[e as usize]).collect();
        let want_map: Vec<u32> = want_slots
            .iter()
            .enumerate()
            .map(|(j, &s)| if s == abi::MOE_SLOT_MISS { base + j as u32 } else { j as u32 })
            .collect();
        let (ib, tb, sb, mb) = (cx.upu(&ids)?, cx.upu(&table)?, cx.zeros(ns * 4)?, cx.zeros(ns * 4)?);
        cx.ops.moe_slot_map(cx.s, ib, tb, sb, mb, ns as u32, ne as u32, base)?;
        let (got_slots, got_map) = (cx.read_u32(sb, ns)?, cx.read_u32(mb, ns)?);
        cx.cmp_ids(&format!("slots, {ns} slots, {cached} of {ne} cached"), &got_slots, &want_slots);
        cx.cmp_ids(&format!("rows, {ns} slots, {cached} of {ne} cached"), &got_map, &want_map);
        timed = (ib, tb, sb, mb, ns, ne);
    }
    let (ib, tb, sb, mb, ns, ne) = timed;
    cx.set_shape(format!("{ns} slots of {ne} experts"));
    cx.bench((ns * 16) as u64, &|o, s| o.moe_slot_map(s, ib, tb, sb, mb, ns as u32, ne as u32, 1000))
}

fn moe_sort_slots(cx: &mut Cx) -> CheckResultOf<()> {
    // (tokens, k, experts): a Flash-Next prompt chunk, one over two sort blocks, tiny.
    let shapes: &[(usize, usize, usize)] = &[(64, 10, 512), (256, 8, 128), (7, 1, 3)];
    let mut timed = (0, 0, 0, 0, 0, 0);
    for &(nt, k, ne) in shapes {
        let ns = nt * k;
        let ids: Vec<u32> = (0..ns).map(|_| (cx.rng.next_u64() % ne as u64) as u32).collect();
        // The host's stable sort of each block by expert id.
        let (mut want_ids, mut want_cols, mut want_map) = (vec![0u32; ns], vec![0u32; ns], vec![0u32; ns]);
        let block = abi::MOE_SORT_BLOCK as usize;
        for b0 in (0..ns).step_by(block) {
            let mut order: Vec<usize> = (b0..(b0 + block).min(ns)).collect();
            order.sort_by_key(|&j| (ids[j], j));
            for (p, &j) in order.iter().enumerate() {
                let pos = b0 + p;
                (want_ids[pos], want_cols[pos], want_map[j]) = (ids[j], (j / k) as u32, pos as u32);
            }
        }
        let (ib, sb, cb, mb) = (cx.upu(&ids)?, cx.zeros(ns * 4)?, cx.zeros(ns * 4)?, cx.zeros(ns * 4)?);
        cx.ops.moe_sort_slots(cx.s, ib, sb, cb, mb, ns as u32, k as u32)?;
        let what = format!("{nt} tokens x {k} of {ne} experts");
        let (got_ids, got_cols, got_map) = (cx.read_u32(sb, ns)?, cx.read_u32(cb, ns)?, cx.read_u32(mb, ns)?);
        cx.cmp_ids(&format!("sorted ids, {what}"), &got_ids, &want_ids);
        cx.cmp_ids(&format!("tokens, {what}"), &got_cols, &want_cols);
        cx.cmp_ids(&format!("rows, {what}"), &got_map, &want_map);
        timed = (ib, sb, cb, mb, ns, k);
    }
    let (ib, sb, cb, mb, ns, k) = timed;
    cx.set_shape(format!("{ns} slots, {k} a token"));
    cx.bench((ns * 16) as u64, &|o, s| o.moe_sort_slots(s, ib, sb, cb, mb, ns as u32, k as u32))
}

fn geglu_table(cx: &mut Cx) -> CheckResultOf<()> {
    let n = if cx.full { 14336 * 8 } else { 4096 };
    // Around the table's +-10 cut-offs, tiny and huge values.
    let gate: Vec<f32> = (0..n)
        .map(|i| match i % 8 {
            0 => -10.0,
            1 => 10.0,
            2 => -10.000001,
            3 => 9.999999,
            4 => cx.rng.symmetric() * 1e-6,
            5 => cx.rng.symmetric() * 1e4,
            _ => cx.rng.symmetric() * 12.0,
        })
        .collect();
    let upv = cx.rand_f32(n, 3.0);
    let mut want = vec![0f32; n];
    cpu_kernels::geglu_ggml(&gate, &upv, &mut want);
    let (gd, ud, od, td) = (cx.upf(&gate)?, cx.upf(&upv)?, cx.zeros(n * 4)?, cx.upf(cpu_kernels::gelu_f16_table())?);
    cx.ops.geglu_table(cx.s, gd, ud, od, td, n as u32)?;
    let got = cx.read_f32(od, n)?;
    cx.cmp_bits("out", &got, &want);
    cx.set_shape(format!("{n}"));
    cx.bench((n * 12) as u64, &|o, s| o.geglu_table(s, gd, ud, od, td, n as u32))
}

/// A `reduce_*` benchmark kernel (not used by the engine): `reps` 32-lane sums (`x = sum(x) /
/// 32`; the baseline only scales), bitwise against the host butterfly, with 1 and 9 reps.
fn reduce(cx: &mut Cx, name: &'static str, method: u32, values: u32) -> CheckResultOf<()> {
    let n_waves = if cx.full { 4096u32 } else { 64 };
    let nsum = (n_waves * values) as usize;
    let x: Vec<f32> = (0..nsum * 32).map(|_| cx.rng.symmetric() * 100.0).collect();
    let (xb, yb) = (cx.upf(&x)?, cx.zeros(nsum * 4)?);
    for reps in [1u32, 9] {
        cx.ops.reduce_bench(cx.s, name, xb, yb, n_waves, reps)?;
        let got = cx.read_f32(yb, nsum)?;
        let want: Vec<f32> = (0..nsum)
            .map(|i| {
                let mut lanes = [0f32; 32];
                lanes.copy_from_slice(&x[i * 32..i * 32 + 32]);
                for _ in 0..reps {
                    if method != 0 {
                        crate::bench::butterfly(&mut lanes);
                    }
                    lanes = lanes.map(|l| l * (1.0 / 32.0));
                }
                lanes[0]
            })
            .collect();
        cx.cmp_bits(&format!("{reps} sums per value"), &got, &want);
    }
    cx.set_shape(format!("{n_waves} waves x {values} values"));
    cx.bench((nsum * 33 * 4) as u64, &|o, s| o.reduce_bench(s, name, xb, yb, n_waves, 1))
}
