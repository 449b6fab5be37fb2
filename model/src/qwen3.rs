//! Qwen3 (`qwen3`): LLaMA-like with per-head Q/K RMSNorm before rope, NEOX rope, no biases.

use super::hparams::{HParams, Keys, RopeKind};
use crate::error::Result;

pub fn hparams(k: &Keys) -> Result<HParams> {
    let mut hp = super::llama::hparams(k)?;
    hp.rope = RopeKind::Neox;
    hp.qk_norm = true;
    Ok(hp)
}
