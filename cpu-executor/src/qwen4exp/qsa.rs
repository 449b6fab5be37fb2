//! QSA and dense attention on the CPU (the computation, and the numerics copied from
//! llama.cpp, are described in `model::qwen4exp::qsa`): projections, norms and rope, the block
//! indexer's cell selection ([`heap_select`]), softmax attention over the kept cells.

use super::linear::{Numerics, NumericsCpu, rms_norm, rope_angles, rope_head, round_f16};
use model::qwen4exp::qsa::TAIL_BIAS;
use model::qwen4exp::{Indexer, Qsa, QsaCache};

/// The projections of one window of `n` tokens: the inputs of [`QsaCpu::mix`] (the device's
/// `GpuOps::qsa_mix` takes the same).
#[derive(Clone, Debug, PartialEq)]
pub struct QsaProjections {
    /// `[n][H][q_h | gate_h]`.
    pub qf: Vec<f32>,
    /// `[n][KV][D]` each.
    pub kp: Vec<f32>,
    pub vp: Vec<f32>,
    /// The indexer's raw keys `[n][Di]` and queries `[n][Hi][Di]` (empty without indexer).
    pub kappa: Vec<f32>,
    pub iq: Vec<f32>,
}

/// The CPU executor's methods on [`Qsa`] (a type of the `model` crate, which knows no backend).
pub trait QsaCpu {
    /// Runs `n` tokens `x [n][E]` at positions `start..start+n` (the cache must hold exactly
    /// `start` cells); writes `y [n][E]`. Also returns the kept cells per token when
    /// `want_selection` (for tests and diagnostics).
    fn forward(
        &self,
        x: &[f32],
        n: usize,
        start: usize,
        cache: &mut QsaCache,
        y: &mut [f32],
        want_selection: bool,
    ) -> Vec<Vec<usize>> {
        self.forward_with(Numerics::Llama, x, n, start, cache, y, want_selection)
    }

    /// [`Self::forward`] in the float order `num` names.
    #[allow(clippy::too_many_arguments)]
    fn forward_with(
        &self,
        num: Numerics,
        x: &[f32],
        n: usize,
        start: usize,
        cache: &mut QsaCache,
        y: &mut [f32],
        want_selection: bool,
    ) -> Vec<Vec<usize>>;

    /// The window's projections of `x [n][E]`.
    fn project(&self, x: &[f32], n: usize) -> QsaProjections {
        self.project_with(Numerics::Llama, x, n)
    }

    fn project_with(&self, num: Numerics, x: &[f32], n: usize) -> QsaProjections;

    /// Everything between the projections: norms and rope, the cache appends, the indexer's
    /// selection and the gated attention; returns `[n][H·D]` (the output projection's input)
    /// and, when `want_selection`, the kept cells per token.
    fn mix(
        &self,
        p: &QsaProjections,
        n: usize,
        start: usize,
        cache: &mut QsaCache,
        want_selection: bool,
    ) -> (Vec<f32>, Vec<Vec<usize>>) {
        self.mix_with(Numerics::Llama, p, n, start, cache, want_selection)
    }

    /// [`Self::mix`] in the float order `num` names.
    fn mix_with(
        &self,
        num: Numerics,
        p: &QsaProjections,
        n: usize,
        start: usize,
        cache: &mut QsaCache,
        want_selection: bool,
    ) -> (Vec<f32>, Vec<Vec<usize>>);
}

impl QsaCpu for Qsa {
    fn forward_with(
        &self,
        num: Numerics,
        x: &[f32],
        n: usize,
        start: usize,
        cache: &mut QsaCache,
        y: &mut [f32],
        want_selection: bool,
    ) -> Vec<Vec<usize>> {
        let p = self.project_with(num, x, n);
        let (attn, selections) = self.mix_with(num, &p, n, start, cache, want_selection);
        num.matmul(&self.o, &attn, n, y);
        selections
    }

    fn project_with(&self, num: Numerics, x: &[f32], n: usize) -> QsaProjections {
        let (nh, nkv, d) = (self.n_head, self.n_head_kv, self.head_dim);
        let mut qf = vec![0f32; n * 2 * nh * d];
        num.matmul(&self.q, x, n, &mut qf);
        let mut kp = vec![0f32; n * nkv * d];
        num.matmul(&self.k, x, n, &mut kp);
        let mut vp = vec![0f32; n * nkv * d];
        num.matmul(&self.v, x, n, &mut vp);
        let (mut kappa, mut iq) = (Vec::new(), Vec::new());
        if let Some(ix) = &self.indexer {
            kappa = vec![0f32; n * ix.dim];
            num.matmul(&ix.k, x, n, &mut kappa);
            iq = vec![0f32; n * ix.heads * ix.dim];
            num.matmul(&ix.q, x, n, &mut iq);
        }
        QsaProjections { qf, kp, vp, kappa, iq }
    }

