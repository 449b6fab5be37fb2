//! Resolves every qwen4exp tensor (names and ggml shapes as in llama.cpp's loader) into the
//! layer structs. Shapes are checked exactly; errors name the tensor.

use std::collections::HashMap;
use std::sync::Arc;

use gguf::GgufFile;

use super::gdn::Gdn;
use super::gr::HyperConn;
use super::hparams::{HParams, LayerKind};
use super::moe::{Moe, SwiGlu};
use super::ple::Ple;
use super::ple_io::{PleOptions, PleTable};
use super::qsa::{Indexer, Qsa};
use super::{GdnMode, Layer, Mixer, Qwen4Exp};
use crate::Mat;
use crate::error::EngineError;

pub(super) struct Loader {
    pub(super) file: Arc<GgufFile>,
    pub(super) index: HashMap<String, usize>,
}

impl Loader {
    pub(super) fn new(file: Arc<GgufFile>) -> Loader {
        let index = file.tensors().iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Loader { file, index }
    }

    pub(super) fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn find(&self, name: &str) -> Result<(usize, &gguf::TensorInfo), EngineError> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| EngineError::MissingTensor { name: name.to_string(), expected: Vec::new() })?;
        Ok((i, &self.file.tensors()[i]))
    }

    /// [`Loader::find`] for a tensor of known shape: a missing one is reported with the shape
    /// it should have had (what a user needs to fix a converted file).
    fn find_shaped(&self, name: &str, want: &[usize]) -> Result<(usize, &gguf::TensorInfo), EngineError> {
        self.find(name).map_err(|_| EngineError::MissingTensor {
            name: name.into(),
            expected: want.iter().map(|&d| Some(d as u64)).collect(),
        })
    }

    fn check_dims(name: &str, found: &[u64], want: &[usize]) -> Result<(), EngineError> {
        let want: Vec<u64> = want.iter().map(|&d| d as u64).collect();
        if found != want.as_slice() {
            return Err(EngineError::TensorShape {
                name: name.into(),
                expected: want.into_iter().map(Some).collect(),
                found: found.to_vec(),
            });
        }
        Ok(())
    }

    /// ggml ne `[cols, rows]` → a `[rows][cols]` matrix.
    pub(super) fn mat(&self, name: &str, cols: usize, rows: usize) -> Result<Mat, EngineError> {
        let (i, t) = self.find_shaped(name, &[cols, rows])?;
        Self::check_dims(name, &t.dims, &[cols, rows])?;
        Mat::mapped(&self.file, i, 0, t.ty, rows, cols).map_err(|e| EngineError::tensor(name, e))
    }

    /// ggml ne `[cols]` used as a 1-row matrix (the shared-expert gate).
    pub(super) fn row(&self, name: &str, cols: usize) -> Result<Mat, EngineError> {
        let (i, t) = self.find_shaped(name, &[cols])?;
        Self::check_dims(name, &t.dims, &[cols])?;
        Mat::mapped(&self.file, i, 0, t.ty, 1, cols).map_err(|e| EngineError::tensor(name, e))
    }

    /// ggml ne `[cols, rows, n]` → n matrices (expert stacks).
    pub(super) fn stack(&self, name: &str, cols: usize, rows: usize, n: usize) -> Result<Vec<Mat>, EngineError> {
        let (i, t) = self.find_shaped(name, &[cols, rows, n])?;
        Self::check_dims(name, &t.dims, &[cols, rows, n])?;
        let per = t.ty.row_bytes(cols).unwrap_or(0) * rows;
        (0..n)
            .map(|e| {
                Mat::mapped(&self.file, i, e * per, t.ty, rows, cols)
                    .map_err(|err| EngineError::tensor(format!("{name}[{e}]"), err))
            })
            .collect()
    }

    /// A small tensor of exactly `dims` dequantized to f32 (row-major = reversed ne).
    pub(super) fn vec(&self, name: &str, dims: &[usize]) -> Result<Vec<f32>, EngineError> {
        let (_, t) = self.find_shaped(name, dims)?;
        Self::check_dims(name, &t.dims, dims)?;
        let n: usize = dims.iter().product();
        let mut out = vec![0f32; n];
        quant::dequantize_row(t.ty, self.file.tensor_data(t), &mut out)
            .map_err(|e| EngineError::Dequant { name: name.into(), reason: format!("{e:?}") })?;
        crate::hparams::check_finite(name, &out)?;
        Ok(out)
    }

    pub(super) fn dim(&self, name: &str, axis: usize) -> Result<usize, EngineError> {
        let (_, t) = self.find(name)?;
        t.dims.get(axis).map(|&d| d as usize).ok_or_else(|| EngineError::TensorShape {
            name: name.into(),
            expected: vec![None; axis + 1],
            found: t.dims.clone(),
        })
    }

    /// Checks only that `name` exists with ggml shape `dims` (tensors read but not used).
    pub(super) fn check(&self, name: &str, dims: &[usize]) -> Result<(), EngineError> {
        let (_, t) = self.find_shaped(name, dims)?;
        Self::check_dims(name, &t.dims, dims)
    }

    pub(super) fn hc(&self, prefix: &str, hp: &HParams, inject: bool) -> Result<HyperConn, EngineError> {
        let (e, hc, lr) = (hp.n_embd, hp.hc, hp.hc_rank);
        Ok(HyperConn {
            hc,
            n_embd: e,
            eps: hp.eps,
            norm: self.vec(&format!("{prefix}norm.weight"), &[e, hc])?,
            down: self.mat(&format!("{prefix}down.weight"), hc * e, lr)?,
            up: self.mat(&format!("{prefix}up.weight"), lr, hc * e)?,
            inject: if inject { Some(self.mat(&format!("{prefix}inject.weight"), hc * e, hc)?) } else { None },
        })
    }
}

