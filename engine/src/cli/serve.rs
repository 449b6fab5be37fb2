//! `strata --serve` (the line-based token protocol on stdin/stdout, see the `server` crate's
//! docs/serve-protocol.md) and `strata server` (the OpenAI-compatible HTTP server, which
//! starts `strata --serve` as its engine process).

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use server::{FinishReason, GenerateRequest, ModelInfo, TokenEngine};

use crate::EngineError;
use crate::engine::Engine;
use crate::prompt_reuse::PromptReuse;
use crate::sampler::{Sampler, SamplerConfig};
use crate::spec::{Drafter, SpecConfig, SpecStats, SuffixDrafter, stream_spec};
use model::Logits;

/// The engine behind the token protocol: one sequence at a time, the session reused.
pub struct ServeEngine<'e> {
    e: &'e Engine,
    sess: Box<dyn crate::engine::Session>,
    logits: Vec<f32>,
    /// Expert-cache (hits, lookups) when the running request started.
    cache_at_start: Option<experts::counters::CacheStats>,
    /// `--spec`: the drafter every request is decoded with (reset for each), and the running
    /// request's draft counters.
    spec: Option<(SpecConfig, &'e mut dyn Drafter)>,
    drafts: Option<SpecStats>,
    /// What the session keeps of the previous request, and how many of the running request's
    /// prompt tokens it did not have to compute.
    reuse: PromptReuse,
    cached_tokens: usize,
}

impl<'e> ServeEngine<'e> {
    pub fn new(e: &'e Engine) -> model::error::Result<Self> {
        Ok(ServeEngine {
            e,
            sess: e.new_session()?,
            logits: Vec::new(),
            cache_at_start: None,
            spec: None,
            drafts: None,
            reuse: PromptReuse::default(),
            cached_tokens: 0,
        })
    }

    /// Every request decodes speculatively with `drafter` (`--spec`).
    pub fn with_spec(self, cfg: SpecConfig, drafter: &'e mut dyn Drafter) -> Self {
        ServeEngine { spec: Some((cfg, drafter)), ..self }
    }

    /// A request (greedy or sampled) with the drafter: verify windows of drafts, each token
    /// emitted as soon as it is decided ([`stream_spec`]). Greedy output equals plain greedy
    /// decoding token for token; sampled output is distributed as plain sampling (its seeded
    /// tokens differ: the acceptance tests draw from the same RNG). `None` without `--spec`.
    fn generate_spec(
        &mut self,
        req: &GenerateRequest,
        emit: &mut dyn FnMut(u32) -> bool,
    ) -> Option<Result<FinishReason, String>> {
        let (sc, drafter) = self.spec.as_mut()?;
        drafter.reset();
        let mut sampler = Sampler::new(sampler_config(&req.sampling));
        let (e, sess) = (self.e, &mut self.sess);
        // As plain decoding: the prompt's positions, then one more per token but the last.
        let n_gen = sess.capacity() + 1 - req.tokens.len();
        let mut stopped = false;
        let r = stream_spec(&*e.model, sess, &req.tokens, n_gen, &mut **drafter, *sc, &mut sampler, &mut |t| {
            stopped = !emit(t);
            !stopped
        });
        Some(r.map_err(|e| e.to_string()).map(|stats| {
            self.drafts = Some(stats);
            if stopped { FinishReason::Stop } else { FinishReason::Length }
        }))
    }
}

impl ServeEngine<'_> {
    /// One request without drafts: the prompt after what the session already holds
    /// ([`PromptReuse`]), then one token per step.
    fn generate_plain(
        &mut self,
        req: &GenerateRequest,
        emit: &mut dyn FnMut(u32) -> bool,
    ) -> Result<FinishReason, String> {
        let (e, sess, reuse) = (self.e, &mut *self.sess, &mut self.reuse);
        let err = |e: EngineError| e.to_string();
        let kept = reuse.resume(&*e.model, sess, &req.tokens).map_err(err)?;
        self.cached_tokens = kept;
        e.eval(sess, &req.tokens[kept..], Logits::Last, &mut self.logits).map_err(err)?;
        reuse.consumed(&req.tokens[kept..]);
        let mut sampler = Sampler::new(sampler_config(&req.sampling));
        for &t in &req.tokens {
            sampler.accept(t);
        }
        loop {
            let t = sampler.sample(&self.logits);
            sampler.accept(t);
            if !emit(t) {
                return Ok(FinishReason::Stop);
            }
            if sess.n_past() >= sess.capacity() {
                return Ok(FinishReason::Length);
            }
            e.eval(sess, &[t], Logits::Last, &mut self.logits).map_err(err)?;
            reuse.consumed(&[t]);
        }
    }
}

/// Protocol sampling parameters → our sampler config (seed from the clock when absent).
pub fn sampler_config(p: &server::SamplingParams) -> SamplerConfig {
    SamplerConfig {
        temperature: p.temperature,
        top_k: p.top_k as usize,
        top_p: if p.top_p > 0.0 { p.top_p.min(1.0) } else { 1.0 },
        min_p: p.min_p.clamp(0.0, 1.0),
        repeat_penalty: if p.repeat_penalty > 0.0 { p.repeat_penalty } else { 1.0 },
        repeat_last_n: p.repeat_last_n as usize,
        seed: p
            .seed
            .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)),
    }
}

