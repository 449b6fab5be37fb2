//! QSA: sparse attention whose cells are chosen by a block indexer (and plain dense causal
//! attention, the same layer without indexer).
//!
//! Per token t (position = cell index, one sequence):
//! - `W_q x` gives per head `[q_h | gate_h]`; `q_h = rope(rms(q_h; q_norm), t)`,
//!   `k = rope(rms(W_k x; k_norm), t)`, `v = W_v x`. Rope is NEOX on the first `n_rot` dims
//!   (IMROPE with all four position components equal to t).
//! - Indexer: raw keys `κ_j = W_ik x_j` are cached; a complete block b (cells `[b·r, b·r+r)`)
//!   has key `K_b = rope(rms(mean κ; ik_norm), b·r)`; queries `ι_h = rope(rms((W_iq x)_h), t)`;
//!   block score `s_b = Σ_h relu(ι_h·K_b)`.
//! - Cell values: cells of the incomplete tail block `[⌊(t+1)/r⌋·r, t]` get `1e9 + s` (always
//!   kept), earlier cells their block's score, later cells −inf. With budget `W = top_k + r − 1`
//!   and more than W visible cells, the kept set is what libstdc++'s `std::partial_sort` keeps
//!   ([`heap_select`]): all cells of a block tie, so the heap order decides which part of the
//!   boundary block survives, and a token whose block is complete can lose itself.
//! - Softmax over the kept cells of `q·k/√D`, GQA (`kv head = h / (H/KV)`), then
//!   `o_h ⊙ σ(gate_h)` and `W_o`.
//!
//! With an F16 cache (llama.cpp's default) K, V and κ are stored as f16, q is rounded
//! to f16 for `q·k` and the probabilities are rounded to f16 before the product with V (ggml's
//! non-flash attention path); the indexer scores stay f32.

use super::linear::{Mat, RopeAngles, rms_norm, round_f16, sigmoid};

/// The block indexer of a QSA layer.
#[derive(Debug)]
pub struct Indexer {
    pub heads: usize,
    pub dim: usize,
    pub top_k: usize,
    /// Block ratio r (cells per block).
    pub ratio: usize,
    /// `[Ki·Di][E]`.
    pub q: Mat,
    /// `[Di][E]`.
    pub k: Mat,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
}

/// Weights of one attention layer.
#[derive(Debug)]
pub struct Qsa {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub rope_base: f32,
    pub eps: f32,
    /// `[2·H·D][E]`, per head `[q_h | gate_h]`.
    pub q: Mat,
    pub k: Mat,
    pub v: Mat,
    /// `[E][H·D]`.
    pub o: Mat,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    /// `None`: dense causal attention.
    pub indexer: Option<Indexer>,
}

/// Cache rows as llama.cpp stores them: f32, or f16 (`type_k`/`type_v` = f16, the default).
#[derive(Clone, Debug, PartialEq)]
pub enum CacheBuf {
    F32(Vec<f32>),
    /// IEEE half bits (values rounded to nearest-even on insertion).
    F16(Vec<u16>),
}

impl CacheBuf {
    fn new(f16: bool) -> CacheBuf {
        if f16 {
            CacheBuf::F16(Vec::new())
        } else {
            CacheBuf::F32(Vec::new())
        }
    }

    /// Stored values.
    pub fn len(&self) -> usize {
        match self {
            CacheBuf::F32(v) => v.len(),
            CacheBuf::F16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn push(&mut self, vals: &[f32]) {
        match self {
            CacheBuf::F32(v) => v.extend_from_slice(vals),
            CacheBuf::F16(v) => v.extend(vals.iter().map(|&x| quant::f32_to_f16(x))),
        }
    }

    /// Keeps the first `n` values.
    pub fn truncate(&mut self, n: usize) {
        match self {
            CacheBuf::F32(v) => v.truncate(n),
            CacheBuf::F16(v) => v.truncate(n),
        }
    }

    /// Values `start..start + out.len()` as f32 (exact for f16).
    pub fn read(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            CacheBuf::F32(v) => out.copy_from_slice(&v[start..end]),
            CacheBuf::F16(v) => {
                for (o, &h) in out.iter_mut().zip(&v[start..end]) {
                    *o = quant::f16_to_f32(h);
                }
            }
        }
    }
}

/// Per-sequence cache of one attention layer: one cell per position.
#[derive(Clone, Debug, PartialEq)]
pub struct QsaCache {
    /// `[cells][KV·D]` after norm and rope.
    pub k: CacheBuf,
    pub v: CacheBuf,
    /// Raw indexer keys `[cells][Di]` (same type as K, like llama.cpp's third cache).
    pub kappa: CacheBuf,
    /// Block keys of the complete blocks `[blocks][Di]`, f32 (a pure function of `kappa`).
    pub blocks: Vec<f32>,
}

impl QsaCache {
    pub fn new(f16: bool) -> QsaCache {
        QsaCache {
            k: CacheBuf::new(f16),
            v: CacheBuf::new(f16),
            kappa: CacheBuf::new(f16),
            blocks: Vec::new(),
        }
    }

