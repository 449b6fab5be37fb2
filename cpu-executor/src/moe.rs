//! Routed mixture-of-experts FFN (Qwen3-MoE style).
//!
//! Router probabilities are a softmax over `ffn_gate_inp · x`; each token picks the top
//! `n_expert_used` experts (ties go to the lower expert index), optionally renormalises their
//! weights (llama.cpp clamps the sum at 6.103515625e-5 before dividing), and sums the weighted
//! SwiGLU expert outputs. Tokens are grouped by expert so each expert runs one matmul over all
//! rows that selected it.

use cpu_kernels as ck;

use super::grow;
use crate::{DecoderMatmul, Numerics};
use model::{Decoder, Mat, MoeSpec};

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
    act: Vec<f32>,
    down: Vec<f32>,
    /// Ordered mode: every (token, slot)'s expert output, combined in rank order at the end.
    slots: Vec<f32>,
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

/// `out[n][d] = Σ_selected w_e · down_e(silu(gate_e x) * up_e x)` for every row of `xn`.
///
/// `p`: the products' kernels; with [`Numerics::Ordered`] (`Session::ordered`) the GPU
/// ordered mode's numerics — [`DecoderMatmul::mm`] products, [`softmax_wave_order`],
/// `quant::fmath::silu`, and each token's expert outputs added in rank order from 0.0
/// (`moe_combine`) instead of by increasing expert id.
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_ffn(
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
    let ordered = p == Numerics::Ordered;
    let d = router.cols;
    let (ne, k, ff) = (spec.n_expert, spec.n_expert_used, spec.n_ff_exp);
    grow(&mut s.logits, n * ne);
    m.mm(p, router, 0, xn, n, &mut s.logits);
    s.sel.clear();
    for i in 0..n {
        let probs = &mut s.logits[i * ne..(i + 1) * ne];
        if ordered {
            softmax_wave_order(probs);
        } else {
            ck::softmax(probs);
        }
        let start = s.sel.len();
        top_k(probs, k, &mut s.sel);
        if spec.norm_weights {
            let sum: f32 = s.sel[start..].iter().map(|&(_, w)| w).sum();
            let sum = sum.max(6.103_515_6e-5);
            s.sel[start..].iter_mut().for_each(|(_, w)| *w /= sum);
        }
        if experts::trace::dumping() {
            let (ids, ws): (Vec<u32>, Vec<f32>) = s.sel[start..].iter().map(|&(e, w)| (e as u32, w)).unzip();
            experts::trace::dump(layer, &ids, &ws);
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
        grow(&mut s.gate, r * ff);
        grow(&mut s.up, r * ff);
        grow(&mut s.act, r * ff);
        grow(&mut s.down, r * d);
        for (j, &sj) in s.rows.iter().enumerate() {
            let i = sj / k;
            s.xin[j * d..(j + 1) * d].copy_from_slice(&xn[i * d..(i + 1) * d]);
        }
        m.mm(p, gate, e, &s.xin, r, &mut s.gate);
        m.mm(p, up, e, &s.xin, r, &mut s.up);
        if ordered {
            let act = &mut s.act[..r * ff];
            act.iter_mut()
                .zip(&s.gate[..r * ff])
                .zip(&s.up[..r * ff])
                .for_each(|((o, &g), &u)| *o = quant::fmath::silu(g) * u);
        } else {
            ck::swiglu(&s.gate[..r * ff], &s.up[..r * ff], &mut s.act[..r * ff]);
        }
        m.mm(p, down, e, &s.act, r, &mut s.down);
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
