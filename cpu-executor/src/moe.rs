//! The MoE FFN on the CPU, for every architecture with routed experts ([`model::MoeSpec`]): the
//! shared decoder's qwen3moe layers (experts as stacks) and qwen4exp's (one matrix an expert,
//! plus the sigmoid-gated shared expert).
//!
//! Router probabilities are a softmax over `ffn_gate_inp · x`; each token picks the top
//! `n_expert_used` experts (ties go to the lower expert index), optionally renormalises their
//! weights (llama.cpp clamps the sum at [`model::MIN_WEIGHT_SUM`] before dividing), and sums the
//! weighted SwiGLU expert outputs. Tokens are grouped by expert so each expert runs one product
//! over all rows that chose it. The products are the caller's ([`Products`]): each
//! architecture keeps llama.cpp's choice of kernel for its own tensors.

use super::grow;
use crate::qwen4exp::{MatCpu, NumericsCpu};
use crate::{DecoderMatmul, Numerics};
use model::qwen4exp::{Moe, SwiGlu};
use model::{Decoder, MIN_WEIGHT_SUM, Mat, MoeSpec};

/// Reusable buffers (only grow).
#[derive(Default)]
pub(crate) struct MoeScratch {
    logits: Vec<f32>,
    /// Per token: (expert, weight) for the selected experts, in rank order.
    sel: Vec<(usize, f32)>,
    rows: Vec<usize>,
    xin: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    /// Ordered mode: every (token, slot)'s expert output, combined in rank order at the end.
    slots: Vec<f32>,
}

/// `y[n][rows] = x[n][cols] Wᵀ` for matrix `e` of `w` (0 for a plain matrix): an
/// architecture's products in the numerics the session runs.
pub(crate) type Products<'a> = &'a dyn Fn(&Mat, usize, &[f32], usize, &mut [f32]);

/// The routed experts of one layer, as the architecture stores them.
#[derive(Clone, Copy)]
pub(crate) enum Experts<'a> {
    /// `[n_expert]` stacks of gate, up and down (the shared decoder's `*_exps` tensors).
    Stacks([&'a Mat; 3]),
    /// One SwiGLU an expert (qwen4exp: the expert tiers copy and compute them one by one).
    Each(&'a [SwiGlu]),
}

impl Experts<'_> {
    /// Expert `e`'s gate, up and down, each with its index in the matrix it is part of.
    fn ffn(&self, e: usize) -> [(&Mat, usize); 3] {
        match self {
            Experts::Stacks([g, u, d]) => [(g, e), (u, e), (d, e)],
            Experts::Each(f) => [(&f[e].gate, 0), (&f[e].up, 0), (&f[e].down, 0)],
        }
    }
}

/// One MoE layer's weights: the router, the routed experts and the optional shared expert
/// with its gate row (present exactly when `spec.shared_expert` is).
pub(crate) struct MoeLayer<'a> {
    pub spec: &'a MoeSpec,
    pub router: &'a Mat,
    pub experts: Experts<'a>,
    pub shared: Option<(&'a Mat, &'a SwiGlu)>,
}

/// Top-`k` of `probs` in descending order; equal values keep the lower index first.
pub fn top_k(probs: &[f32], k: usize, out: &mut Vec<(usize, f32)>) {
    let start = out.len();
    for _ in 0..k {
        let mut best: Option<(usize, f32)> = None;
        for (e, &p) in probs.iter().enumerate() {
            if out[start..].iter().any(|&(s, _)| s == e) {
                continue;
            }
            if best.is_none_or(|(_, bp)| p > bp) {
                best = Some((e, p));
            }
        }
        if let Some(b) = best {
            out.push(b);
        }
    }
}