    fn mix_with(
        &self,
        num: Numerics,
        p: &QsaProjections,
        n: usize,
        start: usize,
        cache: &mut QsaCache,
        want_selection: bool,
    ) -> (Vec<f32>, Vec<Vec<usize>>) {
        let (nh, nkv, d) = (self.n_head, self.n_head_kv, self.head_dim);
        let f16 = cache.is_f16();
        let rnd = |v: f32| if f16 { round_f16(v) } else { v };
        let (qf, kp, vp) = (&p.qf, &p.kp, &p.vp);

        // q heads (normed, roped) and gates; new K/V cells.
        let mut q = vec![0f32; n * nh * d];
        let mut gate = vec![0f32; n * nh * d];
        let angles: Vec<Vec<(f32, f32)>> = (0..n).map(|t| rope_angles(start + t, self.n_rot, self.rope_base)).collect();
        for t in 0..n {
            for h in 0..nh {
                let src = &qf[(t * nh + h) * 2 * d..(t * nh + h) * 2 * d + 2 * d];
                let qh = &mut q[(t * nh + h) * d..(t * nh + h + 1) * d];
                rms_norm(&src[..d], Some(&self.q_norm), self.eps, qh);
                rope_head(qh, &angles[t]);
                gate[(t * nh + h) * d..(t * nh + h + 1) * d].copy_from_slice(&src[d..]);
            }
            for h in 0..nkv {
                let mut kh = vec![0f32; d];
                rms_norm(&kp[(t * nkv + h) * d..(t * nkv + h + 1) * d], Some(&self.k_norm), self.eps, &mut kh);
                rope_head(&mut kh, &angles[t]);
                cache.k.push(&kh);
            }
            cache.v.push(&vp[t * nkv * d..(t + 1) * nkv * d]);
        }

        // Indexer: cache raw keys, pool newly completed blocks, score per query.
        let mut iq = Vec::new();
        if let Some(ix) = &self.indexer {
            cache.kappa.push(&p.kappa);
            let cells = cache.kappa.len() / ix.dim;
            let mut row = vec![0f32; ix.dim];
            while (cache.blocks.len() / ix.dim + 1) * ix.ratio <= cells {
                let b = cache.blocks.len() / ix.dim;
                let mut mean = vec![0f32; ix.dim];
                for j in b * ix.ratio..(b + 1) * ix.ratio {
                    cache.kappa.read(j * ix.dim, &mut row);
                    mean.iter_mut().zip(&row).for_each(|(m, &k)| *m += k);
                }
                mean.iter_mut().for_each(|m| *m /= ix.ratio as f32);
                let mut kb = vec![0f32; ix.dim];
                rms_norm(&mean, Some(&ix.k_norm), self.eps, &mut kb);
                rope_head(&mut kb, &rope_angles(b * ix.ratio, self.n_rot, self.rope_base));
                cache.blocks.extend_from_slice(&kb);
            }
            iq = p.iq.clone();
            for t in 0..n {
                for h in 0..ix.heads {
                    let r = &mut iq[(t * ix.heads + h) * ix.dim..(t * ix.heads + h + 1) * ix.dim];
                    let tmp = r.to_vec();
                    rms_norm(&tmp, Some(&ix.q_norm), self.eps, r);
                    rope_head(r, &angles[t]);
                }
            }
        }

        let scale = 1.0 / (d as f32).sqrt();
        let group = nh / nkv;
        let mut attn = vec![0f32; n * nh * d];
        let mut selections = Vec::new();
        for t in 0..n {
            let pos = start + t;
            let visible = pos + 1;
            let sel: Vec<usize> = match &self.indexer {
                Some(ix) if visible > ix.top_k + ix.ratio - 1 => {
                    let iqt = &iq[t * ix.heads * ix.dim..(t + 1) * ix.heads * ix.dim];
                    let vals = cell_values(ix, iqt, &cache.blocks, pos);
                    heap_select(&vals, ix.top_k + ix.ratio - 1)
                }
                _ => (0..visible).collect(),
            };
            let mut sc = vec![0f32; sel.len()];
            let mut cell = vec![0f32; d];
            for h in 0..nh {
                let kvh = h / group;
                let qh: Vec<f32> = q[(t * nh + h) * d..(t * nh + h + 1) * d].iter().map(|&v| rnd(v)).collect();
                for (s, &j) in sc.iter_mut().zip(&sel) {
                    cache.k.read((j * nkv + kvh) * d, &mut cell);
                    *s = qh.iter().zip(&cell).map(|(a, b)| a * b).sum::<f32>() * scale;
                }
                softmax_f32(num, &mut sc);
                let oh = &mut attn[(t * nh + h) * d..(t * nh + h + 1) * d];
                for (&p, &j) in sc.iter().zip(&sel) {
                    let p = rnd(p);
                    cache.v.read((j * nkv + kvh) * d, &mut cell);
                    oh.iter_mut().zip(&cell).for_each(|(o, &v)| *o += p * v);
                }
            }
            if want_selection {
                selections.push(sel);
            }
        }
        attn.iter_mut().zip(&gate).for_each(|(a, &g)| *a *= num.sigmoid(g));
        (attn, selections)
    }
}