const PLE_TABLE: &str = "per_layer_token_embd.weight";

/// Finds the PLE table: in `opt.ple_gguf` if given, else in the model (split siblings
/// included). Returns the file, the tensor index, the path of the shard holding it and the
/// absolute byte offset of its data there; `None` if absent.
#[allow(clippy::type_complexity)]
fn find_table(
    main: &Arc<GgufFile>,
    opt: &PleOptions,
) -> Result<(Option<(Arc<GgufFile>, usize, std::path::PathBuf, u64)>, Vec<std::path::PathBuf>), EngineError> {
    let file = match &opt.ple_gguf {
        Some(p) => Arc::new(GgufFile::open(p)?),
        None => main.clone(),
    };
    let searched = file.paths().iter().map(|p| p.to_path_buf()).collect();
    let Some(i) = file.tensors().iter().position(|t| t.name == PLE_TABLE) else {
        return Ok((None, searched));
    };
    let t = &file.tensors()[i];
    let path = file.paths()[t.file_index].to_path_buf();
    let abs = file.data_offset(t.file_index).unwrap_or(0) + t.offset;
    Ok((Some((file.clone(), i, path, abs)), searched))
}

pub(super) fn load(file: Arc<GgufFile>, opt: &PleOptions) -> Result<Qwen4Exp, EngineError> {
    let mut warnings = Vec::new();
    if file.tensor("token_embd.weight").is_none() && file.tensors().iter().any(|t| t.name.contains(".nextn.")) {
        return Err(EngineError::MtpOnly);
    }
    let hp = HParams::from_gguf(&file)?;
    let l = Loader::new(file.clone());
    let (e, v) = (hp.n_embd, hp.n_vocab);
    let tok_embd = l.mat("token_embd.weight", e, v)?;
    let output = match l.index.get("output.weight") {
        Some(_) => l.mat("output.weight", e, v)?,
        None => l.mat("token_embd.weight", e, v)?, // tied head
    };
    let out_hc = l.hc("output_hc_", &hp, false)?;

    let mut layers = Vec::with_capacity(hp.n_layer);
    for il in 0..hp.n_layer {
        let p = |s: &str| format!("blk.{il}.{s}");
        let mixer = match hp.layers[il] {
            LayerKind::Gdn => {
                let (hk, hv, s, k) = (hp.ssm_k_heads, hp.ssm_v_heads, hp.ssm_state, hp.ssm_conv);
                let c = (2 * hk + hv) * s;
                Mixer::Gdn(Gdn {
                    hk,
                    hv,
                    s,
                    conv_k: k,
                    eps: hp.eps,
                    qkv: l.mat(&p("attn_qkv.weight"), e, c)?,
                    gate: l.mat(&p("attn_gate.weight"), e, hv * s)?,
                    conv: l.vec(&p("ssm_conv1d.weight"), &[k, c])?,
                    dt_bias: l.vec(&p("ssm_dt.bias"), &[hv])?,
                    a: l.vec(&p("ssm_a"), &[hv])?,
                    beta: l.mat(&p("ssm_beta.weight"), e, hv)?,
                    alpha: l.mat(&p("ssm_alpha.weight"), e, hv)?,
                    norm: l.vec(&p("ssm_norm.weight"), &[s])?,
                    out: l.mat(&p("ssm_out.weight"), hv * s, e)?,
                })
            }
            LayerKind::Qsa { ratio } => Mixer::Attn(attention(&l, &hp, il, ratio)?),
            LayerKind::Dense => Mixer::Attn(attention(&l, &hp, il, 0)?),
        };
        let moe = moe(&l, &hp, il)?;
        layers.push(Layer {
            hc_attn: l.hc(&p("hc_attn_"), &hp, true)?,
            mixer,
            hc_ffn: l.hc(&p("hc_ffn_"), &hp, true)?,
            moe,
        });
    }

    let ple = match &hp.ple {
        None => None,
        Some(pp) => {
            let (hc, il) = (hp.hc, pp.layer);
            let p = |s: &str| format!("blk.{il}.{s}");
            match find_table(&file, opt)? {
                (None, searched) if opt.ple_skip => {
                    let w = format!(
                        "PLE table {PLE_TABLE} not found in {searched:?}; --ple-skip: the PLE \
                         block of layer {il} is skipped (adds nothing), outputs differ from the model"
                    );
                    eprintln!("strata: warning: {w}");
                    warnings.push(w);
                    None
                }
                (None, searched) => return Err(EngineError::PleTableMissing { searched }),
                (Some((tfile, ti, tpath, abs)), _) => {
                    let t = &tfile.tensors()[ti];
                    let dims_err = || EngineError::TensorShape {
                        name: PLE_TABLE.into(),
                        expected: vec![Some(pp.head_dim as u64), None],
                        found: t.dims.clone(),
                    };
                    if t.dims.len() != 2 || t.dims[0] != pp.head_dim as u64 {
                        return Err(dims_err());
                    }
                    let rows = t.dims[1] as usize;
                    let needed =
                        (0..pp.n_heads()).map(|i| pp.head_offsets[i] + pp.head_vocab_sizes[i]).max().unwrap_or(0);
                    if (rows as u64) < needed {
                        return Err(EngineError::TensorShape {
                            name: PLE_TABLE.into(),
                            expected: vec![Some(pp.head_dim as u64), Some(needed)],
                            found: vec![pp.head_dim as u64, rows as u64],
                        });
                    }
                    // Its rows are checked as they are read (`ple_io`): 29–51 GB are not read at load.
                    let mapped = Mat::mapped_unchecked(&tfile, ti, t.ty, rows, pp.head_dim)
                        .map_err(|e| EngineError::tensor(PLE_TABLE, e))?;
                    let table = PleTable::open(mapped, &tpath, abs, opt)
                        .map_err(|reason| EngineError::PleIo { path: tpath.clone(), reason })?;
                    warnings.extend(table.warnings());
                    Some(Ple {
                        params: pp.clone(),
                        hc,
                        n_embd: e,
                        eps: hp.eps,
                        table,
                        key: l.mat(&p("ple_key.weight"), e, hc * e)?,
                        value: l.mat(&p("ple_value.weight"), e, e)?,
                        norm_key: l.vec(&p("ple_norm_key.weight"), &[e, hc])?,
                        norm_query: l.vec(&p("ple_norm_query.weight"), &[e, hc])?,
                        norm_conv: l.vec(&p("ple_norm_conv.weight"), &[e, hc])?,
                        conv: l.vec(&p("ple_conv1d.weight"), &[pp.conv_kernel, hc * e])?,
                    })
                }
            }
        }
    };

    Ok(Qwen4Exp { hp, file, tok_embd, output, out_hc, layers, ple, gdn_mode: GdnMode::Recurrent, warnings })
}

