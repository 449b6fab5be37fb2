//! `strata generate`: prompt → streamed continuation on stdout, timings on stderr.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;

use crate::EngineError;
use crate::engine::{Description, Engine, TextStream};
use crate::sampler::{Sampler, SamplerConfig};
use crate::spec::{
    CpuMtpHead, MtpDrafter, MtpDrafterStats, MtpHead, SpecConfig, SpecStats, SuffixDrafter, generate_spec,
};
use model::qwen4exp::Mtp;

#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    /// Prompt text.
    #[arg(short = 'p', long, required_unless_present_any = ["tokens", "tokens_file"],
          conflicts_with_all = ["tokens", "tokens_file"])]
    pub prompt: Option<String>,
    /// Alternatively the prompt as token ids (used as given: no BOS added).
    #[command(flatten)]
    pub ids: super::token_ids::TokenIdsArgs,
    /// Maximum number of tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    pub n_predict: usize,
    /// Wrap the prompt in the model's chat template as a user turn (and parse special tokens).
    #[arg(long, conflicts_with_all = ["tokens", "tokens_file"])]
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
    let spec = e.opts.spec;
    let text = a.prompt.clone().unwrap_or_default();
    let prompt = if let Some(ids) = a.ids.read(e.model.n_vocab())? {
        ids
    } else if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(tokenizer::ChatMessage { role: "system".into(), content: s.clone() });
        }
        msgs.push(tokenizer::ChatMessage { role: "user".into(), content: text.clone() });
        let text = e.tokenizer.apply_chat_template(&msgs, true)?;
        chat_ids(e, &text)
    } else {
        e.encode(&text, false)
    };
    if prompt.is_empty() {
        bail!("{}", e.empty_prompt(&text));
    }
    if let Some(sc) = spec {
        return run_spec(e, a, &prompt, sc, cfg);
    }
    let mut sess = e.new_session()?;
    let mut sampler = Sampler::new(cfg);
    let mut stream = TextStream::default();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let t0 = Instant::now();
    let mut t_first: Option<Instant> = None;
    let mut io_err = None;
    let (ids, stop) = e.generate(&mut *sess, &prompt, a.n_predict, &mut sampler, |t| {
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
    report_expert_cache(e)?;
    if a.show_ids {
        eprintln!("ids: {ids:?}");
    }
    Ok(())
}

/// `generate --spec N`: speculative decoding (greedy, or sampled with `--temp > 0`: distributed
/// as plain sampling) with the suffix or MTP drafter; the text is printed once generation ends
/// (a window can emit several tokens at once), cut at the first end-of-generation token like
/// plain generation.
fn run_spec(e: &Engine, a: &GenerateArgs, prompt: &[u32], sc: SpecConfig, cfg: SamplerConfig) -> Result<()> {
    let sampled = if cfg.temperature > 0.0 { "sampled" } else { "greedy" };
    let run = spec_generate(e, prompt, a.n_predict, sc, cfg, e.opts.mtp.as_deref())?;
    let (ids, stats, dt) = (run.ids, run.stats, run.secs);
    let (ids, stop) = match ids.iter().position(|&t| e.tokenizer.is_eog(t)) {
        Some(i) => (&ids[..i], "Eog"),
        None => (&ids[..], "Length"),
    };
    let mut stream = TextStream::default();
    let mut text = String::new();
    for &t in ids {
        text.push_str(&stream.push(&e.tokenizer.token_to_bytes(t)));
    }
    text.push_str(&stream.finish());
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    eprintln!(
        "\n[{} prompt tokens; {} generated in {:.3}s; stop: {stop}; {sampled} spec ({} drafter): {} verify steps, {:.2} tokens/step, acceptance {:.1}% ({}/{} drafts)]",
        prompt.len(),
        ids.len(),
        dt,
        run.drafter,
        stats.verify_steps,
        stats.tokens_per_verify(),
        100.0 * stats.acceptance_rate(),
        stats.accepted,
        stats.drafted
    );
    report_expert_cache(e)?;
    if a.show_ids {
        eprintln!("ids: {ids:?}");
    }
    Ok(())
}

/// A speculative generation: ids, counters, seconds (prompt pass included, head loading not)
/// and which drafter ran.
pub struct SpecRun {
    pub ids: Vec<u32>,
    pub stats: SpecStats,
    pub secs: f64,
    /// `suffix` or `MTP`.
    pub drafter: &'static str,
    /// MTP drafter counters (with `--mtp`).
    pub mtp: Option<MtpDrafterStats>,
}

/// Speculative generation sampled with `cfg` (greedy at temperature 0) with the suffix drafter
/// or, given `mtp`, with the Flash-Next model's MTP head read from that path (see
/// [`suffix_generate`] / [`mtp_generate`]).
pub fn spec_generate(
    e: &Engine,
    prompt: &[u32],
    n: usize,
    sc: SpecConfig,
    cfg: SamplerConfig,
    mtp: Option<&Path>,
) -> Result<SpecRun> {
    if let Some(p) = mtp {
        return mtp_generate(e, prompt, n, sc, cfg, p);
    }
    let (ids, stats, secs) = suffix_generate(e, prompt, n, sc, cfg)?;
    Ok(SpecRun { ids, stats, secs, drafter: "suffix", mtp: None })
}

/// `--spec N --mtp PATH`: speculative generation (sampled with `cfg`) of `n` tokens after
/// `prompt` on a fresh Flash-Next sequence, drafted by the model's MTP head (loaded before the
/// clock starts; on a device the head runs there too, its cache sized like the engine's context
/// and typed `--kv`).
pub fn mtp_generate(
    e: &Engine,
    prompt: &[u32],
    n: usize,
    sc: SpecConfig,
    cfg: SamplerConfig,
    path: &Path,
) -> Result<SpecRun> {
    let needed = prompt.len() + n.saturating_sub(1);
    if needed > e.context_size() {
        return Err(EngineError::ContextFull { needed, capacity: e.context_size() }.into());
    }
    with_mtp_drafter(e, path, sc.min_p, |d| {
        let mut sess = e.new_session()?;
        let t0 = Instant::now();
        let (ids, stats) = generate_spec(&*e.model, &mut sess, prompt, n, &mut *d, sc, &mut Sampler::new(cfg))?;
        Ok(SpecRun { ids, stats, secs: t0.elapsed().as_secs_f64(), drafter: "MTP", mtp: Some(d.mtp_stats()) })
    })
}

/// A drafter of speculative decoding whose MTP counters can be read (the MTP drafter's own
/// type depends on where its head runs).
pub trait MtpDrafting: crate::spec::Drafter {
    fn mtp_stats(&self) -> MtpDrafterStats;
}

impl<H: MtpHead> MtpDrafting for MtpDrafter<H> {
    fn mtp_stats(&self) -> MtpDrafterStats {
        self.stats
    }
}

/// Runs `f` with the MTP drafter of the Flash-Next model `e` read from `path` (`--mtp`), its
/// head on the model's device (or the CPU), drafts cut below probability `min_p`. Errors
/// for a model of another architecture.
pub fn with_mtp_drafter<R>(
    e: &Engine,
    path: &Path,
    min_p: f32,
    f: impl FnOnce(&mut dyn MtpDrafting) -> Result<R>,
) -> Result<R> {
    let Description::Qwen4Exp(m) = e.model.description() else {
        bail!(
            "--mtp {}: MTP heads are read for Flash-Next (qwen4exp) models only; this model is {:?} (drop --mtp to use the suffix drafter)",
            path.display(),
            e.model.gguf().architecture().unwrap_or("?")
        );
    };
    let head = Mtp::open(m, path)?;
    #[cfg(feature = "gpu")]
    if let Some(g) = e.model.downcast_ref::<gpu_executor::qwen4exp::GpuQwen4Exp>() {
        use gpu_executor::qwen4exp::{GpuMtp, GpuMtpHead};
        let head = GpuMtp::new(g, head)?;
        let mut d = MtpDrafter::with_head(GpuMtpHead::new(&head, e.opts.kv, e.context_size())?, min_p);
        return f(&mut d);
    }
    let cpu_head = CpuMtpHead::with_numerics(m, &head, e.opts.kv, e.opts.numerics());
    f(&mut MtpDrafter::with_head(cpu_head, min_p))
}

/// Speculative generation (sampled with `cfg`) of `n` tokens after `prompt` on a fresh sequence
/// of either model family (EOG not handled: the caller cuts). Returns ids, counters and seconds.
fn suffix_generate(
    e: &Engine,
    prompt: &[u32],
    n: usize,
    sc: SpecConfig,
    cfg: SamplerConfig,
) -> Result<(Vec<u32>, SpecStats, f64)> {
    let needed = prompt.len() + n.saturating_sub(1);
    if needed > e.context_size() {
        return Err(EngineError::ContextFull { needed, capacity: e.context_size() }.into());
    }
    let mut drafter = SuffixDrafter::default();
    // The engine's own session, so every run option (--kv, --prefill, --ordered) applies.
    let mut sess = e.new_session()?;
    let t0 = Instant::now();
    let (ids, stats) = generate_spec(&*e.model, &mut sess, prompt, n, &mut drafter, sc, &mut Sampler::new(cfg))?;
    Ok((ids, stats, t0.elapsed().as_secs_f64()))
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

/// The GPU expert cache's counters after generation, and its profile when asked for.
fn report_expert_cache(e: &Engine) -> Result<()> {
    if let Some(line) = e.model.expert_cache_stats().map(|s| s.to_string()) {
        eprintln!("[{line}]");
    }
    if let Some(p) = &e.opts.expert_profile_save {
        if !e.model.save_expert_profile(p)? {
            anyhow::bail!(
                "--expert-profile-save {}: this model has no GPU expert cache (--device emu|hip, --expert-cache N below its expert count)",
                p.display()
            );
        }
        eprintln!("[expert profile written to {}]", p.display());
    }
    Ok(())
}
