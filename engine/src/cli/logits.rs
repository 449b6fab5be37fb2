//! `strata logits`: logits of every position of a token sequence → float32 .npy
//! `[positions, vocab]`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::engine::Engine;
use model::Logits;

#[derive(Args, Debug, Clone)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub ids: super::token_ids::TokenIdsArgs,
    /// Alternatively a text, tokenized like `generate` does (BOS per the model).
    #[arg(short = 'p', long, conflicts_with_all = ["tokens", "tokens_file"])]
    pub prompt: Option<String>,
    /// Output file (.npy, float32, shape [positions, vocab]).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(e: &Engine, a: &LogitsArgs) -> Result<()> {
    let ids = match (&a.prompt, a.ids.read(e.model.n_vocab())?) {
        (Some(p), _) => e.encode(p, false),
        (None, Some(ids)) => ids,
        (None, None) => bail!("no tokens given (--tokens, --tokens-file or --prompt)"),
    };
    if ids.is_empty() {
        bail!("{}", e.empty_prompt(a.prompt.as_deref().unwrap_or_default()));
    }
    let mut sess = e.new_session()?;
    let mut logits = Vec::new();
    e.eval(&mut *sess, &ids, Logits::All, &mut logits)?;
    crate::npy::write_f32(&a.out, &[ids.len(), e.model.n_vocab()], &logits)
        .with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!("wrote [{}, {}] logits to {}", ids.len(), e.model.n_vocab(), a.out.display());
    Ok(())
}