/// The attention weights of block `il` (`blk.{il}.attn_*`, and `blk.{il}.indexer.*` when
/// `ratio > 0`). Also builds the MTP block's attention.
pub(super) fn attention(l: &Loader, hp: &HParams, il: usize, ratio: usize) -> Result<Qsa, EngineError> {
    let e = hp.n_embd;
    let p = |s: &str| format!("blk.{il}.{s}");
    let (h, kv, d) = (hp.n_head, hp.n_head_kv, hp.head_dim);
    let indexer = if ratio > 0 {
        Some(Indexer {
            heads: hp.idx_heads,
            dim: hp.idx_dim,
            top_k: hp.idx_top_k,
            ratio,
            q: l.mat(&p("indexer.q_proj.weight"), e, hp.idx_heads * hp.idx_dim)?,
            k: l.mat(&p("indexer.k_proj.weight"), e, hp.idx_dim)?,
            q_norm: l.vec(&p("indexer.q_norm.weight"), &[hp.idx_dim])?,
            k_norm: l.vec(&p("indexer.k_norm.weight"), &[hp.idx_dim])?,
        })
    } else {
        None
    };
    Ok(Qsa {
        n_head: h,
        n_head_kv: kv,
        head_dim: d,
        n_rot: hp.n_rot,
        rope_base: hp.rope_base,
        eps: hp.eps,
        q: l.mat(&p("attn_q.weight"), e, 2 * h * d)?,
        k: l.mat(&p("attn_k.weight"), e, kv * d)?,
        v: l.mat(&p("attn_v.weight"), e, kv * d)?,
        o: l.mat(&p("attn_output.weight"), h * d, e)?,
        q_norm: l.vec(&p("attn_q_norm.weight"), &[d])?,
        k_norm: l.vec(&p("attn_k_norm.weight"), &[d])?,
        indexer,
    })
}