impl TokenEngine for ServeEngine<'_> {
    fn info(&self) -> ModelInfo {
        let m = &self.e.model;
        let name =
            m.gguf().get_str("general.name").map(str::to_string).unwrap_or_else(|_| {
                self.e.path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
            });
        let eog_tokens = (0..m.n_vocab() as u32).filter(|&t| self.e.tokenizer.is_eog(t)).collect();
        let o = &self.e.opts;
        let engine = serde_json::json!({
            "backend": m.backend(),
            "device": o.device,
            "kv": o.kv,
            "max_context": o.max_context,
            "prefill": o.prefill,
            "ordered": o.ordered_attention,
            "cpu_gemm": if o.cpu_tiles { "tiles" } else { "llama" },
            "mmap": o.mmap,
            "mmap_experts": o.mmap_experts,
            "threads": rayon::current_num_threads(),
            // The device's options as the model runs with them (null on the CPU).
            "gpu": self.e.gpu,
            "model_path": self.e.path,
        });
        ModelInfo {
            name,
            vocab_size: m.n_vocab() as u32,
            context_length: self.sess.capacity() as u32,
            eog_tokens,
            parallel: 1,
            engine: Some(engine),
        }
    }

    fn generate(&mut self, req: &GenerateRequest, emit: &mut dyn FnMut(u32) -> bool) -> Result<FinishReason, String> {
        self.cache_at_start = self.e.model.expert_cache_stats();
        self.drafts = None;
        self.cached_tokens = 0;
        if req.tokens.len() > self.sess.capacity() {
            let capacity = self.sess.capacity();
            return Err(EngineError::ContextFull { needed: req.tokens.len(), capacity }.to_string());
        }
        if req.tokens.is_empty() {
            return Err("the request has no prompt tokens".into());
        }
        if self.spec.is_some() {
            // The speculative loop runs its own checkpoints and rollbacks, and its drafter
            // follows the sequence from position 0: it starts from scratch (no reuse yet).
            self.reuse.forget(&mut *self.sess);
            let r = self.generate_spec(req, emit);
            self.reuse.forget(&mut *self.sess);
            return r.expect("--spec is set");
        }
        let r = self.generate_plain(req, emit);
        match r {
            Ok(_) => self.reuse.finish(&*self.e.model, &*self.sess),
            Err(_) => self.reuse.forget(&mut *self.sess),
        }
        r
    }

    /// The request's counters: prompt tokens reused, drafts, and the expert cache's (GPU with
    /// `--expert-cache`).
    fn request_stats(&mut self) -> Option<server::protocol::RequestStats> {
        let mut stats = server::protocol::RequestStats {
            prompt_cached_tokens: Some(self.cached_tokens as u64),
            draft_accepted: self.drafts.map(|d| d.accepted),
            draft_offered: self.drafts.map(|d| d.drafted),
            ..Default::default()
        };
        if let (Some(a), Some(b)) = (self.cache_at_start, self.e.model.expert_cache_stats()) {
            let us = |ms: f64| (ms * 1e3).round().max(0.0) as u64;
            stats.expert_cache_hits = Some(b.hits - a.hits);
            stats.expert_cache_lookups = Some(b.lookups - a.lookups);
            stats.expert_bytes_to_vram = Some(b.copied_bytes - a.copied_bytes);
            stats.expert_bytes_read_over_pcie = Some(b.pcie_read_bytes - a.pcie_read_bytes);
            stats.expert_cpu_us = Some(us(b.cpu_ms - a.cpu_ms));
            stats.expert_handoff_wait_us = Some(us(b.handoff_wait_ms - a.handoff_wait_ms));
        }
        Some(stats)
    }
}

/// `strata --serve`: protocol on stdin/stdout until stdin closes. With `--spec N` every
/// request (greedy or sampled) decodes speculatively, drafted by the MTP head (`--mtp`) or the suffix drafter.
pub fn serve_stdio(e: &Engine) -> Result<()> {
    // serve_loop reads its input on another thread, so it needs an owned (Send) reader.
    let run = |se: &mut ServeEngine<'_>| {
        let stdin = std::io::BufReader::new(std::io::stdin());
        server::serve_loop(se, stdin, std::io::stdout().lock()).context("token protocol")
    };
    match (e.opts.spec, &e.opts.mtp) {
        (None, _) => run(&mut ServeEngine::new(e)?),
        (Some(sc), None) => run(&mut ServeEngine::new(e)?.with_spec(sc, &mut SuffixDrafter::default())),
        (Some(sc), Some(path)) => super::generate::with_mtp_drafter(e, path, sc.min_p, |d| {
            run(&mut ServeEngine::new(e)?.with_spec(sc, &mut *d))
        }),
    }
}

/// `strata server`: the HTTP server; its engine process is this executable with `--serve`.
///
/// Unless the engine command is configured explicitly (`--engine-arg`, or `engine.args` in the
/// config file), the engine process gets this command's whole engine configuration
/// (`--engine-config`, with the model resolved: the one given, or the default model) and the
/// server uses that model's tokenizer.
pub fn run_http(args: &super::CommonArgs, common: &super::Common, mut cfg: server::ServerConfig) -> Result<()> {
    let file_sets_engine = match &cfg.config {
        Some(p) => server::config::ServerConfig::from_file(p)?.engine.args.is_some(),
        None => false,
    };
    if cfg.engine.args.is_none() && !file_sets_engine {
        let m = match &common.model {
            Some(m) => m.clone(),
            None => crate::fetch::default_model(true)?,
        };
        let child = super::CommonArgs { model: Some(m.clone()), engine_config: None, ..args.clone() };
        let json = serde_json::to_string(&child).context("serialising the engine configuration")?;
        cfg.engine.args = Some(vec!["--engine-config".into(), json]);
        cfg.tokenizer.get_or_insert(m);
    } else if *args != (super::CommonArgs { model: args.model.clone(), ..Default::default() }) {
        eprintln!(
            "strata server: the engine command is configured explicitly (engine args), so the engine options given here do not reach it"
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    rt.block_on(server::run_server(cfg))
}
