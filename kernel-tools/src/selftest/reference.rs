//! CPU references and tolerances shared by the selftest checks and tests/gpu/gpu_ops.rs. Every
//! reference is independent of the kernels: the `quant` crate's scalar dequantizers and
//! quantizers, `cpu_kernels`, and the engine's CPU attention / MoE code.
use gpu_executor::abi::WType;
use quant::GgmlType;
use rayon::prelude::*;

/// SiLU / GELU-tanh: `|gpu - cpu| <= GLU_TOL * max(1, |cpu|)` (`quant::fmath::expf`/`tanhf`,
/// <= 2 ulp, where the CPU calls libm).
pub const GLU_TOL: f64 = 2e-6;
/// Softmax / router probabilities: absolute difference (values in [0, 1]).
pub const PROB_TOL: f64 = 1e-6;
/// The GDN mixer (`GpuOps::gdn_mix`) against `Gdn::mix`: `|gpu - cpu| <= GDN_TOL * max(1,
/// |cpu|)` for outputs and states; the sums are in the CPU's order, the gap is `quant::fmath`'s
/// exp/softplus/sigmoid (<= 2 ulp) carried through a few tokens of recurrence.
pub const GDN_TOL: f64 = 4e-6;
/// The GR kernels against `HyperConn`'s steps: `|gpu - cpu| <= GR_TOL * max(1, |cpu|)`
/// (sigmoid/SiLU with `quant::fmath::expf`; the stream norm is compared bit for bit).
pub const GR_TOL: f64 = 2e-6;
/// The PLE block (`GpuOps::ple_block`) against `PleBlock::mix`: `|gpu - cpu| <= PLE_TOL *
/// max(1, |cpu|)` for the streams and the conv history (sums in the CPU's order; the gate's
/// sigmoid and the conv's SiLU are `quant::fmath`'s, <= 2 ulp).
pub const PLE_TOL: f64 = 4e-6;
/// QSA attention (`GpuOps::qsa_mix`) against `Qsa::mix`: `|gpu - cpu| <= QSA_TOL * max(1,
/// |cpu|)`. The scores are bit-identical; `quant::fmath`'s exp (<= 2 ulp) can move a
/// probability across an f16 rounding boundary (the f16 cache's path rounds it), one f16 step
/// (2^-11 relative) of a term `p * v` with |v| <= 2.
pub const QSA_TOL: f64 = 1e-3;
/// Fast (WMMA f16) attention against the CPU `attend`, absolute, for |V| <= ~1 (f16 query and
/// probabilities rounded at other points, online softmax, hardware exp2). Observed <= 2.7e-4.
pub const FAST_ATTN_TOL: f64 = 1e-3;

/// Error of an MMVQ / MMQ output against the f64 dot of quant's dequantized operands,
/// relative to sum |w_i a_i|: the int32 block dots are exact, their scaling and the sums across
/// blocks are f32 (observed < 1e-7).
pub const DOT_TOL: f64 = 1e-6;
/// Q4_K's min term `dmin * m_j * sum(a)` is computed from the Q8_1 block sum `s`, stored as
/// f16 from the unrounded scale: `|s - f16(d) * sum(q)| <= 2^-10 |s|`. The bound of a Q4_K
/// output adds this factor times `sum_j |dmin m_j s_j|` (see [`DotRef::bound`]).
pub const Q4K_MIN_TERM_TOL: f64 = 1.0 / 1024.0;

/// The f64 reference of dots `W[row] · x[col]`.
pub struct DotRef {
    /// `y[c * rows + i]`.
    pub dot: Vec<f64>,
    /// sum |w a| of each dot.
    pub mag: Vec<f64>,
    /// Q4_K: sum over sub-blocks of |dmin m_j| |s_j| (0 for other types).
    pub min_term: Vec<f64>,
}

impl DotRef {
    /// Largest error a correct kernel may make on each output: [`DOT_TOL`] of the magnitude,
    /// plus [`Q4K_MIN_TERM_TOL`] of Q4_K's min term.
    pub fn bound(&self) -> Vec<f64> {
        self.mag.iter().zip(&self.min_term).map(|(m, t)| DOT_TOL * m + Q4K_MIN_TERM_TOL * t).collect()
    }
}

