//! Routed mixture-of-experts FFN (Qwen3-MoE style).
//!
//! Router probabilities are a softmax over `ffn_gate_inp · x`; each token picks the top
//! `n_expert_used` experts (ties go to the lower expert index), optionally renormalises their
//! weights (llama.cpp clamps the sum at 6.103515625e-5 before dividing), and sums the weighted
//! SwiGLU expert outputs. Tokens are grouped by expert so each expert runs one matmul over all
//! rows that selected it.

use cpu_kernels as ck;

use super::forward::grow;
use super::{MoeSpec, Model, W};

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

/// `out[n][d] = Σ_selected w_e · down_e(silu(gate_e x) * up_e x)` for every row of `xn`.
pub(crate) fn moe_ffn(
    m: &Model,
    spec: &MoeSpec,
    [router, gate, up, down]: [&W; 4],
    xn: &[f32],
    n: usize,
    out: &mut [f32],
    s: &mut MoeScratch,
) {
    let d = router.cols;
    let (ne, k, ff) = (spec.n_expert, spec.n_expert_used, spec.n_ff_exp);
    grow(&mut s.logits, n * ne);
    m.mm(router, 0, xn, n, &mut s.logits);
    s.sel.clear();
    for i in 0..n {
        let probs = &mut s.logits[i * ne..(i + 1) * ne];
        ck::softmax(probs);
        let start = s.sel.len();
        top_k(probs, k, &mut s.sel);
        if spec.norm_weights {
            let sum: f32 = s.sel[start..].iter().map(|&(_, w)| w).sum();
            let sum = sum.max(6.103515625e-5);
            s.sel[start..].iter_mut().for_each(|(_, w)| *w /= sum);
        }
    }
    out[..n * d].fill(0.0);
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
        m.mm(gate, e, &s.xin, r, &mut s.gate);
        m.mm(up, e, &s.xin, r, &mut s.up);
        ck::swiglu(&s.gate[..r * ff], &s.up[..r * ff], &mut s.act[..r * ff]);
        m.mm(down, e, &s.act, r, &mut s.down);
        for (j, &sj) in s.rows.iter().enumerate() {
            let (i, w) = (sj / k, s.sel[sj].1);
            let dst = &mut out[i * d..(i + 1) * d];
            dst.iter_mut().zip(&s.down[j * d..(j + 1) * d]).for_each(|(o, x)| *o += w * x);
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
