//! Attention for one query position of one head over a slice of the KV cache.
//!
//! The engine calls [`attention_one`] per (query head, position); grouped-query attention is the
//! caller passing the same K/V rows to several query heads. Keys and values may be stored as
//! f32, f16 (IEEE half bits) or int8 with one f32 scale per cached row (`value = q * scale`).
//! Steps: `s_p = scale * dot(q, k_p)`, optional soft-capping `s_p = cap * tanh(s_p / cap)`,
//! optional additive mask/bias, softmax over p, `out = sum_p softmax(s)_p * v_p`.

use crate::{ops, KernelError};
use rayon::prelude::*;

/// Rows of a K or V cache for one head: row `p` (cached position p) starts at `p * stride`
/// elements and holds `head_dim` values (`head_dim = q.len()`).
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    F32 { data: &'a [f32], stride: usize },
    /// IEEE binary16 bit patterns.
    F16 { data: &'a [u16], stride: usize },
    /// int8 values, row p scaled by `scales[p * scale_stride]`.
    I8 { data: &'a [i8], scales: &'a [f32], stride: usize, scale_stride: usize },
}

impl KvRows<'_> {
    fn check(&self, n_kv: usize, head_dim: usize, what: &'static str) -> Result<(), KernelError> {
        if n_kv == 0 {
            return Ok(());
        }
        let (len, stride) = match self {
            KvRows::F32 { data, stride } => (data.len(), *stride),
            KvRows::F16 { data, stride } => (data.len(), *stride),
            KvRows::I8 { data, scales, stride, scale_stride } => {
                let need = (n_kv - 1) * scale_stride + 1;
                if scales.len() < need {
                    return Err(KernelError::Shape { what, expected: need, got: scales.len() });
                }
                (data.len(), *stride)
            }
        };
        let need = (n_kv - 1) * stride + head_dim;
        if len < need {
            return Err(KernelError::Shape { what, expected: need, got: len });
        }
        Ok(())
    }

    /// dot(q, row p)
    #[inline]
    fn dot(&self, p: usize, q: &[f32]) -> f32 {
        let d = q.len();
        match *self {
            KvRows::F32 { data, stride } => dot_f32(q, &data[p * stride..p * stride + d]),
            KvRows::F16 { data, stride } => crate::float::dot_f32_f16(q, &data[p * stride..p * stride + d]),
            KvRows::I8 { data, scales, stride, scale_stride } => {
                let row = &data[p * stride..p * stride + d];
                let mut acc = [0f32; 8];
                let mut qc = q.chunks_exact(8);
                let mut rc = row.chunks_exact(8);
                for (a, b) in (&mut qc).zip(&mut rc) {
                    for i in 0..8 {
                        acc[i] += a[i] * b[i] as f32;
                    }
                }
                let mut s: f32 = acc.iter().sum();
                for (a, &b) in qc.remainder().iter().zip(rc.remainder()) {
                    s += a * b as f32;
                }
                s * scales[p * scale_stride]
            }
        }
    }

    /// out += w * row p
    #[inline]
    fn axpy(&self, p: usize, w: f32, out: &mut [f32]) {
        let d = out.len();
        match *self {
            KvRows::F32 { data, stride } => {
                for (o, &v) in out.iter_mut().zip(&data[p * stride..p * stride + d]) {
                    *o += w * v;
                }
            }
            KvRows::F16 { data, stride } => crate::float::axpy_f16(w, &data[p * stride..p * stride + d], out),
            KvRows::I8 { data, scales, stride, scale_stride } => {
                let ws = w * scales[p * scale_stride];
                for (o, &v) in out.iter_mut().zip(&data[p * stride..p * stride + d]) {
                    *o += ws * v as f32;
                }
            }
        }
    }
}

fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let mut ac = a.chunks_exact(16);
    let mut bc = b.chunks_exact(16);
    for (x, y) in (&mut ac).zip(&mut bc) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ac.remainder().iter().zip(bc.remainder()) {
        s += x * y;
    }
    s
}

/// Parameters of [`attention_one`].
#[derive(Clone, Copy, Debug)]
pub struct AttnParams<'a> {
    /// Multiplies q·k (usually 1/sqrt(head_dim), Gemma 3 uses query_pre_attn_scalar^-0.5).
    pub scale: f32,
    /// Soft-capping of the scaled logits (`cap * tanh(s / cap)`); `None` or `Some(0.0)` disables.
    pub softcap: Option<f32>,
    /// Optional additive bias per position (e.g. `-inf` for masked sliding-window positions),
    /// applied after soft-capping. Length must be >= n_kv.
    pub mask: Option<&'a [f32]>,
}

