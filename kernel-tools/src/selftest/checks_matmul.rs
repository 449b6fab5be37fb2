//! Selftest checks of the quantized kernels: activation quantizers, dequantizers, MMVQ (every
//! type and column count, row lists), the fused gate/up GLU, MMQ, expert dispatch, get_rows,
//! and the ordered-numerics quantizer and dot. References: the `quant` crate (quantize_row,
//! dequantize_row, vec_dot via `cpu::matmul_ordered`) and f64 dots of its dequantized
//! operands (reference.rs).
use super::reference::{self as refs, dot_reference, ggml, glu_reference};
use super::{Check, CheckResultOf, Cx, Metric};
use gpu_executor::abi::{self, WType};
use gpu_executor::device::{DevicePtr, GpuError, Stream};
use gpu_executor::ops::{GluAct, GpuOps, MmqVariant, RowType};
use quant::GgmlType;

fn quantize(ty: GgmlType, x: &[f32], block_bytes: usize, qk: usize) -> CheckResultOf<Vec<u8>> {
    let mut out = vec![0u8; x.len() / qk * block_bytes];
    quant::quantize_row(ty, x, &mut out).map_err(|e| format!("quant::quantize_row({}): {e:?}", ty.name()))?;
    Ok(out)
}
fn q8_1(x: &[f32]) -> CheckResultOf<Vec<u8>> {
    quantize(GgmlType::Q8_1, x, 36, 32)
}
fn row_bytes(ty: WType, k: usize) -> usize {
    k / ty.block_k() as usize * ty.block_bytes() as usize
}

