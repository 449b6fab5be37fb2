//! Causal (optionally sliding-window) multi-head attention over the KV cache.
//!
//! Numerics follow llama.cpp's non-flash path with an f16 cache: `K·q` is an f16 x f16 dot
//! (ggml converts the f32 query to f16 for an f16 matrix), softmax in f32, and the
//! probabilities are converted to f16 before they weight the f16 V rows. With an int8 cache
//! the query and probabilities stay f32.
//!
//! Work is split over (token, head) pairs with rayon; per-thread scratch (scores and the
//! rounded query) lives in a thread-local that only grows.

use std::cell::RefCell;

use rayon::prelude::*;

use crate::f16::round_f16;
use crate::kv_cache::KvLayer;

#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Position of the first query row.
    pub pos0: usize,
    /// Keys further back than `window - 1` positions are masked.
    pub window: Option<usize>,
    pub kq_scale: f32,
}

thread_local! {
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `out[i][h] = softmax(scale * q[i][h] · K[lo..=pos]) · V[lo..=pos]` for every query row `i`
/// (position `pos0 + i`) and head `h`. The cache must already hold positions `..= pos0 + n - 1`.
pub fn attend(kv: &KvLayer, q: &[f32], out: &mut [f32], sh: Shape) {
    let hd = sh.head_dim;
    let group = sh.n_head / sh.n_head_kv;
    let f16 = kv.is_f16();
    let work = |idx: usize, o: &mut [f32]| {
        let (i, h) = (idx / sh.n_head, idx % sh.n_head);
        let pos = sh.pos0 + i;
        let lo = match sh.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        };
        let kvh = h / group;
        let qh = &q[idx * hd..(idx + 1) * hd];
        SCRATCH.with(|cell| {
            let (scores, qr) = &mut *cell.borrow_mut();
            if qr.len() < hd {
                qr.resize(hd, 0.0);
            }
            let qr = &mut qr[..hd];
            if f16 {
                qr.iter_mut().zip(qh).for_each(|(a, b)| *a = round_f16(*b));
            } else {
                qr.copy_from_slice(qh);
            }
            let m = pos + 1 - lo;
            if scores.len() < m {
                scores.resize(m, 0.0);
            }
            let sc = &mut scores[..m];
            for (j, s) in sc.iter_mut().enumerate() {
                *s = kv.dot_k(lo + j, kvh, qr) * sh.kq_scale;
            }
            cpu_kernels::softmax(sc);
            o.fill(0.0);
            for (j, &p) in sc.iter().enumerate() {
                let p = if f16 { round_f16(p) } else { p };
                if p != 0.0 {
                    kv.axpy_v(lo + j, kvh, p, o);
                }
            }
        });
    };
    let n_items = out.len() / hd;
    if n_items <= 1 {
        out.chunks_mut(hd).enumerate().for_each(|(i, o)| work(i, o));
    } else {
        out.par_chunks_mut(hd).enumerate().for_each(|(i, o)| work(i, o));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::{KvCache, KvType, LayerCache};

    /// Sliding window and GQA head mapping against a direct computation on the stored rows.
    #[test]
    fn window_and_gqa_match_direct_softmax() {
        let (hd, nkv, nh, cap) = (8, 2, 4, 12);
        let mut cache = KvCache::new(KvType::F16, cap, &[(nkv, hd)]);
        let LayerCache::Attention(kv) = &mut cache.layers[0];
        let val = |p: usize, i: usize| ((p * 31 + i * 7) % 17) as f32 * 0.1 - 0.8;
        let mut rows_k = Vec::new();
        let mut rows_v = Vec::new();
        for p in 0..cap {
            let k: Vec<f32> = (0..nkv * hd).map(|i| crate::f16::round_f16(val(p, i))).collect();
            let v: Vec<f32> = (0..nkv * hd).map(|i| crate::f16::round_f16(val(p + 3, i) * 0.5)).collect();
            kv.write(p, &k, &v);
            rows_k.push(k);
            rows_v.push(v);
        }
        let q: Vec<f32> = (0..nh * hd).map(|i| crate::f16::round_f16((i % 5) as f32 * 0.25 - 0.5)).collect();
        for window in [None, Some(3)] {
            let pos = 9;
            let mut out = vec![0f32; nh * hd];
            attend(kv, &q, &mut out, Shape { n_head: nh, n_head_kv: nkv, head_dim: hd, pos0: pos, window, kq_scale: 0.5 });
            let lo = window.map_or(0, |w| pos + 1 - w);
            for h in 0..nh {
                let g = h / (nh / nkv);
                let s: Vec<f64> = (lo..=pos)
                    .map(|j| (0..hd).map(|t| q[h * hd + t] as f64 * rows_k[j][g * hd + t] as f64).sum::<f64>() * 0.5)
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for t in 0..hd {
                    let want: f64 = (lo..=pos).zip(&s).map(|(j, x)| (x - m).exp() / z * rows_v[j][g * hd + t] as f64).sum();
                    let got = out[h * hd + t] as f64;
                    assert!((got - want).abs() < 2e-3, "window {window:?} head {h} dim {t}: {got} vs {want}");
                }
            }
        }
    }
}
