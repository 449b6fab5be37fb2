//! Flash-Next's order of operations for one micro-batch, written once ([`forward`]) over the
//! operations a backend provides ([`FlashNextOps`]); the counterpart of `model::decoder` for
//! this hybrid architecture. The CPU runs it in `cpu::flash_next`, the GPU executor
//! (`gpu::flash_next`) on the device; a backend that cannot run an operation returns an error
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

use super::{Mixer, Qwen4Exp};
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
pub trait FlashNextOps {
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
    /// `x = HCmix_head(R)`, `logits = W_out · x` (no output norm in this model).
    fn head(&mut self) -> Result<(), EngineError>;
}

/// One micro-batch of Flash-Next: the only place its layer order is written.
pub fn forward<B: FlashNextOps>(b: &mut B, m: &Qwen4Exp) -> Result<(), EngineError> {
    b.embed()?;
    let ple_layer = m.ple.as_ref().map(|p| p.params.layer);
    for (il, layer) in m.layers.iter().enumerate() {
        if ple_layer == Some(il) {
            b.ple(il)?;
        }
        b.hc_mix(il, Site::Mixer)?;
        match layer.mixer {
            Mixer::Gdn(_) => b.gdn(il)?,
            Mixer::Attn(_) => b.attention(il)?,
        }
        b.hc_combine(il, Site::Mixer)?;
        b.hc_mix(il, Site::Ffn)?;
        b.moe(il)?;
        b.hc_combine(il, Site::Ffn)?;
    }
    b.head()
}