/// Softmax in the float order of the GPU's `moe_router` kernel (one wave per token): max,
/// `quant::fmath::expf(x - max)`, lane `l` sums experts `l, l + 32, ..` from 0, the 32 lane
/// sums added by the xor butterfly (1, 2, 4, 8, 16), times `1 / sum`.
pub fn softmax_wave_order(x: &mut [f32]) {
    let mx = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    x.iter_mut().for_each(|v| *v = quant::fmath::expf(*v - mx));
    let mut lanes = [0f32; 32];
    for (l, s) in lanes.iter_mut().enumerate() {
        for v in x.iter().skip(l).step_by(32) {
            *s += *v;
        }
    }
    for step in [1usize, 2, 4, 8, 16] {
        let prev = lanes;
        for (l, s) in lanes.iter_mut().enumerate() {
            *s = prev[l] + prev[l ^ step];
        }
    }
    let inv = 1.0 / lanes[0];
    x.iter_mut().for_each(|v| *v *= inv);
}

/// One token's expert choice from its router logits (overwritten by the probabilities),
/// appended to `out` as `(expert, weight)` by decreasing probability. Ordered numerics: the
/// softmax in `moe_router`'s order ([`softmax_wave_order`]).
pub fn route(num: Numerics, spec: &MoeSpec, logits: &mut [f32], out: &mut Vec<(usize, f32)>) {
    if num == Numerics::Ordered {
        softmax_wave_order(logits);
    } else {
        cpu_kernels::softmax(logits);
    }
    let start = out.len();
    top_k(logits, spec.n_expert_used, out);
    if spec.norm_weights {
        let sum: f32 = out[start..].iter().map(|&(_, w)| w).sum();
        let sum = sum.max(MIN_WEIGHT_SUM);
        out[start..].iter_mut().for_each(|(_, w)| *w /= sum);
    }
}

/// `out[n][d] = Σ_selected w_e · down_e(silu(gate_e x) * up_e x) [+ σ(w_sh·x) · shared(x)]` for
/// every row of `xn`; `layer` names the routing for `--dump-routing`.
///
/// With [`Numerics::Ordered`] the GPU ordered mode's numerics: [`softmax_wave_order`],
/// `quant::fmath`'s SiLU and sigmoid, and each token's expert outputs added in rank order from
/// 0.0 (`moe_combine`) instead of by increasing expert id.
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_ffn(
    layer: Option<usize>,
    w: &MoeLayer,
    mm: Products,
    num: Numerics,
    xn: &[f32],
    n: usize,
    out: &mut [f32],
    s: &mut MoeScratch,
) {
    let ordered = num == Numerics::Ordered;
    let d = w.router.cols;
    let (ne, k) = (w.spec.n_expert, w.spec.n_expert_used);
    grow(&mut s.logits, n * ne);
    mm(w.router, 0, xn, n, &mut s.logits);
    s.sel.clear();
    for i in 0..n {
        let start = s.sel.len();
        route(num, w.spec, &mut s.logits[i * ne..(i + 1) * ne], &mut s.sel);
        if let Some(l) = layer.filter(|_| experts::trace::dumping()) {
            let (ids, ws): (Vec<u32>, Vec<f32>) = s.sel[start..].iter().map(|&(e, w)| (e as u32, w)).unzip();
            experts::trace::dump(l, &ids, &ws);
        }
    }
    out[..n * d].fill(0.0);
    if ordered {
        grow(&mut s.slots, n * k * d);
    }
    for e in 0..ne {
        s.rows.clear();
        s.rows.extend((0..n * k).filter(|&j| s.sel[j].0 == e));
        let r = s.rows.len();
        if r == 0 {
            continue;
        }
        grow(&mut s.xin, r * d);
        grow(&mut s.down, r * d);
        for (j, &sj) in s.rows.iter().enumerate() {
            let i = sj / k;
            s.xin[j * d..(j + 1) * d].copy_from_slice(&xn[i * d..(i + 1) * d]);
        }
        let [gate, up, down] = w.experts.ffn(e);
        swiglu(mm, num, [gate, up, down], &s.xin, r, [&mut s.gate, &mut s.up], &mut s.down);
        if ordered {
            for (j, &sj) in s.rows.iter().enumerate() {
                s.slots[sj * d..(sj + 1) * d].copy_from_slice(&s.down[j * d..(j + 1) * d]);
            }
            continue;
        }
        for (j, &sj) in s.rows.iter().enumerate() {
            let (i, w) = (sj / k, s.sel[sj].1);
            let dst = &mut out[i * d..(i + 1) * d];
            dst.iter_mut().zip(&s.down[j * d..(j + 1) * d]).for_each(|(o, x)| *o += w * x);
        }
    }
    if ordered {
        for i in 0..n {
            let dst = &mut out[i * d..(i + 1) * d];
            for j in 0..k {
                let (sj, w) = (i * k + j, s.sel[i * k + j].1);
                dst.iter_mut().zip(&s.slots[sj * d..(sj + 1) * d]).for_each(|(o, x)| *o += w * x);
            }
        }
    }
    if let Some((gate_row, shared)) = w.shared {
        grow(&mut s.down, n * d);
        let f = [(&shared.gate, 0), (&shared.up, 0), (&shared.down, 0)];
        swiglu(mm, num, f, xn, n, [&mut s.gate, &mut s.up], &mut s.down);
        grow(&mut s.logits, n);
        mm(gate_row, 0, xn, n, &mut s.logits);
        for t in 0..n {
            let g = num.sigmoid(s.logits[t]);
            let dst = &mut out[t * d..(t + 1) * d];
            dst.iter_mut().zip(&s.down[t * d..(t + 1) * d]).for_each(|(a, &b)| *a += g * b);
        }
    }
}

