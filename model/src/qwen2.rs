//! Qwen2 / Qwen2.5 (`qwen2`): LLaMA-like with Q/K/V biases and NEOX rope.

use super::hparams::{HParams, Keys, RopeKind};
use crate::error::Result;

pub fn hparams(k: &Keys) -> Result<HParams> {
    let mut hp = super::llama::hparams(k)?;
    hp.rope = RopeKind::Neox;
    hp.qkv_bias = true;
    Ok(hp)
}
