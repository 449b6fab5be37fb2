//! Flash-Next's MoE FFN on the CPU (described in `model::qwen4exp::moe`): routing, the routed
//! SwiGLU experts and the sigmoid-gated shared expert.

use super::linear::{MatCpu, Numerics, NumericsCpu};
use model::qwen4exp::moe::MIN_WEIGHT_SUM;
use model::qwen4exp::{Moe, SwiGlu};

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
        let ff = self.gate.rows;
        let mut g = vec![0f32; n * ff];
        let mut u = vec![0f32; n * ff];
        num.matmul(&self.gate, x, n, &mut g);
        num.matmul(&self.up, x, n, &mut u);
        g.iter_mut().zip(&u).for_each(|(a, &b)| *a = num.silu(*a) * b);
        num.matmul(&self.down, &g, n, y);
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

/// The CPU executor's methods on [`Moe`] (a type of the `model` crate, which knows no backend).
pub trait MoeCpu {
    /// Expert choice of one token: `(expert, weight)` by decreasing probability.
    fn route(&self, logits: &[f32]) -> Vec<(usize, f32)> {
        self.route_with(Numerics::Llama, logits)
    }

    /// [`Self::route`] in the float order `num` names (ordered: the softmax in `moe_router`'s
    /// order, `crate::moe::softmax_wave_order`).
    fn route_with(&self, num: Numerics, logits: &[f32]) -> Vec<(usize, f32)>;

    /// `y [n][E]` for `x [n][E]`. Tokens routed to the same expert are batched.
    fn forward(&self, x: &[f32], n: usize, y: &mut [f32]);

    /// [`Self::forward`] as MoE layer `layer` of a model: its routing goes to `--dump-routing`.
    fn forward_layer(&self, layer: Option<usize>, x: &[f32], n: usize, y: &mut [f32]) {
        self.forward_layer_with(Numerics::Llama, layer, x, n, y)
    }

    /// [`Self::forward_layer`] in the float order `num` names; ordered, each token's expert
    /// outputs are added in rank order from 0 (the device's `moe_combine`), not by expert id.
    fn forward_layer_with(&self, num: Numerics, layer: Option<usize>, x: &[f32], n: usize, y: &mut [f32]);
}

impl MoeCpu for Moe {
    fn route_with(&self, num: Numerics, logits: &[f32]) -> Vec<(usize, f32)> {
        if num == Numerics::Ordered {
            let mut p = logits.to_vec();
            crate::moe::softmax_wave_order(&mut p);
            let mut sel = Vec::with_capacity(self.n_used);
            crate::moe::top_k(&p, self.n_used, &mut sel);
            let wsum: f32 = sel.iter().map(|&(_, w)| w).sum();
            let denom = wsum.max(MIN_WEIGHT_SUM);
            return sel.into_iter().map(|(e, w)| (e, w / denom)).collect();
        }
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut p: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
        let sum: f64 = p.iter().map(|&v| v as f64).sum();
        let inv = (1.0 / sum) as f32;
        p.iter_mut().for_each(|v| *v *= inv);
        let mut idx: Vec<usize> = (0..p.len()).collect();
        idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        idx.truncate(self.n_used);
        let wsum: f32 = idx.iter().map(|&e| p[e]).sum();
        let denom = wsum.max(MIN_WEIGHT_SUM);
        idx.into_iter().map(|e| (e, p[e] / denom)).collect()
    }

    fn forward(&self, x: &[f32], n: usize, y: &mut [f32]) {
        self.forward_layer(None, x, n, y)
    }

    fn forward_layer_with(&self, num: Numerics, layer: Option<usize>, x: &[f32], n: usize, y: &mut [f32]) {
        let e = self.router.cols;
        let ne = self.router.rows;
        let mut logits = vec![0f32; n * ne];
        num.matmul(&self.router, x, n, &mut logits);
        let routes: Vec<Vec<(usize, f32)>> =
            (0..n).map(|t| self.route_with(num, &logits[t * ne..(t + 1) * ne])).collect();
        if let Some(l) = layer.filter(|_| experts::trace::dumping()) {
            for r in &routes {
                let (ids, ws): (Vec<u32>, Vec<f32>) = r.iter().map(|&(e, w)| (e as u32, w)).unzip();
                experts::trace::dump(l, &ids, &ws);
            }
        }
        y[..n * e].fill(0.0);
        // Ordered: each (token, rank) slot's output, added in rank order below.
        let mut slots = vec![0f32; if num == Numerics::Ordered { n * self.n_used * e } else { 0 }];
        for (ex, expert) in self.experts.iter().enumerate() {
            let toks: Vec<(usize, f32)> = routes
                .iter()
                .enumerate()
                .filter_map(|(t, r)| r.iter().find(|(id, _)| *id == ex).map(|&(_, w)| (t, w)))
                .collect();
            if toks.is_empty() {
                continue;
            }
            let xs: Vec<f32> = toks.iter().flat_map(|&(t, _)| x[t * e..(t + 1) * e].iter().copied()).collect();
            let mut ys = vec![0f32; toks.len() * e];
            expert.forward_with(num, &xs, toks.len(), &mut ys);
            if num == Numerics::Ordered {
                for (i, &(t, _)) in toks.iter().enumerate() {
                    let rank = routes[t].iter().position(|&(id, _)| id == ex).unwrap_or(0);
                    slots[(t * self.n_used + rank) * e..][..e].copy_from_slice(&ys[i * e..(i + 1) * e]);
                }
                continue;
            }
            for (i, &(t, w)) in toks.iter().enumerate() {
                y[t * e..(t + 1) * e].iter_mut().zip(&ys[i * e..(i + 1) * e]).for_each(|(a, &b)| *a += w * b);
            }
        }
        for (t, r) in routes.iter().enumerate().filter(|_| num == Numerics::Ordered) {
            let yt = &mut y[t * e..(t + 1) * e];
            for (rank, &(_, w)) in r.iter().enumerate() {
                let ys = &slots[(t * self.n_used + rank) * e..][..e];
                yt.iter_mut().zip(ys).for_each(|(a, &b)| *a += w * b);
            }
        }
        let mut sh = vec![0f32; n * e];
        self.shared.forward_with(num, x, n, &mut sh);
        let mut sg = vec![0f32; n];
        num.matmul(&self.shared_gate, x, n, &mut sg);
        for t in 0..n {
            let g = num.sigmoid(sg[t]);
            y[t * e..(t + 1) * e].iter_mut().zip(&sh[t * e..(t + 1) * e]).for_each(|(a, &b)| *a += g * b);
        }
    }
}
