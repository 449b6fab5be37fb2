//! Flash-Next's order of operations for one micro-batch, written once ([`forward`]) over the
//! operations a backend provides ([`Qwen4ExpOps`]); the counterpart of `model::decoder` for
//! this hybrid architecture. The CPU runs it in `cpu::qwen4exp`, the GPU executor
//! (`gpu::qwen4exp`) on the device; a backend that cannot run an operation returns an error
//! naming it (e.g. [`EngineError::NotOnBackend`]), never a silent fallback.
//!
//! ```text
//! R = hc copies of token_embd[tok]                          (embed)
//! per layer:  [R = PLE(R)]                                  (ple, one layer only)
//!             x, inj = HCmix_attn(R)                        (hc_mix Attn)
//!             y = GDN(x) | QSA/attention(x)                 (gdn | attention)
//!             R = HCcombine(R, y, inj)                      (hc_combine Attn)
//!             x, inj = HCmix_ffn(R); y = MoE(x)             (hc_mix Ffn, moe)
//!             R = HCcombine(R, y, inj)                      (hc_combine Ffn)
//! logits = W_out · HCmix_head(R)                            (head)
//! ```
//!
//! The MTP head ([`mtp_forward`], its block `blk.N` after the N trunk layers) reuses the
//! layer's operations with `layer = N`:
//!
//! ```text
//! R[c] = W_eh · [enorm(embed(tok)) ‖ hnorm_c(R_p[c])]      (mtp_input)
//! the attention and MoE halves of a layer, as above         (layer N)
//! logits = W_out · HCmix_head'(R)                           (mtp_head: its own mixer if any)
//! ```

use super::{Mixer, Mtp, Qwen4Exp};
use crate::error::EngineError;

/// Where a hyper-connection mix/combine sits in a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// Around the token mixer (GDN or attention).
    Mixer,
    /// Around the MoE FFN.
    Ffn,
}

/// What a backend provides to run [`forward`] on one micro-batch (its tokens, positions and
/// sequence state are the backend's). `x`, `y`, `inj` and the residual streams `R` are the
/// backend's buffers, named in the comments as in the picture above.
pub trait Qwen4ExpOps {
    /// `R[t][c] = token_embd[tok_t]` for every stream `c`.
    fn embed(&mut self) -> Result<(), EngineError>;
    /// The PLE n-gram block on `R` (layer `layer` only).
    fn ple(&mut self, layer: usize) -> Result<(), EngineError>;
    /// `x, inj = HCmix(R)` (GR read) of layer `layer` at `site`.
    fn hc_mix(&mut self, layer: usize, site: Site) -> Result<(), EngineError>;
    /// `y = GDN(x)`, advancing the layer's recurrent state.
    fn gdn(&mut self, layer: usize) -> Result<(), EngineError>;
    /// `y = attention(x)`: QSA with its indexer, or dense attention without one; appends to
    /// the layer's cache.
    fn attention(&mut self, layer: usize) -> Result<(), EngineError>;
    /// `R = HCcombine(R, y, inj)` (GR write) of layer `layer` at `site`.
    fn hc_combine(&mut self, layer: usize, site: Site) -> Result<(), EngineError>;
    /// `y = MoE(x)`: routed experts plus the gated shared expert.
    fn moe(&mut self, layer: usize) -> Result<(), EngineError>;
    /// After trunk layer `layer` (its `R` complete): where a backend records the per-layer
    /// trace. Nothing by default.
    fn end_layer(&mut self, layer: usize) -> Result<(), EngineError> {
        let _ = layer;
        Ok(())
    }
    /// `x = HCmix_head(R)`, `logits = W_out · x` (no output norm in this model).
    fn head(&mut self) -> Result<(), EngineError>;
    /// The MTP head's input: `R[t][c] = W_eh · [enorm(embed(tok_t)) ‖ hnorm_c(R_p[t][c])]`
    /// from the wide residuals `R_p` the backend was given with the tokens.
    fn mtp_input(&mut self) -> Result<(), EngineError> {
        Err(EngineError::Unsupported("this executor does not run the MTP head (its input)".into()))
    }
    /// The MTP head's output: its `hc_head` mixer (else the trunk's) and the output matrix.
    fn mtp_head(&mut self) -> Result<(), EngineError> {
        Err(EngineError::Unsupported("this executor does not run the MTP head (its output)".into()))
    }
}

/// One micro-batch of Flash-Next: the only place its layer order is written.
pub fn forward<B: Qwen4ExpOps>(b: &mut B, m: &Qwen4Exp) -> Result<(), EngineError> {
    b.embed()?;
    let ple_layer = m.ple.as_ref().map(|p| p.params.layer);
    for (il, layer) in m.layers.iter().enumerate() {
        if ple_layer == Some(il) {
            b.ple(il)?;
        }
        block(b, il, matches!(layer.mixer, Mixer::Gdn(_)))?;
        b.end_layer(il)?;
    }
    b.head()
}

/// One micro-batch of the MTP head (`mtp.block` = the trunk's layer count): its input
/// projection, one attention + MoE block as a trunk layer's (dense attention), its head.
pub fn mtp_forward<B: Qwen4ExpOps>(b: &mut B, mtp: &Mtp) -> Result<(), EngineError> {
    b.mtp_input()?;
    block(b, mtp.block, false)?;
    b.mtp_head()
}

/// The token mixer (GDN or attention) and the MoE of layer `il`, each inside its GR read/write.
fn block<B: Qwen4ExpOps>(b: &mut B, il: usize, gdn: bool) -> Result<(), EngineError> {
    b.hc_mix(il, Site::Mixer)?;
    if gdn {
        b.gdn(il)?;
    } else {
        b.attention(il)?;
    }
    b.hc_combine(il, Site::Mixer)?;
    b.hc_mix(il, Site::Ffn)?;
    b.moe(il)?;
    b.hc_combine(il, Site::Ffn)
}
