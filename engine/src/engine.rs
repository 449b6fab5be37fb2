//! The engine facade the commands and the server use: a model placed on its backend, its
//! tokenizer, and helpers to run sequences (prefill + sampled decode) on a [`Session`].
//!
//! Two model families (the shared decoder: gemma3, llama, qwen2, qwen3, qwen3moe; Flash-Next:
//! `qwen4exp`) on two backends sit behind one interface, `model::loaded`: the engine holds a
//! [`LoadedModel`] that [`gpu_executor::place`] put where the configuration says, and every
//! command runs on it without knowing which family or backend it is.

use std::path::Path;

use tokenizer::Tokenizer;

use crate::finite::{check_layers, check_logits, first_non_finite_layer};
pub use crate::run_options::RunOptions;
use crate::sampler::Sampler;
pub use crate::text_stream::TextStream;
pub use gpu_executor::Device;
use model::Decoder;
use model::Logits;
use model::error::{EngineError, Result};
pub use model::loaded::{Description, HostModel, HostWeights, LoadedModel, Numerics, Session, SessionConfig};
use model::qwen4exp::Qwen4Exp;

/// The KV capacity of a session: `--max-context`, or the model's training context for 0.
fn context_positions(max_context: usize, n_ctx_train: usize) -> usize {
    if max_context == 0 { n_ctx_train.max(1) } else { max_context }
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// An end-of-generation token was sampled (not included in the output).
    Eog,
    /// The requested number of tokens was produced.
    Length,
    /// The callback asked to stop.
    Callback,
}

/// A model on its backend with its tokenizer and the options its sessions run with.
pub struct Engine {
    /// The model on the backend placement chose; run it through [`Engine::eval`], which
    /// checks the logits.
    pub model: Box<dyn LoadedModel>,
    pub tokenizer: Tokenizer,
    pub opts: RunOptions,
    /// The GPU settings the model runs with on its device (placement's, [`gpu_executor::Placed`]);
    /// None on the CPU.
    pub gpu: Option<gpu_executor::GpuOptions>,
    /// The file given to [`Engine::load`].
    pub path: std::path::PathBuf,
}

/// Returns the heap's free pages to the OS (glibc keeps them otherwise, and they count in the
/// process's resident size).
fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Reads the model description `path` holds (either family, by `general.architecture`).
fn read_description(gguf: gguf::GgufFile, path: &Path, opts: &RunOptions) -> Result<HostModel> {
    if model::Arch::of(&gguf, path)? != model::Arch::Qwen4Exp {
        return Ok(HostModel::Decoder(Box::new(Decoder::from_gguf(gguf, path)?)));
    }
    let m = Qwen4Exp::from_gguf_with(gguf, &opts.ple).map_err(|e| e.in_file(path))?;
    Ok(HostModel::Qwen4Exp(Box::new(m)))
}

fn open_gguf(path: &Path) -> Result<gguf::GgufFile> {
    gguf::GgufFile::open(path).map_err(|source| EngineError::Gguf { path: path.to_path_buf(), source })
}