pub fn ggml(ty: WType) -> GgmlType {
    // Every WType has a ggml id that quant knows (WType::ggml_id is that list).
    GgmlType::from_u32(ty.ggml_id()).unwrap_or(GgmlType::F32)
}

/// Dequantized Q8_1 columns (`ncols` of `k`).
pub fn dequant_q8_1_columns(xq: &[u8], k: usize, ncols: usize) -> Result<Vec<f32>, String> {
    let cb = k / 32 * 36;
    let mut a = vec![0f32; ncols * k];
    for c in 0..ncols {
        quant::dequantize_row(GgmlType::Q8_1, &xq[c * cb..(c + 1) * cb], &mut a[c * k..(c + 1) * k])
            .map_err(|e| format!("dequantize Q8_1: {e:?}"))?;
    }
    Ok(a)
}

/// `|dmin * m_j|` of every 32-weight sub-block of a Q4_K row: the dequantized value of a
/// zero quant (`x = d*sc_j*0 - dmin*m_j`), so no scale unpacking is repeated here.
fn q4k_mins(row: &[u8]) -> Result<Vec<f32>, String> {
    let mut mins = Vec::with_capacity(row.len() / 144 * 8);
    let mut vals = [0f32; 256];
    for b in row.chunks_exact(144) {
        let mut z = b.to_vec();
        z[16..].fill(0);
        quant::dequantize_row(GgmlType::Q4K, &z, &mut vals).map_err(|e| format!("dequantize Q4_K: {e:?}"))?;
        mins.extend((0..8).map(|j| vals[j * 32].abs()));
    }
    Ok(mins)
}

/// `y[c * rows.len() + i] = W[rows[i]] · x[c]` in f64 over quant's dequantized weight rows
/// (`k` per row, row-major blocks of `ty`) and Q8_1 columns, with what the tolerance is
/// relative to ([`DotRef`]).
pub fn dot_reference(ty: WType, w: &[u8], k: usize, xq: &[u8], ncols: usize, rows: &[u32]) -> Result<DotRef, String> {
    let a = dequant_q8_1_columns(xq, k, ncols)?;
    // Q8_1 block sums `s` (f16 at bytes 2..4 of each 36-byte block), for Q4_K's min term.
    let sums: Vec<f64> =
        xq.chunks_exact(36).map(|b| quant::f16_to_f32(u16::from_le_bytes([b[2], b[3]])).abs() as f64).collect();
    let row_bytes = k / ty.block_k() as usize * ty.block_bytes() as usize;
    // Per row: (dot, magnitude, min term) for every column.
    type RowDots = Result<Vec<(f64, f64, f64)>, String>;
    let per_row: Vec<RowDots> = rows
        .par_iter()
        .map(|&r| {
            let src = w
                .get(r as usize * row_bytes..(r as usize + 1) * row_bytes)
                .ok_or_else(|| format!("row {r} outside the weights"))?;
            let mut wr = vec![0f32; k];
            quant::dequantize_row(ggml(ty), src, &mut wr).map_err(|e| format!("dequantize {ty:?}: {e:?}"))?;
            let mins = if ty == WType::Q4K { q4k_mins(src)? } else { Vec::new() };
            Ok((0..ncols)
                .map(|c| {
                    let (d, m) = wr.iter().zip(&a[c * k..(c + 1) * k]).fold((0f64, 0f64), |(d, m), (&p, &q)| {
                        let t = p as f64 * q as f64;
                        (d + t, m + t.abs())
                    });
                    let t = mins
                        .iter()
                        .zip(&sums[c * k / 32..(c + 1) * k / 32])
                        .map(|(&mj, &sj)| mj as f64 * sj)
                        .sum::<f64>();
                    (d, m, t)
                })
                .collect())
        })
        .collect();
    let n = rows.len();
    let mut out = DotRef { dot: vec![0f64; ncols * n], mag: vec![0f64; ncols * n], min_term: vec![0f64; ncols * n] };
    for (i, r) in per_row.into_iter().enumerate() {
        for (c, (d, m, t)) in r?.into_iter().enumerate() {
            out.dot[c * n + i] = d;
            out.mag[c * n + i] = m;
            out.min_term[c * n + i] = t;
        }
    }
    Ok(out)
}

