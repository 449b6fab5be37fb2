//! Launchers of the QSA kernels (gpu-kernels/src/ops/qsa.rs): Flash-Next's attention layers
//! between their projections, equal to `cpu::qwen4exp::qsa`'s `Qsa::mix` (the norms, rope,
//! block keys, indexer scores and kept cells bit for bit; the attention output within
//! `QSA_TOL`, `quant::fmath`'s exp and sigmoid; tests/gpu/gpu_ops_qsa.rs).
//!
//! One window of `n` tokens at positions `pos[0] ..` (consecutive) of one sequence whose cache
//! (f16, or the engine's int8 rows) holds exactly the cells before it: q/k norm + rope, K/V (and the indexer's raw keys κ)
//! stored at their cells, the blocks the window completes pooled into block keys, the indexer's
//! queries normed and roped, each token's block scores and kept cells, then the gated attention.
use super::{GpuOps, KvFormat, bad, groups};
use crate::abi;
use crate::device::{DevicePtr, Result, Stream};

/// The block indexer of a QSA layer (`attention.indexer.*`, `attention.compress_ratios`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QsaIndexerShape {
    pub heads: u32,
    pub dim: u32,
    pub top_k: u32,
    /// Cells per block r.
    pub ratio: u32,
}

impl QsaIndexerShape {
    /// Cells kept per token once more are visible: `top_k + r − 1` (the tail block's cells
    /// ride on top of the top-k).
    pub fn budget(&self) -> u32 {
        self.top_k + self.ratio - 1
    }
}

/// Dimensions of one QSA (or, without indexer, dense) attention layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QsaShape {
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    /// Roped dims (NEOX pairs `(i, i + n_rot/2)`), the rest pass through.
    pub n_rot: u32,
    pub eps: f32,
    pub indexer: Option<QsaIndexerShape>,
    /// The cache's format (f16, or int8 rows with a scale each: the CPU's `KvRows`).
    pub kv: KvFormat,
}

impl QsaShape {
    /// Cells the attention of one token may read with `visible` cells in the cache.
    fn cells(&self, visible: u32) -> u32 {
        match self.indexer {
            Some(ix) => ix.budget().min(visible),
            None => visible,
        }
    }

    fn check(&self, n_tokens: u32, start: u32, capacity: u32) -> Result<()> {
        let name = "qsa";
        let (h, kv, d) = (self.n_head, self.n_head_kv, self.head_dim);
        if h == 0 || kv == 0 || d == 0 || h % kv != 0 {
            return Err(bad(name, format!("{self:?}: heads must be a positive multiple of kv heads")));
        }
        // One lane row of kv_store and the attention kernel: at most 8 values a lane.
        if d > 256 || self.n_rot == 0 || !self.n_rot.is_multiple_of(2) || self.n_rot > d {
            return Err(bad(name, format!("{self:?}: head dim must be <= 256, n_rot even and in 2..=head dim")));
        }
        if let Some(ix) = self.indexer
            && (ix.heads == 0 || ix.dim == 0 || ix.dim > 256 || ix.top_k == 0 || ix.ratio == 0 || self.n_rot > ix.dim)
        {
            return Err(bad(
                name,
                format!("{ix:?}: indexer dims must be in 1..=256 (>= n_rot {}), top_k and ratio >= 1", self.n_rot),
            ));
        }
        if n_tokens == 0 || start as u64 + n_tokens as u64 > capacity as u64 {
            return Err(bad(
                name,
                format!("window of {n_tokens} tokens at {start}: empty or beyond the cache's {capacity} cells"),
            ));
        }
        let cells = self.cells(start + n_tokens);
        if cells > abi::QSA_MAX_CELLS {
            return Err(bad(
                name,
                format!(
                    "{cells} cells a token: the attention kernel holds at most {} (64 KiB of LDS)",
                    abi::QSA_MAX_CELLS
                ),
            ));
        }
        let rows = n_tokens as u64 * h.max(kv) as u64 * 2 * d as u64;
        if rows > u32::MAX as u64 || capacity as u64 * kv as u64 * d as u64 > u32::MAX as u64 {
            return Err(bad(name, format!("{self:?}: {capacity} cells exceed 32-bit indexing")));
        }
        Ok(())
    }
}