impl Engine {
    pub fn load(path: &Path, opts: RunOptions) -> Result<Engine> {
        let mut gguf = open_gguf(path)?;
        // Built before the model so that the metadata's copy of the vocabulary can go back to
        // the OS (peak RSS, issue 16: Gemma 3's is ~30 MB); its error is reported after the
        // model's (a file that is no model at all, e.g. an MTP head, says so first).
        let tokenizer = Tokenizer::from_gguf(&gguf);
        if tokenizer.is_ok() {
            gguf.release_arrays(&[
                "tokenizer.ggml.tokens",
                "tokenizer.ggml.scores",
                "tokenizer.ggml.token_type",
                "tokenizer.ggml.merges",
            ]);
            release_free_heap();
        }
        let host = read_description(gguf, path, &opts)?;
        let n_ctx_train = host.description().n_ctx_train();
        let placement = gpu_executor::Placement {
            path,
            device: opts.device,
            gpu: opts.gpu,
            ordered: opts.ordered_attention,
            kv: opts.kv,
            positions: context_positions(opts.max_context, n_ctx_train),
            prefill: opts.prefill,
            calibration: opts.calibration.as_deref(),
            expert_profile: opts.expert_profile.as_deref(),
        };
        let placed = gpu_executor::place(host, &placement, &|| read_description(open_gguf(path)?, path, &opts))?;
        let tokenizer = tokenizer.map_err(|source| EngineError::Tokenizer { path: path.to_path_buf(), source })?;
        let mut engine = Engine { model: placed.model, tokenizer, gpu: placed.gpu, opts, path: path.to_path_buf() };
        engine.place_host_weights();
        // As llama.cpp: one vocabulary. A tokenizer larger than the embedding makes ids the
        // model cannot take; a smaller one, ids the model samples that decode to nothing.
        if engine.tokenizer.vocab_size() != engine.model.n_vocab() {
            return Err(EngineError::VocabMismatch {
                tokenizer: engine.tokenizer.vocab_size(),
                tensor: "token_embd.weight",
                rows: engine.model.n_vocab(),
            });
        }
        let host_kv = engine.model.kv_in_host_memory();
        engine.session_plan().check(host_kv.then(experts::source::mem_available).flatten())?;
        Ok(engine)
    }

    /// KV capacity for new sessions.
    pub fn context_size(&self) -> usize {
        context_positions(self.opts.max_context, self.model.n_ctx_train())
    }

    /// What a session of the configured context needs (the memory plan, checked at load).
    pub fn session_plan(&self) -> crate::memory::SessionPlan {
        crate::memory::SessionPlan {
            positions: self.context_size(),
            from_training: self.opts.max_context == 0,
            kv: self.opts.kv,
            kv_per_position: self.model.kv_bytes_per_position(self.opts.kv),
        }
    }

    pub fn new_session(&self) -> Result<Box<dyn Session>> {
        self.new_session_with_capacity(self.context_size())
    }

    /// A session of the engine's options with room for `positions`.
    pub fn new_session_with_capacity(&self, positions: usize) -> Result<Box<dyn Session>> {
        self.model.new_session(&self.session_config(positions))
    }

    /// What the engine's sessions run with, sized for `positions`.
    pub fn session_config(&self, positions: usize) -> SessionConfig {
        SessionConfig {
            kv: self.opts.kv,
            max_ctx: positions,
            prefill_chunk: self.opts.prefill,
            numerics: self.opts.numerics(),
        }
    }

    /// Reads the routed experts the model computes on the CPU into RAM if they fit in
    /// `budget` bytes ([`crate::residency`]): every expert of a CPU model, the host copies an
    /// expert cache's misses read on a GPU; None when there are none (a dense model, or every
    /// expert resident in VRAM).
    pub fn read_experts_into_ram(&mut self, budget: Option<u64>) -> Option<crate::residency::Placement> {
        self.read_into_ram(HostWeights::Experts, budget)
    }

    /// Reads the other matrices a CPU model computes with (projections, routers, shared
    /// experts, the head) into RAM if they fit in `budget` bytes; None on a GPU (its copy is
    /// in VRAM).
    pub fn read_dense_into_ram(&mut self, budget: Option<u64>) -> Option<crate::residency::Placement> {
        self.read_into_ram(HostWeights::Dense, budget)
    }

    fn read_into_ram(&mut self, which: HostWeights, budget: Option<u64>) -> Option<crate::residency::Placement> {
        let mats = self.model.host_matrices(which);
        (!mats.is_empty()).then(|| crate::residency::read_into_ram(which, mats, budget))
    }

    /// At load: the dense weights, then the routed experts, into RAM as far as the available
    /// memory goes, unless `--mmap` / `--mmap-experts` keep them mapped; prints why any stay
    /// mapped.
    fn place_host_weights(&mut self) {
        if self.opts.mmap {
            return;
        }
        let mut budget = crate::residency::ram_budget();
        if let Some(p) = self.read_dense_into_ram(budget) {
            budget = budget.map(|b| b.saturating_sub(p.in_ram()));
            if let Some(msg) = p.message(HostWeights::Dense) {
                eprintln!("{msg}");
            }
        }
        if !self.opts.mmap_experts
            && let Some(msg) = self.read_experts_into_ram(budget).and_then(|p| p.message(HostWeights::Experts))
        {
            eprintln!("{msg}");
        }
    }

