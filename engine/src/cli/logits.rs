//! `strata logits`: logits of every position of a token sequence → float32 .npy
//! `[positions, vocab]`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::engine::Engine;
use model::Logits;

#[derive(Args, Debug, Clone)]
pub struct LogitsArgs {
    /// Comma-separated token ids, e.g. `2,818,5279`.
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt", required_unless_present = "prompt")]
    pub tokens: Vec<u32>,
    /// Alternatively a text, tokenized like `generate` does (BOS per the model).
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Output file (.npy, float32, shape [positions, vocab]).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(e: &Engine, a: &LogitsArgs) -> Result<()> {
    let ids = match &a.prompt {
        Some(p) => e.encode(p, false),
        None => a.tokens.clone(),
    };
    if ids.is_empty() {
        match &a.prompt {
            Some(p) => bail!("{}", e.empty_prompt(p)),
            None => bail!("no tokens given (--tokens or --prompt)"),
        }
    }
    let mut sess = e.new_session()?;
    let mut logits = Vec::new();
    e.eval(&mut *sess, &ids, Logits::All, &mut logits)?;
    crate::npy::write_f32(&a.out, &[ids.len(), e.model.n_vocab()], &logits)
        .with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!("wrote [{}, {}] logits to {}", ids.len(), e.model.n_vocab(), a.out.display());
    Ok(())
}
