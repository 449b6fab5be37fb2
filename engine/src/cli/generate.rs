//! `strata generate`: prompt → streamed continuation on stdout, timings on stderr.

use std::io::Write;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;

use crate::engine::{Engine, TextStream};
use crate::sampler::Sampler;

#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    /// Prompt text.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Maximum number of tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    pub n_predict: usize,
    /// Wrap the prompt in the model's chat template as a user turn (and parse special tokens).
    #[arg(long)]
    pub chat: bool,
    /// Optional system message (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Print the generated token ids to stderr at the end.
    #[arg(long)]
    pub show_ids: bool,
    #[command(flatten)]
    pub sampling: super::SamplingArgs,
}

pub fn run(e: &Engine, a: &GenerateArgs) -> Result<()> {
    if a.n_predict == 0 {
        bail!("-n must be >= 1");
    }
    let cfg = a.sampling.to_config()?;
    let prompt = if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(tokenizer::ChatMessage { role: "system".into(), content: s.clone() });
        }
        msgs.push(tokenizer::ChatMessage { role: "user".into(), content: a.prompt.clone() });
        let text = e.tokenizer.apply_chat_template(&msgs, true)?;
        chat_ids(e, &text)
    } else {
        e.encode(&a.prompt, false)
    };
    let mut sess = e.new_session();
    let mut sampler = Sampler::new(cfg);
    let mut stream = TextStream::default();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let t0 = Instant::now();
    let mut t_first: Option<Instant> = None;
    let mut io_err = None;
    let (ids, stop) = e.generate(&mut sess, &prompt, a.n_predict, &mut sampler, |t| {
        t_first.get_or_insert_with(Instant::now);
        let piece = stream.push(&e.tokenizer.token_to_bytes(t));
        match out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
            Ok(()) => true,
            Err(err) => {
                io_err = Some(err);
                false
            }
        }
    })?;
    let tail = stream.finish();
    writeln!(out, "{tail}")?;
    if let Some(err) = io_err {
        return Err(err.into());
    }
    let t_end = Instant::now();
    let tf = t_first.unwrap_or(t_end);
    let pp = (tf - t0).as_secs_f64();
    let tg = (t_end - tf).as_secs_f64();
    eprintln!(
        "\n[{} prompt tokens in {:.3}s = {:.1} tok/s; {} generated, {:.1} tok/s; stop: {:?}]",
        prompt.len(),
        pp,
        prompt.len() as f64 / pp.max(1e-9),
        ids.len(),
        ids.len().saturating_sub(1) as f64 / tg.max(1e-9),
        stop
    );
    if a.show_ids {
        eprintln!("ids: {ids:?}");
    }
    Ok(())
}

/// Tokenizes a rendered chat prompt: special tokens parsed; BOS added once (unless the
/// template already starts with it).
pub fn chat_ids(e: &Engine, text: &str) -> Vec<u32> {
    let mut ids = e.tokenizer.encode(text, false, true);
    if let Some(bos) = e.tokenizer.bos()
        && e.tokenizer.add_bos()
        && ids.first() != Some(&bos)
    {
        ids.insert(0, bos);
    }
    ids
}
