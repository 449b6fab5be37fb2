//! Per-sequence layer caches.
//!
//! Every model layer owns one [`LayerCache`]; today the only kind is the attention KV cache,
//! but the enum is the extension point for hybrid models whose recurrent layers (e.g. Gated
//! DeltaNet) keep a fixed-size per-sequence state instead of per-position rows.
//!
//! The attention cache stores one row of `n_head_kv * head_dim` values per position for K and
//! for V, either as f16 (default; exactly what llama.cpp stores, so attention numerics match),
//! as int8 with one f32 scale per (position, kv head) row (`--kv int8`, half the memory), or as
//! f32 (`--kv f32`, llama.cpp's `-ctk f32 -ctv f32`; CPU only). [`KvType`] is the one cache
//! type of every architecture (Flash-Next's QSA caches take it too).

use crate::f16;
pub use model::{KvRows, KvType};

/// K and V of one attention layer, `capacity` positions: each a [`KvRows`] of
/// `capacity · n_head_kv · head_dim` values, row `(pos, head)` at `(pos · n_head_kv + head) ·
/// head_dim` (int8: one scale per such row).
pub struct KvLayer {
    n_head_kv: usize,
    head_dim: usize,
    k: KvRows,
    v: KvRows,
}

/// The cache of one layer; one variant per layer kind.
pub enum LayerCache {
    /// Softmax attention: rows per position.
    Attention(KvLayer),
}

/// The caches of all layers of one sequence.
pub struct KvCache {
    pub ty: KvType,
    pub capacity: usize,
    pub layers: Vec<LayerCache>,
}

impl KvCache {
    /// `layers[i] = (n_head_kv, head_dim)` of an attention layer. Panics when the memory
    /// cannot be reserved: [`KvCache::try_new`] is the engine's.
    pub fn new(ty: KvType, capacity: usize, layers: &[(usize, usize)]) -> KvCache {
        KvCache::try_new(ty, capacity, layers).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`KvCache::new`], with a size that overflows or memory that cannot be reserved as an
    /// error naming the size (the engine checks its memory plan first; this is the backstop).
    pub fn try_new(
        ty: KvType,
        capacity: usize,
        layers: &[(usize, usize)],
    ) -> Result<KvCache, model::error::EngineError> {
        let layers = layers
            .iter()
            .map(|&(n_head_kv, head_dim)| {
                KvLayer::try_new(ty, capacity, n_head_kv, head_dim).map(LayerCache::Attention)
            })
            .collect::<Result<_, _>>()?;
        Ok(KvCache { ty, capacity, layers })
    }

    /// Bytes held by the cache buffers.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Attention(a) => a.k.bytes() + a.v.bytes(),
            })
            .sum()
    }
}

/// Writes row `pos` (all kv heads) of one tensor from f32: f16 through the F16C conversion
/// (the same round-to-nearest-even as [`KvRows::write`]'s scalar one, faster for prompts).
fn write_row(rows: &mut KvRows, pos: usize, row: &[f32]) {
    let w = row.len();
    match rows {
        KvRows::F16(v) => f16::from_f32(row, &mut v[pos * w..(pos + 1) * w]),
        other => other.write(pos * w, row),
    }
}

/// Raw rows of one cache tensor (K or V): `[cell][n_head_kv][head_dim]`, f16 bits or int8
/// with one f32 scale per `[cell][n_head_kv]` (the layout the GPU `kv_store` writes), or f32.
#[derive(Clone, Copy, Debug)]
pub enum RawRows<'a> {
    F16(&'a [u16]),
    Int8 { q: &'a [i8], scale: &'a [f32] },
    F32(&'a [f32]),
}

fn raw(rows: &KvRows) -> RawRows<'_> {
    match rows {
        KvRows::F16(v) => RawRows::F16(v),
        KvRows::Int8 { q, scale, .. } => RawRows::Int8 { q, scale },
        KvRows::F32(v) => RawRows::F32(v),
    }
}

impl KvLayer {
    fn try_new(
        ty: KvType,
        capacity: usize,
        n_head_kv: usize,
        head_dim: usize,
    ) -> Result<KvLayer, model::error::EngineError> {
        let too_big = |why: String| {
            model::error::EngineError::Memory(format!(
                "a KV cache of {capacity} positions ({n_head_kv} x {head_dim} values a position and layer) cannot be allocated: {why}"
            ))
        };
        let values = capacity.checked_mul(n_head_kv * head_dim).ok_or_else(|| too_big("the size overflows".into()))?;
        let rows = || KvRows::try_zeroed(ty, values, head_dim).map_err(too_big);
        Ok(KvLayer { n_head_kv, head_dim, k: rows()?, v: rows()? })
    }

    /// Stores K and V rows (`n_head_kv * head_dim` each) for position `pos`.
    pub fn write(&mut self, pos: usize, k: &[f32], v: &[f32]) {
        write_row(&mut self.k, pos, k);
        write_row(&mut self.v, pos, v);
    }

