//! Random-weight `qwen4exp` GGUFs for tests and benchmarks (what `make_tiny_qwen4exp.py` does
//! for the llama.cpp fixtures, with the `gguf` crate's writer): every key and tensor the loader
//! reads, any layer mix (GDN / QSA / dense attention), optional PLE table in its own shard,
//! optional tied head, matrices in F32, F16 or Q8_0 (experts in their own type if asked), shapes
//! from [`presets`].
//!
//! Weights follow the fixture generator's scales (matrices `N(0, 1/fan_in)`, router and head
//! 4× larger, gammas `1 + N(0, 0.1)`, `ssm_a = −exp(U(−1, 1))`, `dt_bias ~ N(−1, 0.5)`), so the
//! logits stay tame over hundreds of positions; or, for cost measurements at full size, random
//! valid blocks ([`SynthConfig::random_blocks`]).
//!
//! The MTP (NextN) draft head is written to its own GGUF by [`write_mtp`] ([`SynthMtp`]:
//! random, or an "echo" head whose drafts repeat the last token) in the published Flash-Next
//! layout documented in `model::qwen4exp::mtp`.

use std::path::{Path, PathBuf};

use gguf::{GgufError, GgufWriter, Value};
use quant::GgmlType;

mod presets;

/// PLE block settings of a synthetic model.
#[derive(Clone, Debug)]
pub struct SynthPle {
    pub layer: usize,
    pub ngram: usize,
    pub heads_per_ngram: usize,
    pub conv_kernel: usize,
    /// Smallest per-head table size (distinct primes from here up).
    pub min_head_vocab: u64,
    pub table_type: GgmlType,
}

/// Shape and storage of a synthetic model.
#[derive(Clone, Debug)]
pub struct SynthConfig {
    pub n_vocab: usize,
    pub n_embd: usize,
    /// One entry per layer: `None` = GDN, `Some(0)` = dense attention, `Some(r)` = QSA ratio r.
    pub layers: Vec<Option<usize>>,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub rope_base: f32,
    pub ssm_k_heads: usize,
    pub ssm_v_heads: usize,
    pub ssm_state: usize,
    pub ssm_conv: usize,
    pub hc: usize,
    pub hc_rank: usize,
    pub idx_heads: usize,
    pub idx_dim: usize,
    pub idx_top_k: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_ff_shexp: usize,
    pub ple: Option<SynthPle>,
    /// Type of the big matrices (F32, F16 or Q8_0; Q8_0 falls back to F32 for rows that are not
    /// whole blocks). Norms, conv taps, router and shared-expert gate stay F32.
    pub matrix_type: GgmlType,
    /// Omit `output.weight` (head tied to `token_embd`).
    pub tied: bool,
    /// Count a placeholder MTP block in `block_count` (`nextn_predict_layers = 1`) with stand-in
    /// `nextn.eh_proj/enorm/hnorm` tensors, as the real checkpoints store it after the trunk.
    /// Not a usable draft head (see [`write_mtp`] for one): it only checks that the trunk
    /// loader skips it.
    pub mtp_stub: bool,
    pub eps: f32,
    /// Type of the routed experts' matrices (None: `matrix_type`).
    pub expert_type: Option<GgmlType>,
    /// Write block-quantized matrices (Q8_0, Q4_K, Q6_K, IQ3_XXS, IQ4_NL) as random valid blocks
    /// instead of quantizing normals: fast at full size (gigabytes of experts), values bounded
    /// at about the same scale but not `N(0, σ²)`. For cost measurements, not numerics.
    pub random_blocks: bool,
}

/// The engine's seeded RNG (normals by Box–Muller).
use rng::SplitMix64;

fn is_prime(n: u64) -> bool {
    n >= 2 && (2..).take_while(|d| d * d <= n).all(|d| !n.is_multiple_of(d))
}

struct Builder {
    w: GgufWriter,
    rng: SplitMix64,
    matrix_type: GgmlType,
    /// [`SynthConfig::random_blocks`].
    random_blocks: bool,
    /// Tensors added so far (the PLE table is the last one).
    n_tensors: usize,
}

