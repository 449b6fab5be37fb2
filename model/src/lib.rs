//! The model architectures, described once and run by every backend: `general.architecture`
//! → [`Arch`] → hyperparameters (one file per architecture: named GGUF keys, commented
//! defaults) → weights (references into the memory-mapped GGUF) → the layer program.
//!
//! The shared decoders (gemma3, llama, qwen2, qwen3, qwen3moe) are pre-norm decoders that
//! differ in a handful of switches (rope flavour, biases, Q/K norms, post norms, activation,
//! MoE FFN); those live in [`HParams`], and [`decoder`] holds their one program and weight
//! list. The engine's CPU executor (`strata::cpu`) and GPU executor (`strata::gpu`) run it; this
//! crate knows no backend. Layers are a [`LayerKind`] enum so hybrid
//! models can add recurrent layers with their own cache kind.
//!
//! Two things every layer above needs live here too, because the descriptions need them:
//! the engine's one error type ([`error::EngineError`], re-exported as `strata::error`) and
//! the KV cache's storage type ([`KvType`], the `--kv` setting).

pub mod arch;
pub mod decoder;
pub mod error;
pub mod gemma3;
pub mod hparams;
mod kv_type;
pub mod llama;
pub mod loaded;
pub mod mat;
pub mod op_profile;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3moe;
/// Qwen3.8-Flash-Next (`qwen4exp`): a hybrid GDN/sparse-attention model with its own program
/// (`qwen4exp::program`), weights and sequence state, loaded beside [`Model`].
pub mod qwen4exp;
pub mod ram;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gguf::{GgufFile, TensorInfo};
use quant::GgmlType;

use crate::error::{EngineError, Result};
pub use arch::Arch;
pub use decoder::{AttnWeights, DecoderWeights, Ffn, FfnWeights, LayerWeights, Logits, argmax};
pub use hparams::{Act, AttnSpec, HParams, LayerKind, MIN_WEIGHT_SUM, MoeSpec, RopeKind, SharedExpertSpec};
pub use kv_type::{KvRows, KvType, quantize_row_i8};
pub use mat::{Mat, MatError};

/// A loaded model: hyperparameters plus weights referencing the mapped file.
pub struct Decoder {
    pub hp: HParams,
    pub path: PathBuf,
    pub gguf: Arc<GgufFile>,
    /// Every weight, as described by [`decoder::DecoderWeights`]: windows into `gguf`.
    pub w: DecoderWeights<Mat, Vec<f32>>,
    pub n_vocab: usize,
}

impl Decoder {
    /// Opens a GGUF file and resolves every tensor the architecture needs.
    pub fn load(path: &Path) -> Result<Decoder> {
        let gguf = GgufFile::open(path).map_err(|source| EngineError::Gguf { path: path.to_path_buf(), source })?;
        Self::from_gguf(gguf, path)
    }