    /// Keeps the first `cells` of `cur_cells` cells (speculative-decoding rollback). Per-cell
    /// widths follow from the current lengths; `block = (ratio, Di)` of an indexed layer drops
    /// the pooled keys of blocks that are no longer complete (they are a pure function of the
    /// kept `kappa`, so the result equals a cache that never saw the dropped cells).
    pub fn truncate(&mut self, cells: usize, cur_cells: usize, block: Option<(usize, usize)>) {
        if cur_cells == 0 || cells >= cur_cells {
            return;
        }
        for b in [&mut self.k, &mut self.v, &mut self.kappa] {
            let per = b.len() / cur_cells;
            b.truncate(cells * per);
        }
        if let Some((ratio, dim)) = block {
            self.blocks.truncate(cells / ratio * dim);
        }
    }

    /// Whether values are stored as f16 (and q / probabilities rounded accordingly).
    pub fn is_f16(&self) -> bool {
        matches!(self.k, CacheBuf::F16(_))
    }
}

/// Added to the tail cells' values (in f32) so that they always win the top-k.
const TAIL_BIAS: f32 = 1e9;

impl Qsa {
    /// Cells in the cache.
    pub fn cells(&self, cache: &QsaCache) -> usize {
        cache.k.len() / (self.n_head_kv * self.head_dim)
    }

    /// Runs `n` tokens `x [n][E]` at positions `start..start+n` (the cache must hold exactly
    /// `start` cells); writes `y [n][E]`. Also returns the kept cells per token when
    /// `want_selection` (for tests and diagnostics).
    pub fn forward(
        &self,
        x: &[f32],
        n: usize,
        start: usize,
        cache: &mut QsaCache,
        y: &mut [f32],
        want_selection: bool,
    ) -> Vec<Vec<usize>> {
        let (nh, nkv, d) = (self.n_head, self.n_head_kv, self.head_dim);
        let f16 = cache.is_f16();
        let rnd = |v: f32| if f16 { round_f16(v) } else { v };
        let mut qf = vec![0f32; n * 2 * nh * d];
        self.q.matmul(x, n, &mut qf);
        let mut kp = vec![0f32; n * nkv * d];
        self.k.matmul(x, n, &mut kp);
        let mut vp = vec![0f32; n * nkv * d];
        self.v.matmul(x, n, &mut vp);

        // q heads (normed, roped) and gates; new K/V cells.
        let mut q = vec![0f32; n * nh * d];
        let mut gate = vec![0f32; n * nh * d];
        let angles: Vec<RopeAngles> = (0..n)
            .map(|t| RopeAngles::new(start + t, self.n_rot, self.rope_base))
            .collect();
        for t in 0..n {
            for h in 0..nh {
                let src = &qf[(t * nh + h) * 2 * d..(t * nh + h) * 2 * d + 2 * d];
                let qh = &mut q[(t * nh + h) * d..(t * nh + h + 1) * d];
                rms_norm(&src[..d], Some(&self.q_norm), self.eps, qh);
                angles[t].apply(qh);
                gate[(t * nh + h) * d..(t * nh + h + 1) * d].copy_from_slice(&src[d..]);
            }
            for h in 0..nkv {
                let mut kh = vec![0f32; d];
                rms_norm(
                    &kp[(t * nkv + h) * d..(t * nkv + h + 1) * d],
                    Some(&self.k_norm),
                    self.eps,
                    &mut kh,
                );
                angles[t].apply(&mut kh);
                cache.k.push(&kh);
            }
            cache.v.push(&vp[t * nkv * d..(t + 1) * nkv * d]);
        }

        // Indexer: cache raw keys, pool newly completed blocks, score per query.
        let mut iq = Vec::new();
        if let Some(ix) = &self.indexer {
            let mut kap = vec![0f32; n * ix.dim];
            ix.k.matmul(x, n, &mut kap);
            cache.kappa.push(&kap);
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
                RopeAngles::new(b * ix.ratio, self.n_rot, self.rope_base).apply(&mut kb);
                cache.blocks.extend_from_slice(&kb);
            }
            iq = vec![0f32; n * ix.heads * ix.dim];
            ix.q.matmul(x, n, &mut iq);
            for t in 0..n {
                for h in 0..ix.heads {
                    let r = &mut iq[(t * ix.heads + h) * ix.dim..(t * ix.heads + h + 1) * ix.dim];
                    let tmp = r.to_vec();
                    rms_norm(&tmp, Some(&ix.q_norm), self.eps, r);
                    angles[t].apply(r);
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
                let qh: Vec<f32> = q[(t * nh + h) * d..(t * nh + h + 1) * d]
                    .iter()
                    .map(|&v| rnd(v))
                    .collect();
                for (s, &j) in sc.iter_mut().zip(&sel) {
                    cache.k.read((j * nkv + kvh) * d, &mut cell);
                    *s = qh.iter().zip(&cell).map(|(a, b)| a * b).sum::<f32>() * scale;
                }
                softmax_f32(&mut sc);
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
        attn.iter_mut()
            .zip(&gate)
            .for_each(|(a, &g)| *a *= sigmoid(g));
        self.o.matmul(&attn, n, y);
        selections
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
fn softmax_f32(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
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
fn adjust_heap(
    a: &mut [usize],
    mut hole: usize,
    len: usize,
    value: usize,
    comp: &impl Fn(usize, usize) -> bool,
) {
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