/// Q8_0 weights x Q8_1 columns in MMQ's documented order (`abi::MmqArgs`, also the CPU's Q8_0
/// `vec_dot` order): per 32-block the exact integer dot, `acc = acc + dot as f32 * (d_w * d_x)`.
/// `y[c * m + r]`.
pub fn q8_0_scalar_order(w: &[u8], xq: &[u8], m: usize, n: usize, k: usize) -> Vec<f32> {
    let nb = k / 32;
    let mut want = vec![0f32; n * m];
    want.par_chunks_mut(m).enumerate().for_each(|(c, out)| {
        for (r, o) in out.iter_mut().enumerate() {
            let mut acc = 0f32;
            for b in 0..nb {
                let wb = &w[(r * nb + b) * 34..(r * nb + b + 1) * 34];
                let xb = &xq[(c * nb + b) * 36..(c * nb + b + 1) * 36];
                let dot: i32 = (0..32).map(|i| wb[2 + i] as i8 as i32 * xb[4 + i] as i8 as i32).sum();
                let dw = quant::f16_to_f32(u16::from_le_bytes([wb[0], wb[1]]));
                let dx = quant::f16_to_f32(u16::from_le_bytes([xb[0], xb[1]]));
                acc += dot as f32 * (dw * dx);
            }
            *o = acc;
        }
    });
    want
}

/// Reference of a fused gate/up GLU from the two dot references: `act(g) * u` (f64) and a
/// per-output error bound that propagates the dots' bounds ([`DotRef::bound`]) through the
/// activation — |act'| <= 1.13 for SiLU and GELU-tanh — plus the activation's own
/// [`GLU_TOL`]. Returns `(value, bound)`.
pub fn glu_reference(gelu: bool, gate: &DotRef, up: &DotRef) -> (Vec<f64>, Vec<f64>) {
    let (g, u) = (&gate.dot, &up.dot);
    let (gb, ub) = (gate.bound(), up.bound());
    let act = |x: f64| {
        if gelu {
            0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        } else {
            x / (1.0 + (-x).exp())
        }
    };
    let mut val = Vec::with_capacity(g.len());
    let mut bound = Vec::with_capacity(g.len());
    for i in 0..g.len() {
        let (dg, du) = (gb[i] + 1e-30, ub[i] + 1e-30);
        let a = act(g[i]);
        let y = a * u[i];
        val.push(y);
        // |d(act(g) u)| <= |act'| dg (|u| + du) + |act(g)| du, act' bounded by 1.13.
        bound.push(1.13 * dg * (u[i].abs() + du) + a.abs() * du + GLU_TOL * y.abs().max(1.0));
    }
    (val, bound)
}

/// The router of model/moe.rs per token: softmax (cpu_kernels), top-k with ties to the lower
/// index, optional renormalisation by the sum clamped at 6.103515625e-5. Returns (ids, weights)
/// in rank order, `k` per token.
pub fn router_reference(logits: &[f32], n_expert: usize, k: usize, renorm: bool) -> (Vec<u32>, Vec<f32>) {
    let (mut ids, mut ws) = (Vec::new(), Vec::new());
    for row in logits.chunks_exact(n_expert) {
        let mut p = row.to_vec();
        cpu_kernels::softmax(&mut p);
        let mut sel = Vec::new();
        cpu_executor::moe::top_k(&p, k, &mut sel);
        if renorm {
            let sum: f32 = sel.iter().map(|&(_, w)| w).sum();
            let sum = sum.max(6.103_515_6e-5);
            sel.iter_mut().for_each(|(_, w)| *w /= sum);
        }
        ids.extend(sel.iter().map(|&(e, _)| e as u32));
        ws.extend(sel.iter().map(|&(_, w)| w));
    }
    (ids, ws)
}

/// Raw cache bytes of one KV tensor: (rows, int8 scales).
pub fn raw_kv_bytes(r: cpu_executor::kv_cache::RawRows) -> (Vec<u8>, Vec<u8>) {
    use cpu_executor::kv_cache::RawRows;
    match r {
        RawRows::F16(v) => (v.iter().flat_map(|x| x.to_le_bytes()).collect(), Vec::new()),
        RawRows::Int8 { q, scale } => {
            (q.iter().map(|&x| x as u8).collect(), scale.iter().flat_map(|x| x.to_le_bytes()).collect())
        }
        RawRows::F32(v) => (v.iter().flat_map(|x| x.to_le_bytes()).collect(), Vec::new()),
    }
}
