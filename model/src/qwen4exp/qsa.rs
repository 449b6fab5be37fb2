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
//!   (`cpu::qwen4exp::heap_select`): all cells of a block tie, so the heap order decides which part of the
//!   boundary block survives, and a token whose block is complete can lose itself.
//! - Softmax over the kept cells of `q·k/√D`, GQA (`kv head = h / (H/KV)`), then
//!   `o_h ⊙ σ(gate_h)` and `W_o`.
//!
//! With an F16 cache (llama.cpp's default) K, V and κ are stored as f16, q is rounded
//! to f16 for `q·k` and the probabilities are rounded to f16 before the product with V (ggml's
//! non-flash attention path); the indexer scores stay f32. With the engine's int8 cache
//! (`--kv int8`, not a llama.cpp format) K, V and κ rows are int8 with a scale each and read
//! back as `q · scale`; q and the probabilities stay f32, as with an f32 cache.

use crate::Mat;
use crate::{KvRows, KvType};

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

/// Per-sequence cache of one attention layer: one cell per position.
#[derive(Clone, Debug, PartialEq)]
pub struct QsaCache {
    /// `[cells][KV·D]` after norm and rope.
    pub k: KvRows,
    pub v: KvRows,
    /// Raw indexer keys `[cells][Di]` (same type as K, like llama.cpp's third cache).
    pub kappa: KvRows,
    /// Block keys of the complete blocks `[blocks][Di]`, f32 (a pure function of `kappa`).
    pub blocks: Vec<f32>,
}

impl QsaCache {
    /// An f16 (llama.cpp's default) or f32 cache; [`Qsa::new_cache`] for any `--kv` type.
    pub fn new(f16: bool) -> QsaCache {
        let kv = if f16 { KvType::F16 } else { KvType::F32 };
        QsaCache::with_type(kv, 1, 1)
    }

    /// A cache of type `kv`; int8 rows are one KV head (`head_dim` values) of K and V and one
    /// indexer key (`index_dim`) of κ.
    pub fn with_type(kv: KvType, head_dim: usize, index_dim: usize) -> QsaCache {
        QsaCache {
            k: KvRows::new(kv, head_dim),
            v: KvRows::new(kv, head_dim),
            kappa: KvRows::new(kv, index_dim),
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
        matches!(self.k, KvRows::F16(_))
    }
}

/// Added to the tail cells' values (in f32) so that they always win the top-k.
pub const TAIL_BIAS: f32 = 1e9;

impl Qsa {
    /// An empty cache of this layer of type `kv`.
    pub fn new_cache(&self, kv: KvType) -> QsaCache {
        QsaCache::with_type(kv, self.head_dim, self.indexer.as_ref().map_or(1, |ix| ix.dim))
    }

    /// Cells in the cache.
    pub fn cells(&self, cache: &QsaCache) -> usize {
        cache.k.len() / (self.n_head_kv * self.head_dim)
    }
}
