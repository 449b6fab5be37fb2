//! Flash-Next's weights on the device: every [`Mat`] of the loaded model uploaded once through
//! the shared decoder's [`Uploader`] (MMVQ types as stored, f16/bf16 as stored, other types
//! widened to f32 for the GEMM path), the per-layer constants as f32, and the launch shapes of
//! the layer kernels. What the device cannot run is refused here, at load, with the tensor or
//! dimension and the limit.

use crate::abi;
use crate::device::{DevicePtr, GpuApi};
use crate::ops::{GdnShape, GrShape, KvFormat, PleShape, QsaIndexerShape, QsaShape};
use crate::upload::{DevMat, Uploader, device_layout};
use model::Mat;
use model::error::{EngineError, Result};
use model::qwen4exp::moe::SwiGlu;
use model::qwen4exp::{Gdn, HyperConn, Mixer, Moe, Mtp, Ple, Qsa, Qwen4Exp};

/// One hyper-connection mixer (`hc_attn_*`, `hc_ffn_*`, `output_hc_*`).
pub(super) struct DevHc {
    pub shape: GrShape,
    /// Gammas `[hc][E]`.
    pub norm: DevicePtr,
    pub down: DevMat,
    pub up: DevMat,
    pub inject: Option<DevMat>,
}

pub(super) struct DevGdn {
    pub shape: GdnShape,
    pub qkv: DevMat,
    pub gate: DevMat,
    pub beta: DevMat,
    pub alpha: DevMat,
    pub out: DevMat,
    pub taps: DevicePtr,
    pub dt_bias: DevicePtr,
    pub ssm_a: DevicePtr,
    pub norm: DevicePtr,
}

pub(super) struct DevQsa {
    /// The cache format is the session's (`QsaShape::kv` is set per window).
    pub shape: QsaShape,
    pub rope_base: f32,
    pub q: DevMat,
    pub k: DevMat,
    pub v: DevMat,
    pub o: DevMat,
    /// The indexer's query and key projections.
    pub ix: Option<(DevMat, DevMat)>,
    pub q_norm: DevicePtr,
    pub k_norm: DevicePtr,
    /// The indexer's norms (0 without indexer).
    pub iq_norm: DevicePtr,
    pub ik_norm: DevicePtr,
}

pub(super) enum DevMixer {
    Gdn(DevGdn),
    Attn(DevQsa),
}

#[derive(Clone, Copy)]
pub(super) struct DevFfn {
    pub gate: DevMat,
    pub up: DevMat,
    pub down: DevMat,
}

/// A layer's routed experts on the device: each matrix a stack of `n` (expert or slot `i` at
/// `i · mat_bytes`). Every expert resident: `n` is the expert count and the slot is the expert
/// id (what device dispatch, `mmvq_moe_*`, reads); with `--expert-cache N`, `n` slots that the
/// cache gives out (`ExpertCache::place`), copied in by [`DevExperts::fill`].
pub(super) struct DevExperts {
    pub stack: DevFfn,
    pub n: usize,
}

impl DevExperts {
    /// The matrices of expert (resident) or slot (cache) `e`.
    pub fn get(&self, e: usize) -> Option<DevFfn> {
        if e >= self.n {
            return None;
        }
        let at = |m: &DevMat| DevMat { ptr: m.expert(e), ..*m };
        let f = &self.stack;
        Some(DevFfn { gate: at(&f.gate), up: at(&f.up), down: at(&f.down) })
    }