/// The MoE FFN of block `il` (`blk.{il}.ffn_*`). Also builds the MTP block's FFN.
pub(super) fn moe(l: &Loader, hp: &HParams, il: usize) -> Result<Moe, EngineError> {
    let e = hp.n_embd;
    let p = |s: &str| format!("blk.{il}.{s}");
    // Expert widths: the keys when present (checked by the shape checks below), else what
    // the tensors say (llama.cpp falls back the same way).
    let ff = match hp.n_ff_exp {
        Some(v) => v,
        None => l.dim(&p("ffn_gate_exps.weight"), 1)?,
    };
    let ffs = match hp.n_ff_shexp {
        Some(v) => v,
        None => l.dim(&p("ffn_gate_shexp.weight"), 1)?,
    };
    let ne = hp.n_expert;
    let gates = l.stack(&p("ffn_gate_exps.weight"), e, ff, ne)?;
    let ups = l.stack(&p("ffn_up_exps.weight"), e, ff, ne)?;
    let downs = l.stack(&p("ffn_down_exps.weight"), ff, e, ne)?;
    let experts = gates.into_iter().zip(ups).zip(downs).map(|((gate, up), down)| SwiGlu { gate, up, down }).collect();
    Ok(Moe {
        spec: super::moe::spec(ne, hp.n_expert_used, ff, ffs),
        router: l.mat(&p("ffn_gate_inp.weight"), e, ne)?,
        experts,
        shared_gate: l.row(&p("ffn_gate_inp_shexp.weight"), e)?,
        shared: SwiGlu {
            gate: l.mat(&p("ffn_gate_shexp.weight"), e, ffs)?,
            up: l.mat(&p("ffn_up_shexp.weight"), e, ffs)?,
            down: l.mat(&p("ffn_down_shexp.weight"), ffs, e)?,
        },
    })
}