/// `y = down(silu(gate x) ⊙ up x)` for `n` rows of `x`, in `num`'s SiLU.
fn swiglu(
    mm: Products,
    num: Numerics,
    [(gate, eg), (up, eu), (down, ed)]: [(&Mat, usize); 3],
    x: &[f32],
    n: usize,
    [g, u]: [&mut Vec<f32>; 2],
    y: &mut [f32],
) {
    let ff = gate.rows;
    grow(g, n * ff);
    grow(u, n * ff);
    mm(gate, eg, x, n, g);
    mm(up, eu, x, n, u);
    g[..n * ff].iter_mut().zip(&u[..n * ff]).for_each(|(a, &b)| *a = num.silu(*a) * b);
    mm(down, ed, &g[..n * ff], n, y);
}

/// The shared decoder's MoE layer (`Ffn::Moe`) with its products ([`DecoderMatmul::mm`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn decoder_moe(
    layer: usize,
    m: &Decoder,
    spec: &MoeSpec,
    [router, gate, up, down]: [&Mat; 4],
    xn: &[f32],
    n: usize,
    out: &mut [f32],
    s: &mut MoeScratch,
    p: Numerics,
) {
    let w = MoeLayer { spec, router, experts: Experts::Stacks([gate, up, down]), shared: None };
    moe_ffn(Some(layer), &w, &|w, e, x, n, y| m.mm(p, w, e, x, n, y), p, xn, n, out, s)
}

/// qwen4exp's products: [`NumericsCpu::matmul`] on its plain matrices.
fn qwen4exp_products(num: Numerics) -> impl Fn(&Mat, usize, &[f32], usize, &mut [f32]) {
    move |w, e, x, n, y| {
        debug_assert_eq!(e, 0, "{w:?}: qwen4exp's matrices are one each");
        num.matmul(w, x, n, y)
    }
}

/// The CPU executor's methods on [`SwiGlu`] (a type of the `model` crate, which knows no backend).
pub trait SwiGluCpu {
    /// `y = down(silu(gate x) ⊙ up x)` for `n` tokens.
    fn forward(&self, x: &[f32], n: usize, y: &mut [f32]) {
        self.forward_with(Numerics::Llama, x, n, y)
    }

    /// [`Self::forward`] in the float order `num` names.
    fn forward_with(&self, num: Numerics, x: &[f32], n: usize, y: &mut [f32]);

    /// [`Self::forward`] of one token whose input was quantized once for every expert it chose
    /// ([`SwiGluCpu::shared_acts`]): the same bits.
    fn forward_shared(&self, acts: &crate::ExpertActs, y: &mut [f32]);

    /// One token's input `x` quantized once for the gate and up products of experts shaped
    /// like this one, as [`Self::forward`] prepares it; None where it prepares per product.
    fn shared_acts(&self, x: &[f32]) -> Option<crate::ExpertActs>;
}