    /// Copies expert `f` of the host model (its bytes as stored, laid out as at upload) into
    /// slot `slot`.
    pub fn fill(&self, api: &dyn GpuApi, f: &SwiGlu, slot: usize) -> std::result::Result<(), String> {
        for (dst, bytes) in self.parts(f, slot)? {
            api.memcpy_htod(dst, &bytes).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// What [`DevExperts::fill`] copies: (device destination, bytes) of the gate, up and down.
    pub fn parts<'x>(
        &self,
        f: &'x SwiGlu,
        slot: usize,
    ) -> std::result::Result<Vec<(DevicePtr, std::borrow::Cow<'x, [u8]>)>, String> {
        let Some(dst) = self.get(slot) else { return Err(format!("no slot {slot}")) };
        self.parts_into(f, dst)
    }

    /// An expert's matrices laid out at `base` (a staging slot, `GpuQwen4Exp::staging`): a
    /// stack of one, filled by [`DevExperts::staged_parts`].
    pub fn staged(&self, base: DevicePtr) -> DevFfn {
        let s = &self.stack;
        DevFfn {
            gate: DevMat { ptr: base, ..s.gate },
            up: DevMat { ptr: base + s.gate.mat_bytes as u64, ..s.up },
            down: DevMat { ptr: base + (s.gate.mat_bytes + s.up.mat_bytes) as u64, ..s.down },
        }
    }

    /// Copies expert `f` to the staging slot at `base` ([`DevExperts::staged`]); the caller
    /// makes sure no queued launch still reads it.
    pub fn fill_staged(&self, api: &dyn GpuApi, f: &SwiGlu, base: DevicePtr) -> std::result::Result<(), String> {
        for (dst, bytes) in self.parts_into(f, self.staged(base))? {
            api.memcpy_htod(dst, &bytes).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Bytes of one expert's gate, up and down on the device.
    pub fn one_bytes(&self) -> usize {
        let s = &self.stack;
        s.gate.mat_bytes + s.up.mat_bytes + s.down.mat_bytes
    }

    fn parts_into<'x>(
        &self,
        f: &'x SwiGlu,
        dst: DevFfn,
    ) -> std::result::Result<Vec<(DevicePtr, std::borrow::Cow<'x, [u8]>)>, String> {
        // The ordered mode keeps weights as stored (MatKind::Raw).
        let ordered = self.stack.gate.kind == crate::upload::MatKind::Raw;
        [(&f.gate, dst.gate), (&f.up, dst.up), (&f.down, dst.down)]
            .into_iter()
            .map(|(m, d)| {
                device_layout(ordered, m.data(), m.ty, m.rows, m.cols, 1, "expert")
                    .map(|(bytes, _)| (d.ptr, bytes))
                    .map_err(|e| e.to_string())
            })
            .collect()
    }
}

pub(super) struct DevMoe {
    pub n_used: usize,
    pub router: DevMat,
    pub experts: DevExperts,
    pub shared_gate: DevMat,
    pub shared: DevFfn,
}

impl DevWeights {
    /// One routed expert's gate, up and down on the device (the first MoE layer's).
    pub fn expert_bytes(&self) -> usize {
        self.layers.first().map_or(0, |l| l.moe.experts.one_bytes())
    }
}

pub(super) struct DevPle {
    pub shape: PleShape,
    pub key: DevMat,
    pub value: DevMat,
    /// The key, query and conv gammas `[3][hc][E]`.
    pub norms: DevicePtr,
    pub taps: DevicePtr,
}

pub(super) struct DevLayer {
    pub hc_attn: DevHc,
    pub mixer: DevMixer,
    pub hc_ffn: DevHc,
    pub moe: DevMoe,
}

pub(super) struct DevWeights {
    pub tok_embd: DevMat,
    pub output: DevMat,
    pub out_hc: DevHc,
    pub layers: Vec<DevLayer>,
    pub ple: Option<DevPle>,
}

fn unsupported(what: String) -> EngineError {
    EngineError::Unsupported(format!("qwen4exp on the GPU: {what}"))
}

fn mat(up: &mut Uploader, m: &Mat, name: &str) -> Result<DevMat> {
    up.matrix(m.data(), m.ty, m.rows, m.cols, 1, name)
}

fn hc_mixer(up: &mut Uploader, h: &HyperConn, name: &str) -> Result<DevHc> {
    Ok(DevHc {
        shape: GrShape { hc: h.hc as u32, e: h.n_embd as u32, eps: h.eps },
        norm: up.f32s(&h.norm)?,
        down: mat(up, &h.down, &format!("{name}_down"))?,
        up: mat(up, &h.up, &format!("{name}_up"))?,
        inject: h.inject.as_ref().map(|w| mat(up, w, &format!("{name}_inject"))).transpose()?,
    })
}

fn gdn(up: &mut Uploader, g: &Gdn, il: usize) -> Result<DevGdn> {
    let n = |s: &str| format!("blk.{il}.{s}");
    if g.s > crate::abi::GDN_CHUNK_MAX_HEAD_DIM as usize {
        return Err(unsupported(format!(
            "{}: GDN head dim {} (at most {}: the chunked delta rule stages rows of it in LDS)",
            n("attn_qkv"),
            g.s,
            crate::abi::GDN_CHUNK_MAX_HEAD_DIM
        )));
    }
    Ok(DevGdn {
        shape: GdnShape { hk: g.hk as u32, hv: g.hv as u32, head_dim: g.s as u32, conv_k: g.conv_k as u32, eps: g.eps },
        qkv: mat(up, &g.qkv, &n("attn_qkv"))?,
        gate: mat(up, &g.gate, &n("attn_gate"))?,
        beta: mat(up, &g.beta, &n("ssm_beta"))?,
        alpha: mat(up, &g.alpha, &n("ssm_alpha"))?,
        out: mat(up, &g.out, &n("ssm_out"))?,
        taps: up.f32s(&g.conv)?,
        dt_bias: up.f32s(&g.dt_bias)?,
        ssm_a: up.f32s(&g.a)?,
        norm: up.f32s(&g.norm)?,
    })
}

fn qsa(up: &mut Uploader, a: &Qsa, il: usize) -> Result<DevQsa> {
    let n = |s: &str| format!("blk.{il}.{s}");
    if a.head_dim > 256 || !a.n_rot.is_multiple_of(2) || a.n_rot > a.head_dim {
        return Err(unsupported(format!(
            "{}: head dim {} (at most 256) with {} roped dims (even, at most the head dim)",
            n("attn_q"),
            a.head_dim,
            a.n_rot
        )));
    }
    if let Some(ix) = &a.indexer
        && (ix.dim > 256 || a.n_rot > ix.dim)
    {
        return Err(unsupported(format!(
            "{}: indexer key length {} (at most 256, at least n_rot {})",
            n("indexer.k_proj"),
            ix.dim,
            a.n_rot
        )));
    }
    let (iq_norm, ik_norm, ix) = match &a.indexer {
        Some(ix) => (
            up.f32s(&ix.q_norm)?,
            up.f32s(&ix.k_norm)?,
            Some((mat(up, &ix.q, &n("indexer.q_proj"))?, mat(up, &ix.k, &n("indexer.k_proj"))?)),
        ),
        None => (0, 0, None),
    };
    Ok(DevQsa {
        shape: QsaShape {
            n_head: a.n_head as u32,
            n_head_kv: a.n_head_kv as u32,
            head_dim: a.head_dim as u32,
            n_rot: a.n_rot as u32,
            eps: a.eps,
            indexer: a.indexer.as_ref().map(|ix| QsaIndexerShape {
                heads: ix.heads as u32,
                dim: ix.dim as u32,
                top_k: ix.top_k as u32,
                ratio: ix.ratio as u32,
            }),
            kv: KvFormat::F16,
        },
        rope_base: a.rope_base,
        q: mat(up, &a.q, &n("attn_q"))?,
        k: mat(up, &a.k, &n("attn_k"))?,
        v: mat(up, &a.v, &n("attn_v"))?,
        o: mat(up, &a.o, &n("attn_output"))?,
        ix,
        q_norm: up.f32s(&a.q_norm)?,
        k_norm: up.f32s(&a.k_norm)?,
        iq_norm,
        ik_norm,
    })
}

fn ffn(up: &mut Uploader, f: &SwiGlu, name: &str) -> Result<DevFfn> {
    Ok(DevFfn {
        gate: mat(up, &f.gate, &format!("{name} gate"))?,
        up: mat(up, &f.up, &format!("{name} up"))?,
        down: mat(up, &f.down, &format!("{name} down"))?,
    })
}

/// Every expert of a layer must share its type and shape (the GGUF's expert stacks do): the
/// device keeps them as one stack per matrix.
fn check_uniform(m: &Moe, il: usize) -> Result<()> {
    let f0 = &m.experts[0];
    for (e, f) in m.experts.iter().enumerate() {
        for (what, a, b) in [("gate", &f.gate, &f0.gate), ("up", &f.up, &f0.up), ("down", &f.down, &f0.down)] {
            if (a.ty, a.rows, a.cols) != (b.ty, b.rows, b.cols) {
                return Err(unsupported(format!(
                    "blk.{il}.ffn_{what}_exps: expert {e} is {:?} {}x{}, expert 0 {:?} {}x{} (the device keeps a layer's experts as one stack)",
                    a.ty, a.rows, a.cols, b.ty, b.rows, b.cols
                )));
            }
        }
    }
    Ok(())
}

/// Room for `n` experts shaped like the layer's first.
fn expert_slots(up: &mut Uploader, m: &Moe, il: usize, n: usize) -> Result<DevFfn> {
    check_uniform(m, il)?;
    let f0 = &m.experts[0];
    let room = |up: &mut Uploader, w: &Mat, what: &str| {
        up.matrix_room(w.data(), w.ty, w.rows, w.cols, n, &format!("blk.{il}.ffn_{what}_exps"))
    };
    Ok(DevFfn { gate: room(up, &f0.gate, "gate")?, up: room(up, &f0.up, "up")?, down: room(up, &f0.down, "down")? })
}

/// Every expert of a layer, each matrix one stack in expert order.
fn expert_stacks(up: &mut Uploader, m: &Moe, il: usize) -> Result<DevFfn> {
    check_uniform(m, il)?;
    let stack = |up: &mut Uploader, pick: fn(&SwiGlu) -> &Mat, what: &str| -> Result<DevMat> {
        let name = format!("blk.{il}.ffn_{what}_exps");
        let mut bytes = Vec::new();
        let mut layout = None;
        for f in &m.experts {
            let w = pick(f);
            let (b, d) = device_layout(up.ordered(), w.data(), w.ty, w.rows, w.cols, 1, &name)?;
            bytes.extend_from_slice(&b);
            layout.get_or_insert(d);
        }
        let mut d = layout.ok_or_else(|| unsupported(format!("{name}: no experts")))?;
        d.ptr = up.bytes(&bytes)?;
        Ok(d)
    };
    Ok(DevFfn {
        gate: stack(up, |f| &f.gate, "gate")?,
        up: stack(up, |f| &f.up, "up")?,
        down: stack(up, |f| &f.down, "down")?,
    })
}

fn moe(up: &mut Uploader, m: &Moe, il: usize, cache_slots: Option<usize>) -> Result<DevMoe> {
    let ne = m.experts.len();
    if ne == 0
        || ne > abi::MOE_MAX_EXPERTS as usize
        || m.spec.n_expert_used == 0
        || m.spec.n_expert_used > (abi::MOE_MAX_K as usize).min(ne)
    {
        return Err(unsupported(format!(
            "blk.{il}.ffn_gate_inp: {ne} experts top-{} (the router kernel takes up to {} experts, top-{})",
            m.spec.n_expert_used,
            abi::MOE_MAX_EXPERTS,
            abi::MOE_MAX_K
        )));
    }
    Ok(DevMoe {
        n_used: m.spec.n_expert_used,
        router: mat(up, &m.router, &format!("blk.{il}.ffn_gate_inp"))?,
        experts: experts(up, m, il, cache_slots)?,
        shared_gate: mat(up, &m.shared_gate, &format!("blk.{il}.ffn_gate_inp_shexp"))?,
        shared: ffn(up, &m.shared, &format!("blk.{il} shared expert"))?,
    })
}

fn ple(up: &mut Uploader, p: &Ple) -> Result<DevPle> {
    let norms: Vec<f32> = [&p.norm_key[..], &p.norm_query[..], &p.norm_conv[..]].concat();
    Ok(DevPle {
        shape: PleShape {
            hc: p.hc as u32,
            e: p.n_embd as u32,
            conv_kernel: p.params.conv_kernel as u32,
            dilation: p.params.ngram as u32,
            eps: p.eps,
        },
        key: mat(up, &p.key, "ple key")?,
        value: mat(up, &p.value, "ple value")?,
        norms: up.f32s(&norms)?,
        taps: up.f32s(&p.conv)?,
    })
}

/// Replaces every MoE layer's experts: `Some(n)` slots (empty), or `None` every expert resident.
/// The old device copies stay allocated (the empty slots of `auto`, a few bytes).
pub(super) fn resize_experts(up: &mut Uploader, m: &Qwen4Exp, w: &mut DevWeights, slots: Option<usize>) -> Result<()> {
    for (il, (l, d)) in m.layers.iter().zip(&mut w.layers).enumerate() {
        d.moe.experts = experts(up, &l.moe, il, slots)?;
    }
    Ok(())
}

/// A layer's routed experts: `Some(n)` empty slots, or `None` every expert resident.
fn experts(up: &mut Uploader, m: &Moe, il: usize, slots: Option<usize>) -> Result<DevExperts> {
    Ok(match slots {
        Some(n) => DevExperts { stack: expert_slots(up, m, il, n)?, n },
        None => DevExperts { stack: expert_stacks(up, m, il)?, n: m.experts.len() },
    })
}

/// Uploads every weight of `m`; with `cache_slots`, each MoE layer gets that many empty expert
/// slots instead of its experts.
pub(super) fn upload(up: &mut Uploader, m: &Qwen4Exp, cache_slots: Option<usize>) -> Result<DevWeights> {
    let t = &m.tok_embd;
    let tok_embd = up.embedding_table(t.data(), t.ty, t.rows, t.cols)?;
    let mut layers = Vec::with_capacity(m.layers.len());
    for (il, l) in m.layers.iter().enumerate() {
        layers.push(DevLayer {
            hc_attn: hc_mixer(up, &l.hc_attn, &format!("blk.{il}.hc_attn"))?,
            mixer: match &l.mixer {
                Mixer::Gdn(g) => DevMixer::Gdn(gdn(up, g, il)?),
                Mixer::Attn(a) => DevMixer::Attn(qsa(up, a, il)?),
            },
            hc_ffn: hc_mixer(up, &l.hc_ffn, &format!("blk.{il}.hc_ffn"))?,
            moe: moe(up, &l.moe, il, cache_slots)?,
        });
    }
    Ok(DevWeights {
        tok_embd,
        output: mat(up, &m.output, "output")?,
        out_hc: hc_mixer(up, &m.out_hc, "output_hc")?,
        layers,
        ple: m.ple.as_ref().map(|p| ple(up, p)).transpose()?,
    })
}

/// The MTP head's block `blk.N` on the device: its input norms and projection, one attention +
/// MoE layer (every expert resident: the head's experts are not in the trunk's cache), its own
/// output mixer and tables when the file has them (else the trunk's).
pub(super) struct DevMtp {
    /// `enorm` as a one-stream GR norm, `hnorm` as the trunk's `hc` streams.
    pub enorm_shape: GrShape,
    pub enorm: DevicePtr,
    pub hnorm_shape: GrShape,
    pub hnorm: DevicePtr,
    /// `[E][2E]`.
    pub eh_proj: DevMat,
    pub layer: DevLayer,
    pub hc_head: Option<DevHc>,
    pub embed: Option<DevMat>,
    pub head: Option<DevMat>,
}

/// Uploads the MTP head `h` of `m` (block `h.block`).
pub(super) fn upload_mtp(up: &mut Uploader, h: &Mtp) -> Result<DevMtp> {
    let il = h.block;
    let (e, hc) = (h.n_embd as u32, h.hc as u32);
    Ok(DevMtp {
        enorm_shape: GrShape { hc: 1, e, eps: h.eps },
        enorm: up.f32s(&h.enorm)?,
        hnorm_shape: GrShape { hc, e, eps: h.eps },
        hnorm: up.f32s(&h.hnorm)?,
        eh_proj: mat(up, &h.eh_proj, &format!("blk.{il}.nextn.eh_proj"))?,
        layer: DevLayer {
            hc_attn: hc_mixer(up, &h.hc_attn, &format!("blk.{il}.hc_attn"))?,
            mixer: DevMixer::Attn(qsa(up, &h.attn, il)?),
            hc_ffn: hc_mixer(up, &h.hc_ffn, &format!("blk.{il}.hc_ffn"))?,
            moe: moe(up, &h.moe, il, None)?,
        },
        hc_head: h.hc_head.as_ref().map(|x| hc_mixer(up, x, &format!("blk.{il}.nextn.hc_head"))).transpose()?,
        embed: h.embed.as_ref().map(|t| up.embedding_table(t.data(), t.ty, t.rows, t.cols)).transpose()?,
        head: h.head.as_ref().map(|t| mat(up, t, &format!("blk.{il}.nextn.shared_head_head"))).transpose()?,
    })
}