    pub fn from_gguf(gguf: GgufFile, path: &Path) -> Result<Decoder> {
        let arch = Arch::of(&gguf, path)?;
        let keys = hparams::Keys { g: &gguf, arch };
        let hp = match arch {
            Arch::Gemma3 => gemma3::hparams(&keys)?,
            Arch::Llama => llama::hparams(&keys)?,
            Arch::Qwen2 => qwen2::hparams(&keys)?,
            Arch::Qwen3 => qwen3::hparams(&keys)?,
            Arch::Qwen3Moe => qwen3moe::hparams(&keys)?,
            Arch::Qwen4Exp => {
                return Err(EngineError::Unsupported(format!(
                    "{}: qwen4exp models load through model::qwen4exp",
                    path.display()
                )));
            }
        };
        let gguf = Arc::new(gguf);
        let l = Loader { g: &gguf };
        let (d, hd) = (hp.n_embd, hp.head_dim);
        let tok_embd = l.mat("token_embd.weight", d, None)?;
        let n_vocab = tok_embd.rows;
        let output = match gguf.tensor("output.weight") {
            Some(_) => l.mat("output.weight", d, Some(n_vocab))?,
            None => tok_embd.clone(), // tied head
        };
        let output_norm = l.vec("output_norm.weight", d)?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let p = |s: &str| format!("blk.{il}.{s}");
            let (nq, nkv) = (hp.n_head * hd, hp.n_head_kv * hd);
            let opt_vec = |name: &str, n: usize, on: bool| -> Result<Option<Vec<f32>>> {
                if on { l.vec(&p(name), n).map(Some) } else { Ok(None) }
            };
            let attn = AttnWeights {
                norm: l.vec(&p("attn_norm.weight"), d)?,
                wq: l.mat(&p("attn_q.weight"), d, Some(nq))?,
                wk: l.mat(&p("attn_k.weight"), d, Some(nkv))?,
                wv: l.mat(&p("attn_v.weight"), d, Some(nkv))?,
                wo: l.mat(&p("attn_output.weight"), nq, Some(d))?,
                bq: opt_vec("attn_q.bias", nq, hp.qkv_bias)?,
                bk: opt_vec("attn_k.bias", nkv, hp.qkv_bias)?,
                bv: opt_vec("attn_v.bias", nkv, hp.qkv_bias)?,
                q_norm: opt_vec("attn_q_norm.weight", hd, hp.qk_norm)?,
                k_norm: opt_vec("attn_k_norm.weight", hd, hp.qk_norm)?,
                post_norm: opt_vec("post_attention_norm.weight", d, hp.post_norms)?,
            };
            let ffn = match &hp.moe {
                None => Ffn::Dense {
                    gate: l.mat(&p("ffn_gate.weight"), d, Some(hp.n_ff))?,
                    up: l.mat(&p("ffn_up.weight"), d, Some(hp.n_ff))?,
                    down: l.mat(&p("ffn_down.weight"), hp.n_ff, Some(d))?,
                },
                Some(m) => Ffn::Moe {
                    router: l.mat(&p("ffn_gate_inp.weight"), d, Some(m.n_expert))?,
                    gate: l.stack(&p("ffn_gate_exps.weight"), d, m.n_ff_exp, m.n_expert)?,
                    up: l.stack(&p("ffn_up_exps.weight"), d, m.n_ff_exp, m.n_expert)?,
                    down: l.stack(&p("ffn_down_exps.weight"), m.n_ff_exp, d, m.n_expert)?,
                },
            };
            let ffn = FfnWeights {
                norm: l.vec(&p("ffn_norm.weight"), d)?,
                ffn,
                post_norm: opt_vec("post_ffw_norm.weight", d, hp.post_norms)?,
            };
            layers.push(LayerWeights { attn, ffn });
        }
        let w = DecoderWeights { tok_embd, output, output_norm, layers };
        Ok(Decoder { hp, path: path.to_path_buf(), w, n_vocab, gguf })
    }

    /// Per-layer (n_head_kv, head_dim) for the KV cache.
    /// Bytes one decode step at position `pos` reads: every weight matrix (the routed experts'
    /// top-k share of their stacks, one row of the token embedding), the norm vectors and the
    /// K/V cache up to `pos` with `kv_bytes_per_value` (the roofline of `strata bench --roofline`).
    pub fn decode_bytes(&self, pos: usize, kv_bytes_per_value: f64) -> f64 {
        let top_k = self.hp.moe.as_ref().map(|m| m.n_expert_used as f64 / m.n_expert.max(1) as f64);
        let (mut mats, mut vecs) = (0.0, 0.0);
        let _ = self.w.try_map::<(), (), ()>(
            |m, name| {
                let row = m.ty.row_bytes(m.cols).unwrap_or(0) as f64;
                mats += match name {
                    decoder::WeightName::TokEmbd => row,
                    _ if m.n_mat > 1 => row * (m.rows * m.n_mat) as f64 * top_k.unwrap_or(1.0),
                    _ => row * m.rows as f64,
                };
                Ok(())
            },
            |v, _| {
                vecs += 4.0 * v.len() as f64;
                Ok(())
            },
        );
        let kv: usize = self.cache_shape().iter().map(|(h, d)| 2 * h * d).sum();
        mats + vecs + kv as f64 * pos as f64 * kv_bytes_per_value
    }

    /// Bytes of KV cache one position takes across every layer (K and V) as `kv`; None on
    /// overflow. The memory plan's unit.
    pub fn kv_bytes_per_position(&self, kv: KvType) -> Option<u64> {
        self.cache_shape()
            .iter()
            .try_fold(0u64, |sum, &(h, d)| sum.checked_add(kv.bytes_for(h.checked_mul(d)?, d)?.checked_mul(2)?))
    }

    pub fn cache_shape(&self) -> Vec<(usize, usize)> {
        self.hp
            .layers
            .iter()
            .map(|k| match k {
                LayerKind::Attention(_) => (self.hp.n_head_kv, self.hp.head_dim),
            })
            .collect()
    }
}