    /// The raw K rows.
    pub fn k_raw(&self) -> RawRows<'_> {
        raw(&self.k)
    }
    /// The raw V rows.
    pub fn v_raw(&self) -> RawRows<'_> {
        raw(&self.v)
    }
    pub fn n_head_kv(&self) -> usize {
        self.n_head_kv
    }
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Whether this layer rounds the query and the probabilities to f16 like ggml's f16 matmul.
    pub fn is_f16(&self) -> bool {
        matches!(self.k, KvRows::F16(_))
    }

    /// The whole f16 K and V stores (None for an int8 cache): row (pos, head) starts at
    /// `(pos * n_head_kv + head) * head_dim`, the capacity is `len / (n_head_kv * head_dim)`.
    pub fn planes_f16(&self) -> Option<(&[u16], &[u16])> {
        match (&self.k, &self.v) {
            (KvRows::F16(k), KvRows::F16(v)) => Some((k, v)),
            _ => None,
        }
    }

    /// Raw f16 K and V rows of (pos, head) (None for an int8 cache).
    pub fn rows_f16(&self, pos: usize, head: usize) -> Option<(&[u16], &[u16])> {
        let hd = self.head_dim;
        let off = (pos * self.n_head_kv + head) * hd;
        match (&self.k, &self.v) {
            (KvRows::F16(k), KvRows::F16(v)) => Some((&k[off..off + hd], &v[off..off + hd])),
            _ => None,
        }
    }

    /// `q . K[pos, head]`; with an f16 cache `q` must already be f16-rounded by the caller.
    #[inline]
    pub fn dot_k(&self, pos: usize, head: usize, q: &[f32]) -> f32 {
        let hd = self.head_dim;
        let off = (pos * self.n_head_kv + head) * hd;
        match &self.k {
            KvRows::F16(k) => f16::dot(&k[off..off + hd], q),
            KvRows::Int8 { q: kq, scale, .. } => {
                let row = &kq[off..off + hd];
                let s: f32 = row.iter().zip(q).map(|(a, b)| *a as f32 * b).sum();
                s * scale[pos * self.n_head_kv + head]
            }
            KvRows::F32(k) => k[off..off + hd].iter().zip(q).map(|(a, b)| a * b).sum(),
        }
    }

    /// `out += p * V[pos, head]`.
    #[inline]
    pub fn axpy_v(&self, pos: usize, head: usize, p: f32, out: &mut [f32]) {
        let hd = self.head_dim;
        let off = (pos * self.n_head_kv + head) * hd;
        match &self.v {
            KvRows::F16(v) => f16::axpy(out, p, &v[off..off + hd]),
            KvRows::Int8 { q, scale, .. } => {
                let ps = p * scale[pos * self.n_head_kv + head];
                for (o, x) in out.iter_mut().zip(&q[off..off + hd]) {
                    *o += ps * *x as f32;
                }
            }
            KvRows::F32(v) => {
                for (o, x) in out.iter_mut().zip(&v[off..off + hd]) {
                    *o += p * x;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decoders' cache (rows written in place, f16 through F16C) stores exactly the bytes
    /// of a QSA cache grown a cell at a time (`KvRows::push`, scalar f16): one format.
    #[test]
    fn kv_layer_rows_equal_pushed_rows() {
        let (nh, hd, cells) = (2, 8, 5);
        let row = |p: usize| -> Vec<f32> {
            (0..nh * hd).map(|i| ((p * 31 + i * 7) % 23) as f32 * 0.37 - 4.1 + 1e-4 * i as f32).collect()
        };
        for ty in [KvType::F16, KvType::Int8, KvType::F32] {
            let mut l = KvLayer::try_new(ty, cells, nh, hd).unwrap();
            let mut pushed = KvRows::new(ty, hd);
            for p in 0..cells {
                l.write(p, &row(p), &row(p + 100));
                pushed.push(&row(p));
            }
            assert_eq!(l.k, pushed, "{ty:?}");
        }
    }

    #[test]
    fn int8_roundtrip_is_close() {
        let mut l = KvLayer::try_new(KvType::Int8, 4, 2, 8).unwrap();
        let k: Vec<f32> = (0..16).map(|i| (i as f32 - 7.5) * 0.3).collect();
        l.write(2, &k, &k);
        let mut q = vec![0f32; 8];
        q[3] = 1.0;
        let got = l.dot_k(2, 1, &q);
        assert!((got - k[8 + 3]).abs() < 0.02, "{got} vs {}", k[11]);
        let mut out = vec![0f32; 8];
        l.axpy_v(2, 0, 2.0, &mut out);
        for (o, x) in out.iter().zip(&k[..8]) {
            assert!((o - 2.0 * x).abs() < 0.04);
        }
    }
}