pub fn checks() -> Vec<Check> {
    let mut v = Vec::new();
    type QuantLaunch = fn(&GpuOps, &Stream, DevicePtr, DevicePtr, u32) -> Result<(), GpuError>;
    for (name, ty, bb, qk, launch) in [
        (abi::QUANTIZE_Q8_1, GgmlType::Q8_1, 36usize, 32usize, GpuOps::quantize_q8_1 as QuantLaunch),
        (abi::QUANTIZE_Q8_K, GgmlType::Q8K, 292, 256, GpuOps::quantize_q8_k as QuantLaunch),
    ] {
        v.push(Check::new(name, vec![name], "quant::quantize_row", move |cx| {
            let sizes = if cx.full { vec![4096, 4096 * 64] } else { vec![4096] };
            for (i, &n) in sizes.iter().enumerate() {
                let mut x = cx.rand_f32(n, 3.0);
                x[..256].fill(0.0); // an all-zero block of either size
                x[300] = 0.0;
                x[301] = -x[302]; // sign ties of the absmax
                x[600] = 1e-30;
                x[1000] = -250.0;
                let want = quantize(ty, &x, bb, qk)?;
                let (xb, y) = (cx.upf(&x)?, cx.zeros(want.len())?);
                launch(cx.ops, cx.s, xb, y, n as u32)?;
                let got = cx.read(y, want.len())?;
                cx.cmp_bytes(&format!("blocks of {n} values"), &got, &want);
                if i + 1 == sizes.len() {
                    cx.set_shape(format!("{n} values"));
                    cx.bench((n * 4 + want.len()) as u64, &|o, s| launch(o, s, xb, y, n as u32))?;
                }
            }
            Ok(())
        }));
    }
    for &(ty, f16, name) in abi::DEQUANT_KERNELS {
        v.push(Check::new(name, vec![name], "quant::dequantize_row", move |cx| {
            let sizes = if cx.full { vec![1, 300, 4096 * 4096 / ty.block_k() as usize] } else { vec![1, 37, 300] };
            for (i, &nblocks) in sizes.iter().enumerate() {
                dequant(cx, ty, f16, nblocks, i + 1 == sizes.len())?;
            }
            Ok(())
        }));
    }
    for &(ty, nc, name) in abi::MMVQ_KERNELS {
        v.push(Check::new(name, vec![name], "f64 dot of quant's dequantized weights and Q8_1 columns", move |cx| {
            mmvq(cx, ty, nc as usize, false)
        }));
    }
    for ty in WType::ALL {
        let Some(name) = abi::mmvq_kernel(ty, 1) else { continue };
        v.push(Check::new(
            format!("{name} row list"),
            vec![name],
            "f64 dot of quant's dequantized weights and Q8_1 columns",
            move |cx| mmvq(cx, ty, 1, true),
        ));
    }
    for &(ty, nc, name) in abi::MMVQ_GLU_KERNELS {
        v.push(Check::new(name, vec![name], "f64 dots (quant dequantized) through f64 SiLU / GELU-tanh", move |cx| {
            mmvq_glu(cx, ty, nc)
        }));
    }
    for &(ty, dot4, name) in abi::MMQ_KERNELS {
        let variant = if dot4 { MmqVariant::Dot4 } else { MmqVariant::Wmma };
        v.push(Check::new(
            name,
            vec![name],
            "f64 dot of quant's dequantized operands (Q8_0: also the scalar order, bitwise)",
            move |cx| mmq(cx, ty, variant),
        ));
    }
    for &(ty, g, glu, name) in abi::MMVQ_MOE_KERNELS {
        v.push(Check::new(name, vec![name], "f64 dots of the chosen experts' dequantized rows", move |cx| {
            mmvq_moe(cx, ty, g, glu)
        }));
    }
    for &(ty, name) in abi::GET_ROWS_KERNELS {
        v.push(Check::new(name, vec![name], "quant::dequantize_row of the rows, times the scale", move |cx| {
            get_rows(cx, RowType::W(ty))
        }));
    }
    v.push(Check::new(abi::GET_ROWS_F32, vec![abi::GET_ROWS_F32], "the rows, times the scale", |cx| {
        get_rows(cx, RowType::F32)
    }));
    v.push(Check::new(
        abi::GET_ROWS_F16,
        vec![abi::GET_ROWS_F16],
        "quant::f16_to_f32 of the rows, times the scale",
        |cx| get_rows(cx, RowType::F16),
    ));
    v.push(Check::new(
        abi::QUANTIZE_REF,
        vec![abi::QUANTIZE_REF],
        "quant::quantize_row (Q8_0, Q8_1, Q8_K, F16, BF16, F32)",
        quantize_ref,
    ));
    for ty in ORDERED_TYPES {
        v.push(Check::new(
            format!("{} {}", abi::MMV_ORDERED, ty.name()),
            vec![abi::MMV_ORDERED],
            "cpu::matmul_ordered (quant::quantize_row + quant::vec_dot)",
            move |cx| mmv_ordered(cx, ty),
        ));
    }
    v
}

/// Weight types of the ordered-numerics dot (every type with a reference dot).
const ORDERED_TYPES: [GgmlType; 13] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ3XXS,
    GgmlType::IQ4NL,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

fn dequant(cx: &mut Cx, ty: WType, f16: bool, nblocks: usize, timed: bool) -> CheckResultOf<()> {
    let w = cx.blocks(ty, nblocks);
    let n = nblocks * ty.block_k() as usize;
    let mut want = vec![0f32; n];
    quant::dequantize_row(ggml(ty), &w, &mut want).map_err(|e| format!("dequantize {ty:?}: {e:?}"))?;
    let wb = cx.up(&w)?;
    let y = cx.zeros(n * if f16 { 2 } else { 4 })?;
    cx.ops.dequant(cx.s, ty, f16, wb, y, nblocks as u32)?;
    if f16 {
        let want: Vec<u16> = want.iter().map(|&x| quant::f32_to_f16(x)).collect();
        let got = cx.read_u16(y, n)?;
        cx.cmp_halves(&format!("{nblocks} blocks: f16 (RNE of the f32 reference)"), &got, &want, false);
    } else {
        let got = cx.read_f32(y, n)?;
        cx.cmp_bits(&format!("{nblocks} blocks: f32"), &got, &want);
    }
    if !timed {
        return Ok(());
    }
    cx.set_shape(format!("{nblocks} blocks"));
    let ideal = w.len() + n * if f16 { 2 } else { 4 };
    cx.bench(ideal as u64, &|o, s| o.dequant(s, ty, f16, wb, y, nblocks as u32))
}