/// Tensor lookup with shape/type checks that name the tensor.
struct Loader<'a> {
    g: &'a Arc<GgufFile>,
}

impl Loader<'_> {
    /// The tensor `name`, or an error naming it and the shape it should have had.
    fn find(&self, name: &str, expected: &[Option<u64>]) -> Result<(usize, &TensorInfo)> {
        self.g
            .tensors()
            .iter()
            .enumerate()
            .find(|(_, t)| t.name == name)
            .ok_or_else(|| EngineError::MissingTensor { name: name.to_string(), expected: expected.to_vec() })
    }

    /// A weight type the engine can run: `quant` dequantizes it and dots it against its
    /// activations, which is what the CPU runs (`cpu_kernels::SUPPORTED_TYPES`; Q2_K, Q3_K,
    /// IQ4_XS, IQ3_S and the IQ1/IQ2 types through its portable kernel). A device backend
    /// decides at upload which of them it runs as stored.
    fn check_type(name: &str, ty: GgmlType) -> Result<()> {
        if ty.has_reference() { Ok(()) } else { Err(EngineError::UnsupportedType { name: name.into(), ty: ty.name() }) }
    }

    /// A `[rows][cols]` matrix (`rows` None: any).
    fn mat(&self, name: &str, cols: usize, rows: Option<usize>) -> Result<Mat> {
        let (tensor, t) = self.find(name, &[Some(cols as u64), rows.map(|r| r as u64)])?;
        let ok = t.dims.len() == 2 && t.dims[0] as usize == cols && rows.is_none_or(|r| t.dims[1] as usize == r);
        if !ok {
            return Err(EngineError::TensorShape {
                name: name.into(),
                expected: vec![Some(cols as u64), rows.map(|r| r as u64)],
                found: t.dims.clone(),
            });
        }
        Self::check_type(name, t.ty)?;
        Mat::mapped(self.g, tensor, 0, t.ty, t.dims[1] as usize, cols).map_err(|e| EngineError::tensor(name, e))
    }

    /// `n` matrices `[rows][cols]` stored back to back (expert stacks).
    fn stack(&self, name: &str, cols: usize, rows: usize, n: usize) -> Result<Mat> {
        let want = vec![cols as u64, rows as u64, n as u64];
        let (tensor, t) = self.find(name, &want.iter().map(|&d| Some(d)).collect::<Vec<_>>())?;
        if t.dims != want {
            return Err(EngineError::TensorShape {
                name: name.into(),
                expected: want.into_iter().map(Some).collect(),
                found: t.dims.clone(),
            });
        }
        Self::check_type(name, t.ty)?;
        Mat::mapped_stack(self.g, tensor, 0, t.ty, rows, cols, n).map_err(|e| EngineError::tensor(name, e))
    }

    /// A vector of `n` values (norm weights, biases), dequantized to f32.
    fn vec(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        let (_, t) = self.find(name, &[Some(n as u64)])?;
        let total: u64 = t.dims.iter().product();
        if total as usize != n {
            return Err(EngineError::TensorShape {
                name: name.into(),
                expected: vec![Some(n as u64)],
                found: t.dims.clone(),
            });
        }
        let mut out = vec![0f32; n];
        quant::dequantize_row(t.ty, self.g.tensor_data(t), &mut out)
            .map_err(|e| EngineError::Dequant { name: name.into(), reason: format!("{e:?}") })?;
        hparams::check_finite(name, &out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every type `quant` dequantizes and dots loads (the CPU runs them all); the rest are
    /// refused naming the tensor and the type.
    #[test]
    fn weight_types_accepted_and_refused() {
        for ty in [GgmlType::Q2K, GgmlType::Q3K, GgmlType::IQ4XS, GgmlType::IQ3S, GgmlType::IQ2XXS] {
            assert!(Loader::check_type("blk.0.ffn_down.weight", ty).is_ok(), "{ty}");
        }
        for ty in [GgmlType::IQ2XS, GgmlType::IQ2S, GgmlType::IQ1S, GgmlType::IQ1M, GgmlType::Q4K] {
            assert!(Loader::check_type("blk.0.ffn_down.weight", ty).is_ok(), "{ty}");
        }
        let e = Loader::check_type("token_embd.weight", GgmlType::TQ1_0).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("token_embd.weight") && msg.contains("tq1_0"), "{msg}");
    }
}