impl Builder {
    /// A tensor of ggml ne `dims` from row-major `vals` stored as `ty`.
    fn put(&mut self, name: &str, dims: &[usize], vals: &[f32], ty: GgmlType) -> Result<(), GgufError> {
        let ne: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        let bytes = match ty {
            GgmlType::F32 => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
            GgmlType::F16 => vals.iter().flat_map(|&v| quant::f32_to_f16(v).to_le_bytes()).collect(),
            _ => {
                let rb = ty.row_bytes(dims[0]).ok_or_else(|| GgufError::Writer(format!("{name}: ragged rows")))?;
                let rows = vals.len() / dims[0];
                let mut out = vec![0u8; rb * rows];
                for r in 0..rows {
                    quant::quantize_row(ty, &vals[r * dims[0]..(r + 1) * dims[0]], &mut out[r * rb..(r + 1) * rb])
                        .map_err(|e| GgufError::Writer(format!("{name}: {e:?}")))?;
                }
                out
            }
        };
        self.w.add_tensor(name, &ne, ty, bytes);
        self.n_tensors += 1;
        Ok(())
    }

    /// A `[rows][cols]` matrix (ne `[cols, rows, extra...]`) with entries `N(0, scale²/cols)`.
    fn mat(&mut self, name: &str, dims: &[usize], scale: f64) -> Result<(), GgufError> {
        let ty = self.matrix_type;
        self.mat_of(name, dims, scale, ty)
    }

    /// [`Builder::mat`] stored as `ty` (random blocks with [`SynthConfig::random_blocks`]).
    /// Rows that are not whole blocks of `ty` fall back as llama.cpp's quantizer does for
    /// IQ3_XXS (to IQ4_NL), else to Q8_0, else F32.
    fn mat_of(&mut self, name: &str, dims: &[usize], scale: f64, ty: GgmlType) -> Result<(), GgufError> {
        let n: usize = dims.iter().product();
        let ty = match ty {
            t if t.row_bytes(dims[0]).is_some() => t,
            GgmlType::IQ3XXS if GgmlType::IQ4NL.row_bytes(dims[0]).is_some() => GgmlType::IQ4NL,
            _ if GgmlType::Q8_0.row_bytes(dims[0]).is_some() => GgmlType::Q8_0,
            _ => GgmlType::F32,
        };
        if self.random_blocks && ty.row_bytes(dims[0]).is_some() {
            // Spread ~ sigma: the scale over the type's typical |level x block scale|.
            let sigma = scale / (dims[0] as f64).sqrt();
            let typical = match ty {
                GgmlType::Q8_0 => 73.0,
                GgmlType::IQ3XXS => 100.0,
                GgmlType::IQ4NL => 60.0,
                GgmlType::Q4K => 200.0,
                _ => 1000.0,
            };
            let blocks = n / ty.block_size();
            if let Some(bytes) =
                super::random_blocks(ty, blocks, &mut self.rng, |_, i| (sigma / typical / (1 + i) as f64) as f32)
            {
                let ne: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
                self.w.add_tensor(name, &ne, ty, bytes);
                self.n_tensors += 1;
                return Ok(());
            }
        }
        if ty != self.matrix_type {
            let vals = self.rng.normals(n, 0.0, scale / (dims[0] as f64).sqrt());
            return self.put(name, dims, &vals, ty);
        }
        let vals = self.rng.normals(n, 0.0, scale / (dims[0] as f64).sqrt());
        self.put_mat(name, dims, &vals)
    }

    /// A matrix of given values in the matrix type (F32 for rows that are not whole blocks).
    fn put_mat(&mut self, name: &str, dims: &[usize], vals: &[f32]) -> Result<(), GgufError> {
        let ty = match self.matrix_type {
            GgmlType::F16 => GgmlType::F16,
            t if t.row_bytes(dims[0]).is_some() => t,
            _ => GgmlType::F32,
        };
        self.put(name, dims, vals, ty)
    }

    fn vec_f32(&mut self, name: &str, dims: &[usize], mean: f64, std: f64) -> Result<(), GgufError> {
        let vals = self.rng.normals(dims.iter().product(), mean, std);
        self.put(name, dims, &vals, GgmlType::F32)
    }
}

/// Builds the writer for `cfg` (the PLE table, if any, is the last tensor).
pub fn build(cfg: &SynthConfig, seed: u64) -> Result<GgufWriter, GgufError> {
    build_counted(cfg, seed).map(|(w, _)| w)
}