/// The top-k input row for query position `pos`: one value per visible cell `0..=pos`.
fn cell_values(ix: &Indexer, iq: &[f32], blocks: &[f32], pos: usize) -> Vec<f32> {
    let r = ix.ratio;
    let tail = (pos + 1) / r * r;
    let mut vals = Vec::with_capacity(pos + 1);
    for b in 0..tail / r {
        let kb = &blocks[b * ix.dim..(b + 1) * ix.dim];
        let mut s = 0f32;
        for h in 0..ix.heads {
            let qh = &iq[h * ix.dim..(h + 1) * ix.dim];
            s += qh.iter().zip(kb).map(|(a, b)| a * b).sum::<f32>().max(0.0);
        }
        vals.extend(std::iter::repeat_n(s, r));
    }
    // The tail cells share one block, hence one value; any value above every score keeps the
    // same heap order (llama.cpp adds 1e9 in f32 to the block's score or to 0).
    vals.extend(std::iter::repeat_n(TAIL_BIAS, pos + 1 - tail));
    vals
}

/// ggml_soft_max on one row: max-shifted exp, sum in f64, scaled by 1/sum.
fn softmax_f32(num: Numerics, x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = num.exp(*v - max);
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// The index set `std::partial_sort(idx, idx + k, idx + n, v[a] > v[b])` leaves in
/// `idx[..k]` with libstdc++'s algorithm (make_heap on the first k, then for each later
/// element that beats the heap top: pop the top into its place and sift the newcomer in).
/// Returned sorted ascending. Ties are resolved exactly as that heap order resolves them.
pub fn heap_select(vals: &[f32], k: usize) -> Vec<usize> {
    let n = vals.len();
    if k >= n {
        return (0..n).collect();
    }
    let mut a: Vec<usize> = (0..n).collect();
    // comp(x, y) = v[x] > v[y]: a min-heap on value, the top is the weakest kept element.
    let comp = |x: usize, y: usize| vals[x] > vals[y];
    if k >= 2 {
        let mut parent = (k - 2) / 2;
        loop {
            let v = a[parent];
            adjust_heap(&mut a, parent, k, v, &comp);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    for i in k..n {
        if k > 0 && comp(a[i], a[0]) {
            let v = a[i];
            a[i] = a[0];
            adjust_heap(&mut a, 0, k, v, &comp);
        }
    }
    let mut kept = a[..k].to_vec();
    kept.sort_unstable();
    kept
}

/// libstdc++ `__adjust_heap`: move the hole at `hole` down to a leaf along the preferred
/// children, then push `value` back up towards `hole`'s original place.
fn adjust_heap(a: &mut [usize], mut hole: usize, len: usize, value: usize, comp: &impl Fn(usize, usize) -> bool) {
    let top = hole;
    let mut second = hole;
    while len >= 2 && second < (len - 1) / 2 {
        second = 2 * (second + 1);
        if comp(a[second], a[second - 1]) {
            second -= 1;
        }
        a[hole] = a[second];
        hole = second;
    }
    if len.is_multiple_of(2) && len >= 2 && second == (len - 2) / 2 {
        second = 2 * (second + 1);
        a[hole] = a[second - 1];
        hole = second - 1;
    }
    // __push_heap
    while hole > top {
        let parent = (hole - 1) / 2;
        if !comp(a[parent], value) {
            break;
        }
        a[hole] = a[parent];
        hole = parent;
    }
    a[hole] = value;
}