impl SwiGluCpu for SwiGlu {
    fn forward_with(&self, num: Numerics, x: &[f32], n: usize, y: &mut [f32]) {
        let f = [(&self.gate, 0), (&self.up, 0), (&self.down, 0)];
        let (mut g, mut u) = (Vec::new(), Vec::new());
        swiglu(&qwen4exp_products(num), num, f, x, n, [&mut g, &mut u], y);
    }

    fn forward_shared(&self, acts: &crate::ExpertActs, y: &mut [f32]) {
        let ff = self.gate.rows;
        let (mut g, mut u) = (vec![0f32; ff], vec![0f32; ff]);
        let [ag, au] = acts.gate_up();
        crate::matmul_prepared(&self.gate.qt(), ag, &mut g);
        crate::matmul_prepared(&self.up.qt(), au, &mut u);
        g.iter_mut().zip(&u).for_each(|(a, &b)| *a = Numerics::Llama.silu(*a) * b);
        Numerics::Llama.matmul(&self.down, &g, 1, y);
    }

    fn shared_acts(&self, x: &[f32]) -> Option<crate::ExpertActs> {
        // One token: `MatCpu::matmul` runs `matmul_ggml` on the types with kernels.
        let kernels = [&self.gate, &self.up].iter().all(|m| cpu_kernels::SUPPORTED_TYPES.contains(&m.ty));
        kernels.then(|| crate::ExpertActs::new(cpu_kernels::ActsFor::Ggml, &self.gate, &self.up, x, 1)).flatten()
    }
}

/// The CPU executor's methods on qwen4exp's [`Moe`] (a type of the `model` crate, which knows
/// no backend): [`moe_ffn`] with its products.
pub trait MoeCpu {
    /// Expert choice of one token: `(expert, weight)` by decreasing probability.
    fn route(&self, logits: &[f32]) -> Vec<(usize, f32)> {
        self.route_with(Numerics::Llama, logits)
    }

    /// [`Self::route`] in the float order `num` names ([`route`]).
    fn route_with(&self, num: Numerics, logits: &[f32]) -> Vec<(usize, f32)>;

    /// `y [n][E]` for `x [n][E]`. Tokens routed to the same expert are batched.
    fn forward(&self, x: &[f32], n: usize, y: &mut [f32]) {
        self.forward_layer(None, x, n, y)
    }

    /// [`Self::forward`] as MoE layer `layer` of a model: its routing goes to `--dump-routing`.
    fn forward_layer(&self, layer: Option<usize>, x: &[f32], n: usize, y: &mut [f32]) {
        self.forward_layer_with(Numerics::Llama, layer, x, n, y)
    }

    /// [`Self::forward_layer`] in the float order `num` names ([`moe_ffn`]).
    fn forward_layer_with(&self, num: Numerics, layer: Option<usize>, x: &[f32], n: usize, y: &mut [f32]);
}

impl MoeCpu for Moe {
    fn route_with(&self, num: Numerics, logits: &[f32]) -> Vec<(usize, f32)> {
        let mut sel = Vec::with_capacity(self.spec.n_expert_used);
        route(num, &self.spec, &mut logits.to_vec(), &mut sel);
        sel
    }

    fn forward_layer_with(&self, num: Numerics, layer: Option<usize>, x: &[f32], n: usize, y: &mut [f32]) {
        let w = MoeLayer {
            spec: &self.spec,
            router: &self.router,
            experts: Experts::Each(&self.experts),
            shared: Some((&self.shared_gate, &self.shared)),
        };
        moe_ffn(layer, &w, &qwen4exp_products(num), num, x, n, y, &mut MoeScratch::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_ties_prefer_lower_index() {
        let mut out = Vec::new();
        top_k(&[0.1, 0.4, 0.4, 0.1], 2, &mut out);
        assert_eq!(out, vec![(1, 0.4), (2, 0.4)]);
        out.clear();
        top_k(&[0.3, 0.2, 0.3, 0.2], 3, &mut out);
        assert_eq!(out.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 2, 1]);
    }
}