/// Attention of one query vector `q` (length head_dim) over cached positions `0..n_kv`.
/// `scores` is scratch (resized to n_kv; after the call it holds the softmax probabilities);
/// `out` (length head_dim) receives the weighted sum of values. With n_kv = 0 `out` is zeroed.
pub fn attention_one(
    q: &[f32],
    k: &KvRows,
    v: &KvRows,
    n_kv: usize,
    params: &AttnParams,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let d = q.len();
    if out.len() != d {
        return Err(KernelError::Shape { what: "attention out (head_dim)", expected: d, got: out.len() });
    }
    k.check(n_kv, d, "attention keys")?;
    v.check(n_kv, d, "attention values")?;
    if let Some(m) = params.mask
        && m.len() < n_kv
    {
        return Err(KernelError::Shape { what: "attention mask", expected: n_kv, got: m.len() });
    }
    scores.clear();
    scores.extend((0..n_kv).map(|p| k.dot(p, q) * params.scale));
    if let Some(cap) = params.softcap
        && cap != 0.0
    {
        ops::softcap(scores, cap);
    }
    if let Some(m) = params.mask {
        for (s, &b) in scores.iter_mut().zip(m) {
            *s += b;
        }
    }
    ops::softmax(scores);
    out.iter_mut().for_each(|o| *o = 0.0);
    for (p, &w) in scores.iter().enumerate() {
        if w != 0.0 {
            v.axpy(p, w, out);
        }
    }
    Ok(())
}

/// Causal attention of `n_q` consecutive query positions of one head (prompt processing).
///
/// Query i (row `i` of `q`, `q_stride` elements apart, length `head_dim`) sits at cache
/// position `pos0 + i` and attends positions `lo..=pos0 + i`, where `lo = pos + 1 - window`
/// with a sliding window (`Some(window)`, Gemma's local layers) or 0. `k`/`v` must hold at
/// least `pos0 + n_q` rows. Output row i goes to `out[i * out_stride..][..head_dim]`.
/// Queries are spread over rayon in groups of 8; `params.mask` must be `None` (the causal and
/// window masks are implied).
#[allow(clippy::too_many_arguments)]
pub fn attention_causal(
    q: &[f32],
    q_stride: usize,
    head_dim: usize,
    n_q: usize,
    pos0: usize,
    k: &KvRows,
    v: &KvRows,
    params: &AttnParams,
    window: Option<usize>,
    out: &mut [f32],
    out_stride: usize,
) -> Result<(), KernelError> {
    if n_q == 0 {
        return Ok(());
    }
    if params.mask.is_some() {
        return Err(KernelError::Shape { what: "attention_causal mask (must be None)", expected: 0, got: 1 });
    }
    let need_q = (n_q - 1) * q_stride + head_dim;
    if q.len() < need_q {
        return Err(KernelError::Shape { what: "attention_causal queries", expected: need_q, got: q.len() });
    }
    let need_o = (n_q - 1) * out_stride + head_dim;
    if out.len() < need_o || out_stride < head_dim {
        return Err(KernelError::Shape { what: "attention_causal out", expected: need_o, got: out.len() });
    }
    k.check(pos0 + n_q, head_dim, "attention keys")?;
    v.check(pos0 + n_q, head_dim, "attention values")?;
    const GROUP: usize = 8;
    #[cfg(target_arch = "x86_64")]
    let blocked = head_dim.is_multiple_of(8) && head_dim > 0 && crate::x86::has_avx2();
    let run = |(g, chunk): (usize, &mut [f32])| {
        let mut scores = Vec::new();
        #[cfg(target_arch = "x86_64")]
        if blocked {
            let first = g * GROUP;
            let nq = GROUP.min(n_q - first);
            let qs: Vec<&[f32]> = (first..first + nq).map(|i| &q[i * q_stride..i * q_stride + head_dim]).collect();
            let hi: Vec<usize> = (first..first + nq).map(|i| pos0 + i).collect();
            let lo: Vec<usize> = hi.iter().map(|&p| window.map_or(0, |w| (p + 1).saturating_sub(w.max(1)))).collect();
            let mut outs: Vec<&mut [f32]> = chunk.chunks_mut(out_stride).take(nq).map(|r| &mut r[..head_dim]).collect();
            // SAFETY: AVX2/FMA/F16C checked (`blocked`), head_dim % 8 == 0, every query and
            // output row has head_dim values, and k/v were checked to hold pos0 + n_q rows.
            unsafe { crate::attn_block::attend_block(&qs, &lo, &hi, head_dim, k, v, params, &mut scores, &mut outs) };
            return;
        }
        let mut tmp = vec![0f32; head_dim];
        for j in 0..GROUP {
            let i = g * GROUP + j;
            if i >= n_q || j * out_stride >= chunk.len() {
                break;
            }
            let pos = pos0 + i;
            let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w.max(1)));
            let qi = &q[i * q_stride..i * q_stride + head_dim];
            let (ks, vs) = (k.skip(lo), v.skip(lo));
            // Shapes were checked above, so this cannot fail.
            let _ = attention_one(qi, &ks, &vs, pos + 1 - lo, params, &mut scores, &mut tmp);
            chunk[j * out_stride..j * out_stride + head_dim].copy_from_slice(&tmp);
        }
    };
    let work = n_q * (pos0 + n_q) * head_dim;
    if work < (1 << 20) {
        out.chunks_mut(GROUP * out_stride).enumerate().for_each(run);
    } else {
        out.par_chunks_mut(GROUP * out_stride).enumerate().for_each(run);
    }
    Ok(())
}

