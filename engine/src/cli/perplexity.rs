//! `strata perplexity`: exp(mean negative log-likelihood) of a text file.
//!
//! The text is tokenized with BOS; it is cut into windows of `--ctx` tokens, each starting with
//! BOS followed by the next `ctx - 1` text tokens, and every position of a window after the
//! first predicts the next token (the same definition as testdata/reference's `perplexity`).
//! `--tokens-file` gives the text's ids instead (the BOS of each window is still added).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::engine::Engine;
use model::Logits;

#[derive(Args, Debug, Clone)]
pub struct PerplexityArgs {
    /// Text file to score.
    #[arg(short = 'f', long, required_unless_present = "tokens_file", conflicts_with = "tokens_file")]
    pub file: Option<PathBuf>,
    /// Alternatively the text's token ids (decimal, separated by commas, spaces or newlines;
    /// no BOS: each window gets its own).
    #[arg(long, value_name = "FILE")]
    pub tokens_file: Option<PathBuf>,
    /// Window size in tokens (BOS included).
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Score at most this many windows (0 = all).
    #[arg(long, default_value_t = 0)]
    pub max_windows: usize,
}

/// Result of a perplexity run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Perplexity {
    pub ppl: f64,
    pub n_scored: usize,
    pub n_windows: usize,
}

/// Scores `text` (see the module doc).
pub fn perplexity(e: &Engine, text: &str, ctx: usize, max_windows: usize) -> Result<Perplexity> {
    perplexity_of_ids(e, e.tokenizer.encode(text, false, false), ctx, max_windows)
}

/// Scores a text given as its token ids (no BOS: each window gets its own).
pub fn perplexity_of_ids(e: &Engine, mut ids: Vec<u32>, ctx: usize, max_windows: usize) -> Result<Perplexity> {
    if ctx < 2 {
        bail!("--ctx must be >= 2");
    }
    let bos = e.tokenizer.bos();
    let body = ctx - bos.is_some() as usize;
    if ids.len() < 2 {
        bail!("text has fewer than 2 tokens");
    }
    let mut sess = e.new_session_with_capacity(ctx)?;
    let mut logits = Vec::new();
    let mut window = Vec::with_capacity(ctx);
    let (mut nll, mut n_scored, mut n_windows) = (0f64, 0usize, 0usize);
    let nv = e.model.n_vocab();
    let chunks: Vec<Vec<u32>> = std::mem::take(&mut ids).chunks(body).map(|c| c.to_vec()).collect();
    for c in &chunks {
        if max_windows > 0 && n_windows == max_windows {
            break;
        }
        window.clear();
        window.extend(bos);
        window.extend_from_slice(c);
        if window.len() < 2 {
            continue;
        }
        sess.reset();
        e.eval(&mut *sess, &window, Logits::All, &mut logits)?;
        for i in 0..window.len() - 1 {
            let row = &logits[i * nv..(i + 1) * nv];
            let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let lse = m + row.iter().map(|&x| ((x as f64) - m).exp()).sum::<f64>().ln();
            nll += lse - row[window[i + 1] as usize] as f64;
            n_scored += 1;
        }
        n_windows += 1;
    }
    Ok(Perplexity { ppl: (nll / n_scored as f64).exp(), n_scored, n_windows })
}

pub fn run(e: &Engine, a: &PerplexityArgs) -> Result<()> {
    let p = match (&a.file, &a.tokens_file) {
        (_, Some(ids)) => {
            perplexity_of_ids(e, super::token_ids::read_token_file(ids, e.model.n_vocab())?, a.ctx, a.max_windows)?
        }
        (Some(f), None) => {
            let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            perplexity(e, &text, a.ctx, a.max_windows)?
        }
        (None, None) => bail!("give the text to score: -f FILE or --tokens-file FILE"),
    };
    println!("perplexity: {:.4} ({} tokens scored in {} windows of <= {})", p.ppl, p.n_scored, p.n_windows, a.ctx);
    Ok(())
}