/// Dot outputs against their reference: relative to sum |w a| with [`refs::DOT_TOL`]; Q4_K
/// against its bound, which adds the f16 rounding of Q8_1's block sums in the min term.
fn cmp_dots(cx: &mut Cx, what: &str, ty: WType, got: &[f32], r: &refs::DotRef) {
    if ty == WType::Q4K {
        cx.cmp_scaled(what, Metric::RelBound, got, &r.dot, &r.bound(), 1.0);
    } else {
        cx.cmp_scaled(what, Metric::RelDotMagnitude, got, &r.dot, &r.mag, refs::DOT_TOL);
    }
}

/// MMVQ with `nc` columns; `row_list`: a reversed, strided row selection (MoE experts).
fn mmvq(cx: &mut Cx, ty: WType, nc: usize, row_list: bool) -> CheckResultOf<()> {
    // Small: several workgroups, a partial one, padded output rows and (Q8_0) K not a multiple
    // of 256; full: a 4096 x 4096 layer.
    let mut shapes = vec![(200usize, if ty == WType::Q8_0 { 544usize } else { 512 })];
    if cx.full {
        shapes.push((4096, 4096));
    }
    for (i, &(nrows, k)) in shapes.iter().enumerate() {
        mmvq_one(cx, ty, nc, row_list, nrows, k, i + 1 == shapes.len())?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn mmvq_one(
    cx: &mut Cx,
    ty: WType,
    nc: usize,
    row_list: bool,
    nrows: usize,
    k: usize,
    timed: bool,
) -> CheckResultOf<()> {
    let w = cx.blocks(ty, nrows * k / ty.block_k() as usize);
    let x = cx.rand_f32(nc * k, 1.0);
    let xq = q8_1(&x)?;
    let rows: Vec<u32> =
        if row_list { (0..nrows as u32).rev().step_by(3).collect() } else { (0..nrows as u32).collect() };
    let n = rows.len();
    let y_stride = if nrows < 4096 { n + 3 } else { n };
    let (wb, xb, rb) = (cx.up(&w)?, cx.up(&xq)?, cx.upu(&rows)?);
    let y = cx.zeros(nc * y_stride * 4)?;
    let rsel = row_list.then_some(rb);
    let launch =
        |o: &GpuOps, s: &Stream| o.mmvq(s, ty, nc as u32, wb, xb, y, rsel, n as u32, k as u32, y_stride as u32);
    launch(cx.ops, cx.s)?;
    let all = cx.read_f32(y, nc * y_stride)?;
    let got: Vec<f32> = (0..nc).flat_map(|c| all[c * y_stride..c * y_stride + n].to_vec()).collect();
    let r = dot_reference(ty, &w, k, &xq, nc, &rows)?;
    cmp_dots(cx, &format!("y, {n} x {k}"), ty, &got, &r);
    if !timed {
        return Ok(());
    }
    cx.set_shape(format!("{n}{} x {k}, {nc} col", if row_list { " listed rows" } else { "" }));
    let ideal = n * row_bytes(ty, k) + xq.len() + nc * n * 4 + if row_list { n * 4 } else { 0 };
    cx.bench(ideal as u64, &launch)
}

fn mmvq_glu(cx: &mut Cx, ty: WType, nc: u32) -> CheckResultOf<()> {
    let mut shapes = vec![(70usize, 512usize)];
    if cx.full {
        shapes.push((4096, 4096));
    }
    for (i, &(nrows, k)) in shapes.iter().enumerate() {
        mmvq_glu_one(cx, ty, nc, nrows, k, i + 1 == shapes.len())?;
    }
    Ok(())
}

fn mmvq_glu_one(cx: &mut Cx, ty: WType, nc: u32, nrows: usize, k: usize, timed: bool) -> CheckResultOf<()> {
    let nb = nrows * k / ty.block_k() as usize;
    let (wg, wu) = (cx.blocks(ty, nb), cx.blocks(ty, nb));
    let x = cx.rand_f32(nc as usize * k, 1.0);
    let xq = q8_1(&x)?;
    let rows: Vec<u32> = (0..nrows as u32).collect();
    let (g, u) =
        (dot_reference(ty, &wg, k, &xq, nc as usize, &rows)?, dot_reference(ty, &wu, k, &xq, nc as usize, &rows)?);
    let (gb, ub, xb) = (cx.up(&wg)?, cx.up(&wu)?, cx.up(&xq)?);
    let total = nc as usize * nrows;
    let y = cx.zeros(total * 4)?;
    for act in [GluAct::Silu, GluAct::GeluTanh] {
        cx.ops.mmvq_glu(cx.s, ty, nc, gb, ub, xb, y, None, nrows as u32, k as u32, nrows as u32, act)?;
        let got = cx.read_f32(y, total)?;
        let (want, bound) = glu_reference(act == GluAct::GeluTanh, &g, &u);
        cx.cmp_scaled(&format!("{act:?}, {nrows} x {k}"), Metric::RelBound, &got, &want, &bound, 1.0);
    }
    if !timed {
        return Ok(());
    }
    cx.set_shape(format!("2 x {nrows} x {k}, {nc} col"));
    let ideal = wg.len() + wu.len() + xq.len() + total * 4;
    cx.bench(ideal as u64, &|o, s| {
        o.mmvq_glu(s, ty, nc, gb, ub, xb, y, None, nrows as u32, k as u32, nrows as u32, GluAct::Silu)
    })
}

fn mmq(cx: &mut Cx, ty: WType, variant: MmqVariant) -> CheckResultOf<()> {
    // Small: two row and two column tiles, both ragged; Q8_0 with a partial 128-value chunk.
    // Full: a 4096 x 4096 layer on a 64-token prompt chunk.
    let mut shapes = vec![(260usize, 66usize, if ty == WType::Q8_0 { 160usize } else { 512 })];
    if cx.full {
        shapes.push((4096, 64, 4096));
    }
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        mmq_one(cx, ty, variant, m, n, k, i + 1 == shapes.len())?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn mmq_one(
    cx: &mut Cx,
    ty: WType,
    variant: MmqVariant,
    m: usize,
    n: usize,
    k: usize,
    timed: bool,
) -> CheckResultOf<()> {
    let w = cx.blocks(ty, m * k / ty.block_k() as usize);
    let x = cx.rand_f32(n * k, 1.0);
    let xq = q8_1(&x)?;
    let (wb, xb, y) = (cx.up(&w)?, cx.up(&xq)?, cx.zeros(n * m * 4)?);
    let launch = |o: &GpuOps, s: &Stream| o.mmq(s, ty, variant, wb, xb, y, m as u32, n as u32, k as u32, m as u32);
    launch(cx.ops, cx.s)?;
    let got = cx.read_f32(y, n * m)?;
    let rows: Vec<u32> = (0..m as u32).collect();
    let r = dot_reference(ty, &w, k, &xq, n, &rows)?;
    cmp_dots(cx, &format!("y, {m} x {k} x {n}"), ty, &got, &r);
    if ty == WType::Q8_0 {
        let want = refs::q8_0_scalar_order(&w, &xq, m, n, k);
        cx.cmp_bits(&format!("y, {m} x {k} x {n}, vs the documented scalar order"), &got, &want);
    }
    if !timed {
        return Ok(());
    }
    cx.set_shape(format!("{m} x {k} x {n} tokens"));
    cx.bench((w.len() + xq.len() + n * m * 4) as u64, &launch)
}

/// Expert dispatch: `g` = 1 is decode (one token, every slot its own expert); wider groups are
/// windows of several tokens sharing experts. GLU form = gate/up of each token's input
/// (`x_div` = experts per token), plain form = down of each slot's own column (`x_div` = 1).
fn mmvq_moe(cx: &mut Cx, ty: WType, g: u32, glu: bool) -> CheckResultOf<()> {
    let mut sizes = vec![false];
    if cx.full {
        sizes.push(true);
    }
    for (i, &big) in sizes.iter().enumerate() {
        mmvq_moe_one(cx, ty, g, glu, big, i + 1 == sizes.len())?;
    }
    Ok(())
}

/// Small: a few experts of 40-48 rows; big: a Qwen3-30B-A3B-shaped layer (d 2048, expert ff
/// 768, 8 of 32 experts per token).
fn mmvq_moe_one(cx: &mut Cx, ty: WType, g: u32, glu: bool, big: bool, timed: bool) -> CheckResultOf<()> {
    let (n_tok, k_used, n_expert) = match (big, g > 1) {
        (false, false) => (1usize, 4usize, 6usize),
        (false, true) => (4, 2, 3),
        (true, false) => (1, 8, 32),
        (true, true) => (8, 8, 32),
    };
    let (d, ff) = if big { (2048usize, 768usize) } else { (256, 256) };
    let (nrows, k, x_div) =
        if glu { (if big { ff } else { 40 }, d, k_used) } else { (if big { d } else { 48 }, ff, 1) };
    let mat_blocks = nrows * k / ty.block_k() as usize;
    let mat = mat_blocks * ty.block_bytes() as usize;
    let wg = cx.blocks(ty, n_expert * mat_blocks);
    let wu = if glu { cx.blocks(ty, n_expert * mat_blocks) } else { Vec::new() };
    let n_slots = n_tok * k_used;
    let mut ids = Vec::new();
    for _ in 0..n_tok {
        let mut pick: Vec<u32> = (0..n_expert as u32).collect();
        for i in 0..k_used {
            let j = i + (cx.rng.next_u64() as usize) % (n_expert - i);
            pick.swap(i, j);
        }
        ids.extend_from_slice(&pick[..k_used]);
    }
    let n_cols = n_slots / x_div;
    let x = cx.rand_f32(n_cols * k, 1.0);
    let xq = q8_1(&x)?;
    let (gb, xb, ib) = (cx.up(&wg)?, cx.up(&xq)?, cx.upu(&ids)?);
    let ub = if glu { cx.up(&wu)? } else { 0 };
    let y = cx.zeros(n_slots * nrows * 4)?;
    let act = glu.then_some((ub, GluAct::Silu));
    let launch = |o: &GpuOps, s: &Stream| {
        o.mmvq_moe(
            s,
            ty,
            act,
            gb,
            mat as u64,
            n_expert as u32,
            xb,
            x_div as u32,
            ib,
            n_slots as u32,
            y,
            nrows as u32,
            k as u32,
            n_tok as u32,
        )
    };
    launch(cx.ops, cx.s)?;
    let got = cx.read_f32(y, n_slots * nrows)?;
    let rows: Vec<u32> = (0..nrows as u32).collect();
    let colb = k / 32 * 36;
    let (mut want, mut scale) = (Vec::with_capacity(got.len()), Vec::with_capacity(got.len()));
    for (s, &e) in ids.iter().enumerate() {
        let c = s / x_div;
        let col = &xq[c * colb..(c + 1) * colb];
        let e = e as usize;
        let gd = dot_reference(ty, &wg[e * mat..(e + 1) * mat], k, col, 1, &rows)?;
        if glu {
            let ud = dot_reference(ty, &wu[e * mat..(e + 1) * mat], k, col, 1, &rows)?;
            let (val, bound) = glu_reference(false, &gd, &ud);
            want.extend(val);
            scale.extend(bound);
        } else {
            scale.extend(gd.bound());
            want.extend(gd.dot);
        }
    }
    let mut distinct = ids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let what = format!("{n_tok} tok x {k_used} of {n_expert} experts, {nrows} x {k}");
    if glu {
        cx.cmp_scaled(&format!("SiLU(gate) * up per slot, {what}"), Metric::RelBound, &got, &want, &scale, 1.0);
    } else {
        cx.cmp_scaled(&format!("y per slot, {what}"), Metric::RelBound, &got, &want, &scale, 1.0);
    }
    if !timed {
        return Ok(());
    }
    cx.set_shape(format!("{n_tok} tok x {k_used} of {n_expert} experts ({} distinct), {nrows} x {k}", distinct.len()));
    let ideal = (if glu { 2 } else { 1 }) * distinct.len() * mat + xq.len() + n_slots * nrows * 4 + n_slots * 4;
    cx.bench(ideal as u64, &launch)
}

fn get_rows(cx: &mut Cx, ty: RowType) -> CheckResultOf<()> {
    let mut sizes = vec![false];
    if cx.full {
        sizes.push(true);
    }
    for (i, &big) in sizes.iter().enumerate() {
        get_rows_one(cx, ty, big, i + 1 == sizes.len())?;
    }
    Ok(())
}

/// Small: 5 rows (one repeated) of an 8-row table; big: 64 of 1024 rows of 4096.
fn get_rows_one(cx: &mut Cx, ty: RowType, big: bool, timed: bool) -> CheckResultOf<()> {
    let (table_rows, n_ids, k) = match (big, ty) {
        (true, _) => (1024usize, 64usize, 4096usize),
        (false, RowType::W(_)) => (8, 5, 512),
        (false, _) => (8, 5, 40),
    };
    let ids: Vec<u32> =
        if big { (0..n_ids as u32).map(|i| (i * 97 + 3) % table_rows as u32).collect() } else { vec![3, 0, 7, 3, 1] };
    let (table, rows_f32): (Vec<u8>, Vec<f32>) = match ty {
        RowType::W(wt) => {
            let t = cx.blocks(wt, table_rows * k / wt.block_k() as usize);
            let mut f = vec![0f32; table_rows * k];
            quant::dequantize_row(ggml(wt), &t, &mut f).map_err(|e| format!("dequantize {wt:?}: {e:?}"))?;
            (t, f)
        }
        RowType::F32 => {
            let f = cx.rand_f32(table_rows * k, 3.0);
            (f.iter().flat_map(|v| v.to_le_bytes()).collect(), f)
        }
        RowType::F16 => {
            let h: Vec<u16> = cx.rand_f32(table_rows * k, 3.0).iter().map(|&v| quant::f32_to_f16(v)).collect();
            (h.iter().flat_map(|v| v.to_le_bytes()).collect(), h.iter().map(|&v| quant::f16_to_f32(v)).collect())
        }
    };
    let (tb, ib, o) = (cx.up(&table)?, cx.upu(&ids)?, cx.zeros(n_ids * k * 4)?);
    for scale in [1.0f32, 2.5] {
        cx.ops.get_rows(cx.s, ty, tb, ib, n_ids as u32, k as u32, o, scale)?;
        let got = cx.read_f32(o, n_ids * k)?;
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&r| {
                rows_f32[r as usize * k..(r as usize + 1) * k]
                    .iter()
                    .map(move |&v| if scale != 1.0 { v * scale } else { v })
            })
            .collect();
        cx.cmp_bits(&format!("{n_ids} rows of {k} x {scale}"), &got, &want);
    }
    if !timed {
        return Ok(());
    }
    cx.set_shape(format!("{n_ids} of {table_rows} rows x {k}"));
    let row_b = table.len() / table_rows;
    cx.bench((n_ids * (row_b + k * 4 + 4)) as u64, &|o_, s| o_.get_rows(s, ty, tb, ib, n_ids as u32, k as u32, o, 1.0))
}

/// Activations with outliers and an all-zero Q8_K block, `ncols` columns of `k`.
fn ordered_activations(cx: &mut Cx, ncols: usize, k: usize) -> Vec<f32> {
    let mut x = cx.rand_f32(ncols * k, 1.0);
    x[3] = 40.0;
    x[k + 7] = -75.5;
    if ncols >= 3 && k >= 256 {
        x[2 * k..2 * k + 256].fill(0.0);
    }
    x
}

fn quantize_ref(cx: &mut Cx) -> CheckResultOf<()> {
    let mut shapes = vec![(5usize, 512usize)];
    if cx.full {
        shapes.push((8, 4096));
    }
    for (i, &(ncols, k)) in shapes.iter().enumerate() {
        quantize_ref_one(cx, ncols, k, i + 1 == shapes.len())?;
    }
    Ok(())
}

fn quantize_ref_one(cx: &mut Cx, ncols: usize, k: usize, timed: bool) -> CheckResultOf<()> {
    let x = ordered_activations(cx, ncols, k);
    let xd = cx.upf(&x)?;
    let mut q8_1_out = 0;
    for at in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8K, GgmlType::F16, GgmlType::BF16, GgmlType::F32] {
        let ab = at.row_bytes(k).ok_or_else(|| format!("{} rows of {k}", at.name()))?;
        let mut want = vec![0u8; ncols * ab];
        for (c, a) in want.chunks_exact_mut(ab).enumerate() {
            quant::quantize_row(at, &x[c * k..(c + 1) * k], a)
                .map_err(|e| format!("quantize_row {}: {e:?}", at.name()))?;
        }
        let yd = cx.zeros(want.len())?;
        cx.ops.quantize_ref(cx.s, at, xd, yd, (ncols * k) as u32)?;
        let got = cx.read(yd, want.len())?;
        cx.cmp_bytes(&format!("{}, {ncols} x {k}", at.name()), &got, &want);
        if at == GgmlType::Q8_1 {
            q8_1_out = yd;
        }
    }
    if !timed {
        return Ok(());
    }
    cx.set_shape(format!("{ncols} x {k}, 6 activation types"));
    let ideal = ncols * k * 4 + ncols * k / 32 * 36;
    cx.bench(ideal as u64, &|o, s| o.quantize_ref(s, GgmlType::Q8_1, xd, q8_1_out, (ncols * k) as u32))
}

fn mmv_ordered(cx: &mut Cx, ty: GgmlType) -> CheckResultOf<()> {
    let mut shapes = vec![(19usize, 3usize, 512usize)];
    if cx.full {
        shapes.push((1024, 8, 4096));
    }
    for (i, &(rows, ncols, k)) in shapes.iter().enumerate() {
        mmv_ordered_one(cx, ty, rows, ncols, k, i + 1 == shapes.len())?;
    }
    Ok(())
}

fn mmv_ordered_one(cx: &mut Cx, ty: GgmlType, rows: usize, ncols: usize, k: usize, timed: bool) -> CheckResultOf<()> {
    let x = ordered_activations(cx, ncols, k);
    let wf = cx.rand_f32(rows * k, 0.5);
    let rb = ty.row_bytes(k).ok_or_else(|| format!("{} rows of {k}", ty.name()))?;
    let mut w = vec![0u8; rows * rb];
    for (r, dst) in w.chunks_exact_mut(rb).enumerate() {
        quant::quantize_row(ty, &wf[r * k..(r + 1) * k], dst)
            .map_err(|e| format!("quantize_row {}: {e:?}", ty.name()))?;
    }
    let t = cpu_kernels::QTensor::new(ty, &w, rows, k).map_err(|e| format!("QTensor: {e:?}"))?;
    let mut want = vec![0f32; ncols * rows];
    cpu_executor::matmul_ordered(&t, &x, ncols, &mut want)?;
    let at = ty.vec_dot_type();
    let ab = at.row_bytes(k).ok_or_else(|| format!("{} rows of {k}", at.name()))?;
    let (xd, wd, ad, yd) = (cx.upf(&x)?, cx.up(&w)?, cx.zeros(ncols * ab)?, cx.zeros(ncols * rows * 4)?);
    let a = if at == GgmlType::F32 { xd } else { ad };
    if at != GgmlType::F32 {
        cx.ops.quantize_ref(cx.s, at, xd, ad, (ncols * k) as u32)?;
    }
    let launch = |o: &GpuOps, s: &Stream| o.mmv_ordered(s, ty, wd, a, yd, rows as u32, ncols as u32, k as u32);
    launch(cx.ops, cx.s)?;
    let got = cx.read_f32(yd, ncols * rows)?;
    cx.cmp_bits(&format!("y, {rows} x {k}, {ncols} col"), &got, &want);
    if !timed {
        return Ok(());
    }
    cx.set_shape(format!("{rows} x {k} {}, {ncols} col", ty.name()));
    cx.bench((w.len() + ncols * ab + ncols * rows * 4) as u64, &launch)
}