/// Device buffers of one [`GpuOps::qsa_mix`] window (f32 row-major unless stated).
#[derive(Clone, Copy, Debug)]
pub struct QsaBuffers {
    /// The projections of the window: q `[n][H][q_h | gate_h]` (`2 D` a head), k `[n][KV][D]`,
    /// v `[n][KV][D]`, and with an indexer its raw keys κ `[n][Di]` and queries `[n][Hi][Di]`.
    pub qf: DevicePtr,
    pub kp: DevicePtr,
    pub vp: DevicePtr,
    pub kappa_p: DevicePtr,
    pub iq_p: DevicePtr,
    /// Norm weights: q, k `[D]`; the indexer's q, k `[Di]`.
    pub q_norm: DevicePtr,
    pub k_norm: DevicePtr,
    pub iq_norm: DevicePtr,
    pub ik_norm: DevicePtr,
    /// `[n_pos][n_rot/2]` (cos, sin): [`GpuOps::rope_table_ggml`]`(base, 1.0, n_rot, n_pos)`,
    /// the CPU's angles, for every position below the capacity.
    pub rope_table: DevicePtr,
    /// `[n]` u32 positions of the window, consecutive.
    pub pos: DevicePtr,
    /// The sequence's cache of `capacity` cells: K and V `[cell][KV][D]`, κ `[cell][Di]` (f16,
    /// or i8 with the f32 row scales K and V `[cell][KV]`, κ `[cell]`; 0 for f16), block keys
    /// `[capacity / r][Di]` f32.
    pub k_cache: DevicePtr,
    pub v_cache: DevicePtr,
    pub kappa_cache: DevicePtr,
    pub k_scale: DevicePtr,
    pub v_scale: DevicePtr,
    pub kappa_scale: DevicePtr,
    pub blocks: DevicePtr,
    /// Scratch: q `[n][H][D]`, k `[n][KV][D]`, indexer queries `[n][Hi][Di]`, block scores
    /// `[n][capacity / r]`, kept cells `[n][budget]` u32 and their counts `[n]` u32 (read back
    /// for diagnostics).
    pub q: DevicePtr,
    pub k: DevicePtr,
    pub iq: DevicePtr,
    pub score: DevicePtr,
    pub sel: DevicePtr,
    pub sel_n: DevicePtr,
    /// The gated attention `[n][H][D]`, the input of the output projection.
    pub out: DevicePtr,
}