fn build_counted(cfg: &SynthConfig, seed: u64) -> Result<(GgufWriter, usize), GgufError> {
    let a = |k: &str| format!("qwen4exp.{k}");
    let (e, nl) = (cfg.n_embd, cfg.layers.len());
    let mut b = Builder {
        w: GgufWriter::new(),
        rng: SplitMix64(seed),
        matrix_type: cfg.matrix_type,
        random_blocks: cfg.random_blocks,
        n_tensors: 0,
    };
    let w = &mut b.w;
    w.add_metadata("general.architecture", Value::Str("qwen4exp".into()));
    w.add_metadata("general.name", Value::Str(format!("synthetic qwen4exp seed {seed}")));
    let u32v = |v: usize| Value::U32(v as u32);
    for (k, v) in [
        ("context_length", 4096),
        ("embedding_length", e),
        ("block_count", nl + cfg.mtp_stub as usize),
        ("feed_forward_length", cfg.n_ff_shexp),
        ("attention.head_count", cfg.n_head),
        ("attention.head_count_kv", cfg.n_head_kv),
        ("attention.key_length", cfg.head_dim),
        ("attention.value_length", cfg.head_dim),
        ("rope.dimension_count", cfg.n_rot),
        ("expert_count", cfg.n_expert),
        ("expert_used_count", cfg.n_expert_used),
        ("expert_feed_forward_length", cfg.n_ff_exp),
        ("expert_shared_feed_forward_length", cfg.n_ff_shexp),
        ("ssm.conv_kernel", cfg.ssm_conv),
        ("ssm.inner_size", cfg.ssm_v_heads * cfg.ssm_state),
        ("ssm.state_size", cfg.ssm_state),
        ("ssm.time_step_rank", cfg.ssm_v_heads),
        ("ssm.group_count", cfg.ssm_k_heads),
        ("hyper_connection.count", cfg.hc),
        ("hyper_connection.low_rank", cfg.hc_rank),
        ("attention.indexer.head_count", cfg.idx_heads),
        ("attention.indexer.key_length", cfg.idx_dim),
        ("attention.indexer.top_k", cfg.idx_top_k),
    ] {
        w.add_metadata(a(k), u32v(v));
    }
    if cfg.mtp_stub {
        w.add_metadata(a("nextn_predict_layers"), Value::U32(1));
    }
    w.add_metadata(a("attention.layer_norm_rms_epsilon"), Value::F32(cfg.eps));
    w.add_metadata(a("rope.freq_base"), Value::F32(cfg.rope_base));
    // IMROPE sections summing to n_rot/2 (text only: the split does not change the result).
    let q = (cfg.n_rot / 2) as u32;
    let secs = [q - 2 * (q / 3), q / 3, q / 3, 0];
    w.add_metadata(a("rope.dimension_sections"), Value::Array(secs.iter().map(|&s| Value::U32(s)).collect()));
    // The MTP block is an attention block (entries exist for every block_count layer).
    let mtp_kind = cfg.mtp_stub.then_some(Value::Bool(false));
    let mtp_ratio = cfg.mtp_stub.then_some(Value::U32(0));
    w.add_metadata(
        a("attention.recurrent_layers"),
        Value::Array(cfg.layers.iter().map(|l| Value::Bool(l.is_none())).chain(mtp_kind).collect()),
    );
    w.add_metadata(
        a("attention.compress_ratios"),
        Value::Array(cfg.layers.iter().map(|l| Value::U32(l.unwrap_or(0) as u32)).chain(mtp_ratio).collect()),
    );
    let mut ple_rows = 0usize;
    if let Some(p) = &cfg.ple {
        let nph = (p.ngram - 1) * p.heads_per_ngram;
        let dp = e / nph;
        let mut sizes = Vec::new();
        let mut n = p.min_head_vocab;
        while sizes.len() < nph {
            if is_prime(n) {
                sizes.push(n);
            }
            n += 1;
        }
        let offsets: Vec<u64> = sizes.iter().scan(0, |acc, &s| Some(std::mem::replace(acc, *acc + s))).collect();
        ple_rows = sizes.iter().sum::<u64>() as usize;
        let mults: Vec<u64> = (0..p.ngram).map(|_| ((b.rng.next_u64() >> 19) | (1 << 40)) | 1).collect();
        let arr = |v: &[u64]| Value::Array(v.iter().map(|&x| Value::U64(x)).collect());
        let w = &mut b.w;
        w.add_metadata(a("ple.layers"), Value::Array(vec![Value::U32(p.layer as u32)]));
        w.add_metadata(a("ple.ngram_size"), u32v(p.ngram));
        w.add_metadata(a("ple.heads_per_ngram"), u32v(p.heads_per_ngram));
        w.add_metadata(a("ple.conv_kernel"), u32v(p.conv_kernel));
        w.add_metadata(a("ple.eos_token_id"), Value::U32(2));
        w.add_metadata(a("embedding_length_per_layer_input"), u32v(dp));
        w.add_metadata(a("ple.layer_multipliers"), arr(&mults));
        w.add_metadata(a("ple.head_offsets"), arr(&offsets));
        w.add_metadata(a("ple.head_vocab_sizes"), arr(&sizes));
    }
    // A byte-level vocabulary: 3 specials, then byte tokens and filler names.
    let w = &mut b.w;
    let tokens: Vec<Value> = (0..cfg.n_vocab)
        .map(|i| {
            Value::Str(match i {
                0 => "<unk>".into(),
                1 => "<s>".into(),
                2 => "</s>".into(),
                i if i < 3 + 256 => format!("<0x{:02X}>", i - 3),
                i => format!("<tok{i}>"),
            })
        })
        .collect();
    w.add_metadata("tokenizer.ggml.model", Value::Str("gpt2".into()));
    w.add_metadata("tokenizer.ggml.tokens", Value::Array(tokens));
    w.add_metadata("tokenizer.ggml.merges", Value::Array(vec![]));
    w.add_metadata("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.add_metadata("tokenizer.ggml.eos_token_id", Value::U32(2));

    let (hc, hce, v) = (cfg.hc, cfg.hc * e, cfg.n_vocab);
    b.mat("token_embd.weight", &[e, v], (e as f64).sqrt())?; // N(0, 1)
    if !cfg.tied {
        b.mat("output.weight", &[e, v], 4.0)?;
    }
    hc_tensors(&mut b, cfg, "output_hc_", false)?;
    for (il, kind) in cfg.layers.iter().enumerate() {
        let p = |s: &str| format!("blk.{il}.{s}");
        hc_tensors(&mut b, cfg, &p("hc_attn_"), true)?;
        hc_tensors(&mut b, cfg, &p("hc_ffn_"), true)?;
        match kind {
            None => {
                let (hk, hv, s, k) = (cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_state, cfg.ssm_conv);
                let c = (2 * hk + hv) * s;
                b.mat(&p("attn_qkv.weight"), &[e, c], 1.0)?;
                b.mat(&p("attn_gate.weight"), &[e, hv * s], 1.0)?;
                b.vec_f32(&p("ssm_conv1d.weight"), &[k, c], 0.0, 1.0 / (k as f64).sqrt())?;
                b.vec_f32(&p("ssm_dt.bias"), &[hv], -1.0, 0.5)?;
                let av: Vec<f32> = (0..hv).map(|_| -((b.rng.unit() * 2.0 - 1.0).exp() as f32)).collect();
                b.put(&p("ssm_a"), &[hv], &av, GgmlType::F32)?;
                b.mat(&p("ssm_beta.weight"), &[e, hv], 1.0)?;
                b.mat(&p("ssm_alpha.weight"), &[e, hv], 1.0)?;
                b.vec_f32(&p("ssm_norm.weight"), &[s], 1.0, 0.1)?;
                b.mat(&p("ssm_out.weight"), &[hv * s, e], 1.0)?;
            }
            Some(ratio) => attn_tensors(&mut b, cfg, il, *ratio, 1.0)?,
        }
        if let Some(pp) = cfg.ple.as_ref().filter(|pp| pp.layer == il) {
            b.mat(&p("ple_key.weight"), &[e, hce], 1.0)?;
            b.mat(&p("ple_value.weight"), &[e, e], 1.0)?;
            for n in ["ple_norm_key", "ple_norm_query", "ple_norm_conv"] {
                b.vec_f32(&p(&format!("{n}.weight")), &[e, hc], 1.0, 0.1)?;
            }
            let k = pp.conv_kernel;
            b.vec_f32(&p("ple_conv1d.weight"), &[k, hce], 0.0, 1.0 / (k as f64).sqrt())?;
        }
        moe_tensors(&mut b, cfg, il, 1.0)?;
    }
    if cfg.mtp_stub {
        // Own random stream, so the trunk's weights do not depend on the stub.
        let trunk_rng = std::mem::replace(&mut b.rng, SplitMix64(seed ^ 0x006d_7470_7374_7562));
        let p = |s: &str| format!("blk.{nl}.nextn.{s}");
        b.mat(&p("eh_proj.weight"), &[2 * e, e], 1.0)?;
        b.vec_f32(&p("enorm.weight"), &[e], 1.0, 0.1)?;
        b.vec_f32(&p("hnorm.weight"), &[hce], 1.0, 0.1)?;
        b.rng = trunk_rng;
    }
    if let Some(p) = &cfg.ple {
        let dp = e / ((p.ngram - 1) * p.heads_per_ngram);
        let vals = b.rng.normals(ple_rows * dp, 0.0, 1.0);
        b.put("per_layer_token_embd.weight", &[dp, ple_rows], &vals, p.table_type)?;
    }
    Ok((b.w, b.n_tensors))
}

/// A hyper-connection mixer `{prefix}{norm,down,up[,inject]}.weight` in the trunk's shapes.
fn hc_tensors(b: &mut Builder, cfg: &SynthConfig, prefix: &str, inject: bool) -> Result<(), GgufError> {
    let (e, hc, lr) = (cfg.n_embd, cfg.hc, cfg.hc_rank);
    let hce = hc * e;
    b.vec_f32(&format!("{prefix}norm.weight"), &[e, hc], 1.0, 0.1)?;
    b.mat(&format!("{prefix}down.weight"), &[hce, lr], 1.0)?;
    b.mat(&format!("{prefix}up.weight"), &[lr, hce], 1.0)?;
    if inject {
        b.mat(&format!("{prefix}inject.weight"), &[hce, hc], 1.0)?;
    }
    Ok(())
}

/// `blk.{il}.attn_*` (and `indexer.*` when `ratio > 0`); `out_scale` scales `attn_output`.
fn attn_tensors(b: &mut Builder, cfg: &SynthConfig, il: usize, ratio: usize, out_scale: f64) -> Result<(), GgufError> {
    let p = |s: &str| format!("blk.{il}.{s}");
    let (e, h, kv, d) = (cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim);
    b.mat(&p("attn_q.weight"), &[e, 2 * h * d], 1.0)?;
    b.mat(&p("attn_k.weight"), &[e, kv * d], 1.0)?;
    b.mat(&p("attn_v.weight"), &[e, kv * d], 1.0)?;
    b.mat(&p("attn_output.weight"), &[h * d, e], out_scale)?;
    b.vec_f32(&p("attn_q_norm.weight"), &[d], 1.0, 0.1)?;
    b.vec_f32(&p("attn_k_norm.weight"), &[d], 1.0, 0.1)?;
    if ratio > 0 {
        b.mat(&p("indexer.q_proj.weight"), &[e, cfg.idx_heads * cfg.idx_dim], 1.0)?;
        b.mat(&p("indexer.k_proj.weight"), &[e, cfg.idx_dim], 1.0)?;
        b.vec_f32(&p("indexer.q_norm.weight"), &[cfg.idx_dim], 1.0, 0.1)?;
        b.vec_f32(&p("indexer.k_norm.weight"), &[cfg.idx_dim], 1.0, 0.1)?;
    }
    Ok(())
}

/// `blk.{il}.ffn_*` (router, experts, shared expert); `down_scale` scales the down matrices.
fn moe_tensors(b: &mut Builder, cfg: &SynthConfig, il: usize, down_scale: f64) -> Result<(), GgufError> {
    let p = |s: &str| format!("blk.{il}.{s}");
    let (e, ne, ff, ffs) = (cfg.n_embd, cfg.n_expert, cfg.n_ff_exp, cfg.n_ff_shexp);
    let router = b.rng.normals(ne * e, 0.0, 4.0 / (e as f64).sqrt());
    b.put(&p("ffn_gate_inp.weight"), &[e, ne], &router, GgmlType::F32)?;
    let xt = cfg.expert_type.unwrap_or(cfg.matrix_type);
    b.mat_of(&p("ffn_gate_exps.weight"), &[e, ff, ne], 1.0, xt)?;
    b.mat_of(&p("ffn_up_exps.weight"), &[e, ff, ne], 1.0, xt)?;
    b.mat_of(&p("ffn_down_exps.weight"), &[ff, e, ne], down_scale, xt)?;
    b.vec_f32(&p("ffn_gate_inp_shexp.weight"), &[e], 0.0, 1.0 / (e as f64).sqrt())?;
    b.mat(&p("ffn_gate_shexp.weight"), &[e, ffs], 1.0)?;
    b.mat(&p("ffn_up_shexp.weight"), &[e, ffs], 1.0)?;
    b.mat(&p("ffn_down_shexp.weight"), &[ffs, e], down_scale)?;
    Ok(())
}

/// The random-weight MTP (NextN) head of a synthetic model, in its own GGUF, in the layout
/// of the published Flash-Next heads (wide-residual input, GR around attention and MoE, own
/// `hc_head` mixer; see `model::qwen4exp::mtp`).
#[derive(Clone, Debug)]
pub struct SynthMtp {
    /// Type of the big matrices (F32, F16 or Q8_0, as [`SynthConfig::matrix_type`]).
    pub matrix_type: GgmlType,
    /// Compress ratio recorded for the NextN block; > 0 also writes `indexer.*` tensors, as
    /// the published files carry them (the head attends densely either way).
    pub ratio: usize,
    /// Write `nextn.embed_tokens` and `nextn.shared_head_head` (else the model's embedding and
    /// output matrix are used).
    pub own_tables: bool,
    /// Write the head's own output mixer `nextn.hc_head_{norm,down,up}` (else the model's
    /// `output_hc_*` is used, as for files without them).
    pub hc_head: bool,
    /// An "echo" head that predicts its input token again: `eh_proj` passes the normed
    /// embedding through to every stream (identity on the first E columns, zeros on the
    /// stream half), attention and expert outputs are scaled by 0.1 (they still run and still
    /// depend on the cache), and the `hc_head` mixer has a zero `down` matrix (every stream
    /// gate σ(0) = ½) and norm gamma 16/E, so the head multiplies about (8/E)·rms(emb) by
    /// the output table: a moderate draft probability, about 0.7 at E = 256 and V = 1024.
    /// Synthetic models with a tied head settle into repeating a token, which this head then
    /// predicts: accepted drafts for tests and benchmarks. With `own_tables` the head's table
    /// is its own embedding, so echo works for an untied model too; without, it relies on a
    /// tied model. Needs `hc_head`.
    pub echo: bool,
}

impl Default for SynthMtp {
    fn default() -> SynthMtp {
        SynthMtp { matrix_type: GgmlType::F32, ratio: 0, own_tables: false, hc_head: true, echo: false }
    }
}

/// Builds the MTP GGUF for the model `cfg` (its trunk has `cfg.layers.len()` layers; the
/// NextN block is `blk.{that}`): the metadata the MTP loader checks, and the block's tensors.
pub fn build_mtp(cfg: &SynthConfig, m: &SynthMtp, seed: u64) -> Result<GgufWriter, GgufError> {
    let a = |k: &str| format!("qwen4exp.{k}");
    let (e, nl, v) = (cfg.n_embd, cfg.layers.len(), cfg.n_vocab);
    if m.echo && !m.hc_head {
        return Err(GgufError::Writer("an echo MTP head needs its own hc_head mixer".into()));
    }
    let mut b = Builder {
        w: GgufWriter::new(),
        rng: SplitMix64(seed ^ 0x6d74_705f_6865_6164),
        matrix_type: m.matrix_type,
        random_blocks: false,
        n_tensors: 0,
    };
    let w = &mut b.w;
    w.add_metadata("general.architecture", Value::Str("qwen4exp".into()));
    w.add_metadata(
        "general.name",
        Value::Str(format!("synthetic qwen4exp MTP head seed {seed}{}", if m.echo { " (echo)" } else { "" })),
    );
    for (k, val) in [
        ("block_count", nl + 1),
        ("nextn_predict_layers", 1),
        ("embedding_length", e),
        ("attention.head_count", cfg.n_head),
        ("attention.head_count_kv", cfg.n_head_kv),
        ("attention.key_length", cfg.head_dim),
        ("attention.value_length", cfg.head_dim),
        ("rope.dimension_count", cfg.n_rot),
        ("expert_count", cfg.n_expert),
        ("expert_used_count", cfg.n_expert_used),
        ("expert_feed_forward_length", cfg.n_ff_exp),
        ("expert_shared_feed_forward_length", cfg.n_ff_shexp),
        ("attention.indexer.head_count", cfg.idx_heads),
        ("attention.indexer.key_length", cfg.idx_dim),
        ("attention.indexer.top_k", cfg.idx_top_k),
    ] {
        w.add_metadata(a(k), Value::U32(val as u32));
    }
    w.add_metadata(a("attention.layer_norm_rms_epsilon"), Value::F32(cfg.eps));
    w.add_metadata(a("rope.freq_base"), Value::F32(cfg.rope_base));
    w.add_metadata(
        a("attention.recurrent_layers"),
        Value::Array(cfg.layers.iter().map(|l| Value::Bool(l.is_none())).chain([Value::Bool(false)]).collect()),
    );
    w.add_metadata(
        a("attention.compress_ratios"),
        Value::Array(
            cfg.layers.iter().map(|l| Value::U32(l.unwrap_or(0) as u32)).chain([Value::U32(m.ratio as u32)]).collect(),
        ),
    );

    let nx = |s: &str| format!("blk.{nl}.nextn.{s}");
    let blk = |s: &str| format!("blk.{nl}.{s}");
    let hce = cfg.hc * e;
    if m.echo {
        let mut eh = vec![0f32; e * 2 * e];
        for r in 0..e {
            eh[r * 2 * e + r] = 1.0;
        }
        b.put_mat(&nx("eh_proj.weight"), &[2 * e, e], &eh)?;
        b.put(&nx("enorm.weight"), &[e], &vec![1.0; e], GgmlType::F32)?;
        b.put(&nx("hnorm.weight"), &[hce], &vec![1.0; hce], GgmlType::F32)?;
    } else {
        b.mat(&nx("eh_proj.weight"), &[2 * e, e], 1.0)?;
        b.vec_f32(&nx("enorm.weight"), &[e], 1.0, 0.1)?;
        b.vec_f32(&nx("hnorm.weight"), &[hce], 1.0, 0.1)?;
    }
    let inner = if m.echo { 0.1 } else { 1.0 };
    hc_tensors(&mut b, cfg, &blk("hc_attn_"), true)?;
    attn_tensors(&mut b, cfg, nl, m.ratio, inner)?;
    hc_tensors(&mut b, cfg, &blk("hc_ffn_"), true)?;
    moe_tensors(&mut b, cfg, nl, inner)?;
    if m.hc_head {
        let (norm, down, up) = (nx("hc_head_norm.weight"), nx("hc_head_down.weight"), nx("hc_head_up.weight"));
        let lr = cfg.hc_rank;
        if m.echo {
            let g = 16.0 / e as f32;
            b.put(&norm, &[hce], &vec![g; hce], GgmlType::F32)?;
            b.put_mat(&down, &[hce, lr], &vec![0.0; hce * lr])?;
        } else {
            b.vec_f32(&norm, &[hce], 1.0, 0.1)?;
            b.mat(&down, &[hce, lr], 1.0)?;
        }
        b.mat(&up, &[lr, hce], 1.0)?;
    }
    if m.own_tables {
        // One table for both ends (what makes the echo head repeat its input).
        let table = b.rng.normals(v * e, 0.0, 1.0);
        b.put_mat(&nx("embed_tokens.weight"), &[e, v], &table)?;
        b.put_mat(&nx("shared_head_head.weight"), &[e, v], &table)?;
    }
    Ok(b.w)
}

/// Writes [`build_mtp`] to `path`.
pub fn write_mtp(cfg: &SynthConfig, m: &SynthMtp, seed: u64, path: &Path) -> Result<(), GgufError> {
    build_mtp(cfg, m, seed)?.write(path)
}

/// Writes `cfg` to `<prefix>.gguf`, or with `split_ple` (and a PLE table) to
/// `<prefix>-00001-of-00002.gguf` + `<prefix>-00002-of-00002.gguf` with the table alone in the
/// second shard, as the real release ships it. Returns the paths.
pub fn write(cfg: &SynthConfig, seed: u64, prefix: &Path, split_ple: bool) -> Result<Vec<PathBuf>, GgufError> {
    let (w, n) = build_counted(cfg, seed)?;
    let p = prefix.to_string_lossy().into_owned();
    if split_ple && cfg.ple.is_some() {
        w.write_split_at(&p, &[0, n - 1, n])
    } else {
        let path = PathBuf::from(format!("{p}.gguf"));
        w.write(&path)?;
        Ok(vec![path])
    }
}