    /// Appends `tokens` to the sequence and writes logits to `out` ([`LoadedModel::eval`]).
    ///
    /// Logits that are not all finite are an error ([`EngineError::NonFinite`], naming the
    /// position): NaN weights or metadata otherwise make greedy sampling pick token 0 forever.
    /// With `STRATA_CHECK_FINITE=1`, a session that can trace runs chunk by chunk with its
    /// per-layer trace on, and the error names the first layer whose output held a NaN or
    /// infinity (slower: the residual stream is copied after every layer).
    pub fn eval(&self, s: &mut dyn Session, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()> {
        let pos0 = s.n_past();
        if check_layers()
            && let Some(chunk) = s.trace_chunk()
        {
            return self.eval_checked(s, chunk, tokens, want, out);
        }
        self.model.eval(s, tokens, want, out)?;
        check_logits(out, self.model.n_vocab(), pos0, tokens, want)
    }

    /// [`Engine::eval`] with the per-layer scan (`STRATA_CHECK_FINITE=1`).
    fn eval_checked(
        &self,
        s: &mut dyn Session,
        chunk: usize,
        tokens: &[u32],
        want: Logits,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        out.clear();
        let mut piece_out = Vec::new();
        let n_pieces = tokens.len().div_ceil(chunk);
        for (i, piece) in tokens.chunks(chunk).enumerate() {
            let pos = s.n_past();
            s.set_trace(Some(Vec::new()));
            let r = self.model.eval(s, piece, want, &mut piece_out);
            let trace = s.set_trace(None).unwrap_or_default();
            r?;
            if let Some((layer, row, count, of)) = first_non_finite_layer(&trace, piece.len()) {
                return Err(EngineError::NonFinite {
                    position: pos + row,
                    token: piece[row],
                    layer: Some(layer),
                    count,
                    of,
                });
            }
            check_logits(&piece_out, self.model.n_vocab(), pos, piece, want)?;
            if want == Logits::All || i + 1 == n_pieces {
                out.extend_from_slice(&piece_out);
            }
        }
        Ok(())
    }

    /// Encodes a prompt the way llama.cpp's examples do (BOS per the model, no special parsing
    /// unless asked).
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        self.tokenizer.encode(text, self.tokenizer.add_bos(), parse_special)
    }

    /// Why `text` encoded to no tokens at all, for the error a user sees.
    pub fn empty_prompt(&self, text: &str) -> String {
        let bos = if self.tokenizer.add_bos() { "" } else { " and this model adds no BOS token" };
        if text.is_empty() {
            format!("the prompt is empty{bos}: nothing to evaluate (give some text, or token ids with --tokens)")
        } else {
            format!(
                "the prompt {text:?} encodes to no tokens (none of its bytes is in the vocabulary){bos}: nothing to evaluate"
            )
        }
    }

    /// Evaluates `prompt` on a fresh session state and samples up to `n` tokens, calling
    /// `on_token` for each (return false to stop). Returns the tokens and why it stopped.
    pub fn generate(
        &self,
        sess: &mut dyn Session,
        prompt: &[u32],
        n: usize,
        sampler: &mut Sampler,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, Stop)> {
        let needed = sess.n_past() + prompt.len() + n.saturating_sub(1);
        if needed > sess.capacity() {
            return Err(EngineError::ContextFull { needed, capacity: sess.capacity() });
        }
        let mut logits = Vec::new();
        self.eval(sess, prompt, Logits::Last, &mut logits)?;
        for &t in prompt {
            sampler.accept(t);
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let t = sampler.sample(&logits);
            if self.tokenizer.is_eog(t) {
                return Ok((out, Stop::Eog));
            }
            sampler.accept(t);
            out.push(t);
            if !on_token(t) {
                return Ok((out, Stop::Callback));
            }
            if out.len() < n {
                self.eval(sess, &[t], Logits::Last, &mut logits)?;
            }
        }
        Ok((out, Stop::Length))
    }
}