impl GpuOps {
    /// QSA (or dense, without indexer) attention of `n_tokens` at positions `start ..` of one
    /// sequence whose cache (`capacity` cells) holds the `start` cells before them; see the
    /// module doc for the steps (six to nine launches on `s`). `start` only sizes the launch and
    /// is checked; every kernel reads the positions from `b.pos`.
    pub fn qsa_mix(
        &self,
        s: &Stream,
        shape: &QsaShape,
        b: &QsaBuffers,
        n_tokens: u32,
        start: u32,
        capacity: u32,
    ) -> Result<()> {
        shape.check(n_tokens, start, capacity)?;
        let (nh, kv, d) = (shape.n_head, shape.n_head_kv, shape.head_dim);
        self.qsa_norm_rope(s, b.qf, b.q_norm, b.q, b, n_tokens, nh, d, 2 * d, shape)?;
        self.qsa_norm_rope(s, b.kp, b.k_norm, b.k, b, n_tokens, kv, d, d, shape)?;
        let (fmt, i8) = (shape.kv, shape.kv == KvFormat::Int8);
        self.kv_store(s, fmt, b.k, b.k_cache, b.k_scale, b.pos, n_tokens, kv, d)?;
        self.kv_store(s, fmt, b.vp, b.v_cache, b.v_scale, b.pos, n_tokens, kv, d)?;
        if let Some(ix) = shape.indexer {
            let max_blocks = capacity / ix.ratio;
            self.kv_store(s, fmt, b.kappa_p, b.kappa_cache, b.kappa_scale, b.pos, n_tokens, 1, ix.dim)?;
            let name = if i8 { abi::QSA_BLOCK_KEYS_I8 } else { abi::QSA_BLOCK_KEYS };
            let a = abi::QsaBlockKeysArgs {
                kappa: b.kappa_cache,
                kappa_scale: b.kappa_scale,
                w: b.ik_norm,
                blocks: b.blocks,
                pos: b.pos,
                table: b.rope_table,
                n_tokens,
                dim: ix.dim,
                ratio: ix.ratio,
                n_rot: shape.n_rot,
                eps_bits: shape.eps.to_bits(),
                _pad: 0,
            };
            // A window completes at most n / r + 1 blocks.
            self.launch(s, name, groups((n_tokens / ix.ratio + 1) as u64, abi::WAVES_PER_WG, name)?, 0, &a.to_bytes())?;
            self.qsa_norm_rope(s, b.iq_p, b.iq_norm, b.iq, b, n_tokens, ix.heads, ix.dim, ix.dim, shape)?;
            if max_blocks > 0 {
                let name = abi::QSA_INDEX_SCORES;
                let a = abi::QsaIndexScoresArgs {
                    iq: b.iq,
                    blocks: b.blocks,
                    score: b.score,
                    pos: b.pos,
                    n_tokens,
                    heads: ix.heads,
                    dim: ix.dim,
                    ratio: ix.ratio,
                    max_blocks,
                    _pad: 0,
                };
                self.launch(
                    s,
                    name,
                    groups(n_tokens as u64 * max_blocks as u64, abi::WG_SIZE, name)?,
                    0,
                    &a.to_bytes(),
                )?;
            }
            let name = abi::QSA_SELECT_TOPK;
            let a = abi::QsaSelectArgs {
                score: b.score,
                sel: b.sel,
                sel_n: b.sel_n,
                pos: b.pos,
                n_tokens,
                max_blocks,
                ratio: ix.ratio,
                k: ix.budget(),
                tail_bias_bits: model::qwen4exp::qsa::TAIL_BIAS.to_bits(),
                _pad: 0,
            };
            self.launch(s, name, groups(n_tokens as u64, abi::WAVES_PER_WG, name)?, 0, &a.to_bytes())?;
        }
        let name = if i8 { abi::QSA_ATTEND_I8 } else { abi::QSA_ATTEND };
        let a = abi::QsaAttendArgs {
            q: b.q,
            qf: b.qf,
            k_cache: b.k_cache,
            k_scale: b.k_scale,
            v_cache: b.v_cache,
            v_scale: b.v_scale,
            sel: b.sel,
            sel_n: b.sel_n,
            out: b.out,
            pos: b.pos,
            n_tokens,
            n_head: nh,
            n_head_kv: kv,
            head_dim: d,
            sel_stride: shape.indexer.map_or(0, |ix| ix.budget()),
            use_sel: shape.indexer.is_some() as u32,
            scale_bits: (1.0 / (d as f32).sqrt()).to_bits(),
            _pad: 0,
        };
        let lds = abi::qsa_attend_lds_bytes(d, shape.cells(start + n_tokens));
        self.launch(s, name, groups(n_tokens as u64 * nh as u64, 1, name)?, lds, &a.to_bytes())
    }

    /// `dst[t][h] = rope(rms(src[t][h]; w), pos[t])` for `heads` rows of `dim` a token, the
    /// source rows `head_stride` apart (`heads * head_stride` a token).
    #[allow(clippy::too_many_arguments)]
    fn qsa_norm_rope(
        &self,
        s: &Stream,
        src: DevicePtr,
        w: DevicePtr,
        dst: DevicePtr,
        b: &QsaBuffers,
        n_tokens: u32,
        heads: u32,
        dim: u32,
        head_stride: u32,
        shape: &QsaShape,
    ) -> Result<()> {
        let name = abi::QSA_NORM_ROPE;
        let a = abi::QsaNormRopeArgs {
            src,
            w,
            dst,
            pos: b.pos,
            table: b.rope_table,
            n_tokens,
            n_heads: heads,
            head_dim: dim,
            n_rot: shape.n_rot,
            src_head_stride: head_stride,
            src_tok_stride: heads * head_stride,
            eps_bits: shape.eps.to_bits(),
            _pad: 0,
        };
        self.launch(s, name, groups(n_tokens as u64 * heads as u64, abi::WAVES_PER_WG, name)?, 0, &a.to_bytes())
    }
}