impl<'a> KvRows<'a> {
    /// The same rows starting at position `p`.
    fn skip(&self, p: usize) -> KvRows<'a> {
        match *self {
            KvRows::F32 { data, stride } => KvRows::F32 { data: &data[(p * stride).min(data.len())..], stride },
            KvRows::F16 { data, stride } => KvRows::F16 { data: &data[(p * stride).min(data.len())..], stride },
            KvRows::I8 { data, scales, stride, scale_stride } => KvRows::I8 {
                data: &data[(p * stride).min(data.len())..],
                scales: &scales[(p * scale_stride).min(scales.len())..],
                stride,
                scale_stride,
            },
        }
    }
}

/// Decode-time grouped-query attention: `n_q` query heads (rows of `q`, `q_stride` apart) that
/// share one KV head, all at the newest position `n_kv - 1`, attending positions
/// `n_kv - window..n_kv` (`window: None` = all). Equivalent to [`attention_one`] per head (with
/// no mask), but with AVX2 every K/V row is read once for up to 8 heads.
#[allow(clippy::too_many_arguments)]
pub fn attention_shared_kv(
    q: &[f32],
    q_stride: usize,
    head_dim: usize,
    n_q: usize,
    n_kv: usize,
    k: &KvRows,
    v: &KvRows,
    params: &AttnParams,
    window: Option<usize>,
    out: &mut [f32],
    out_stride: usize,
) -> Result<(), KernelError> {
    if n_q == 0 {
        return Ok(());
    }
    if params.mask.is_some() {
        return Err(KernelError::Shape { what: "attention_shared_kv mask (must be None)", expected: 0, got: 1 });
    }
    let need_q = (n_q - 1) * q_stride + head_dim;
    if q.len() < need_q {
        return Err(KernelError::Shape { what: "attention_shared_kv queries", expected: need_q, got: q.len() });
    }
    let need_o = (n_q - 1) * out_stride + head_dim;
    if out.len() < need_o || out_stride < head_dim {
        return Err(KernelError::Shape { what: "attention_shared_kv out", expected: need_o, got: out.len() });
    }
    k.check(n_kv, head_dim, "attention keys")?;
    v.check(n_kv, head_dim, "attention values")?;
    if n_kv == 0 {
        for i in 0..n_q {
            out[i * out_stride..i * out_stride + head_dim].iter_mut().for_each(|o| *o = 0.0);
        }
        return Ok(());
    }
    let lo = window.map_or(0, |w| n_kv.saturating_sub(w.max(1)));
    let mut scores = Vec::new();
    #[cfg(target_arch = "x86_64")]
    if head_dim.is_multiple_of(8) && crate::x86::has_avx2() {
        let mut first = 0;
        while first < n_q {
            let nq = crate::attn_block::G.min(n_q - first);
            let qs: Vec<&[f32]> = (first..first + nq).map(|i| &q[i * q_stride..i * q_stride + head_dim]).collect();
            let los = vec![lo; nq];
            let his = vec![n_kv - 1; nq];
            let mut outs: Vec<&mut [f32]> =
                out[first * out_stride..].chunks_mut(out_stride).take(nq).map(|r| &mut r[..head_dim]).collect();
            // SAFETY: AVX2/FMA/F16C checked, head_dim % 8 == 0, rows of head_dim values, and
            // k/v hold n_kv rows (checked above).
            unsafe { crate::attn_block::attend_block(&qs, &los, &his, head_dim, k, v, params, &mut scores, &mut outs) };
            first += nq;
        }
        return Ok(());
    }
    let mut tmp = vec![0f32; head_dim];
    for i in 0..n_q {
        let (ks, vs) = (k.skip(lo), v.skip(lo));
        attention_one(&q[i * q_stride..i * q_stride + head_dim], &ks, &vs, n_kv - lo, params, &mut scores, &mut tmp)?;
        out[i * out_stride..i * out_stride + head_dim].copy_from_slice(&tmp);
    }
    Ok(())
}
