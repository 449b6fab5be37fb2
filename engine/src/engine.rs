//! The engine facade the commands and the server use: a model placed on its backend, its
//! tokenizer, and helpers to run sequences (prefill + sampled decode) on a [`Session`].
//!
//! Two model families (the shared decoder: gemma3, llama, qwen2, qwen3, qwen3moe; Flash-Next:
//! `qwen4exp`) on two backends sit behind one interface, `model::loaded`: the engine holds a
//! [`LoadedModel`] that [`gpu_executor::place`] put where the configuration says, and every
//! command runs on it without knowing which family or backend it is.

use std::path::Path;

use tokenizer::Tokenizer;

use crate::sampler::Sampler;
pub use gpu_executor::Device;
use model::Decoder;
use model::KvType;
use model::Logits;
use model::error::{EngineError, Result};
pub use model::loaded::{Description, HostModel, HostWeights, LoadedModel, Numerics, Session, SessionConfig};
use model::qwen4exp::{PleOptions, Qwen4Exp};

/// How sessions are built (from the validated CLI config).
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Backend of the shared-decoder models (Flash-Next runs on the CPU).
    pub device: Device,
    /// Ordered-numerics mode on both backends (`--ordered`, alias `--ordered-attention`): the
    /// CPU session runs `Session::ordered` (ordered attention, the `quant` crate's scalar
    /// matmul, fmath activations) and the GPU `GpuOptions::ordered`, so `--device cpu` and
    /// `--device emu|hip` compute whole layers and logits bit for bit alike.
    pub ordered_attention: bool,
    /// `--cpu-gemm tiles`: the CPU executor's prompt products through exact-block row tiles
    /// (`Numerics::Tiles`; GPU backends ignore it).
    pub cpu_tiles: bool,
    pub kv: KvType,
    /// KV capacity in positions (0: the model's training context).
    pub max_context: usize,
    /// Tokens per prefill chunk.
    pub prefill: usize,
    /// PLE table options (Flash-Next models only).
    pub ple: PleOptions,
    /// hipBLASLt calibration table for the GPU backends (`--calibration`); None: the default
    /// location for the device (`gpu::calibrate::default_path`) when such a file exists.
    pub calibration: Option<std::path::PathBuf>,
    /// STRP profile that fills the GPU expert cache at start (`--expert-profile`).
    pub expert_profile: Option<std::path::PathBuf>,
    /// Where `generate` writes this run's routing counts (`--expert-profile-save`).
    pub expert_profile_save: Option<std::path::PathBuf>,
    /// GPU backend settings (`--gpu-*` flags / `STRATA_GPU_*`); `ordered` is set from
    /// `ordered_attention` at load.
    pub gpu: gpu_executor::options::GpuOptions,
    /// `--mmap`: leave every weight memory-mapped (as llama.cpp does by default) instead of
    /// reading the ones the CPU computes with into RAM at load ([`crate::residency`]).
    pub mmap: bool,
    /// `--mmap-experts`: the same for the routed experts only.
    pub mmap_experts: bool,
}

impl RunOptions {
    /// The numerics mode of these options' sessions.
    pub fn numerics(&self) -> Numerics {
        Numerics::of(self.ordered_attention, self.cpu_tiles)
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            device: Device::Cpu,
            ordered_attention: false,
            cpu_tiles: false,
            kv: KvType::F16,
            max_context: 4096,
            prefill: 512,
            ple: PleOptions::default(),
            calibration: None,
            expert_profile: None,
            expert_profile_save: None,
            gpu: Default::default(),
            mmap: false,
            mmap_experts: false,
        }
    }
}

/// `STRATA_CHECK_FINITE=1`: scan the residual stream after every layer (read once).
fn check_layers() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("STRATA_CHECK_FINITE").is_ok_and(|v| v == "1"))
}

/// The first row of `logits` (rows of `n_vocab`; the last token's row for `Logits::Last`)
/// holding a NaN or an infinity is an error naming its position and token.
fn check_logits(logits: &[f32], n_vocab: usize, pos0: usize, tokens: &[u32], want: Logits) -> Result<()> {
    if n_vocab == 0 || logits.iter().all(|x| x.is_finite()) {
        return Ok(());
    }
    let first_row = if want == Logits::All { 0 } else { tokens.len().saturating_sub(1) };
    for (r, row) in logits.chunks(n_vocab).enumerate() {
        let count = row.iter().filter(|x| !x.is_finite()).count();
        if count > 0 {
            let i = (first_row + r).min(tokens.len().saturating_sub(1));
            return Err(EngineError::NonFinite {
                position: pos0 + i,
                token: tokens.get(i).copied().unwrap_or(0),
                layer: None,
                count,
                of: row.len(),
            });
        }
    }
    Ok(())
}

/// In a per-layer trace (`[layer][tokens * n_embd]`), the first layer holding a non-finite
/// value: (layer, token row, non-finite values in that row, row width).
fn first_non_finite_layer(trace: &[Vec<f32>], n_tokens: usize) -> Option<(usize, usize, usize, usize)> {
    trace.iter().enumerate().find_map(|(layer, x)| {
        let d = x.len() / n_tokens.max(1);
        if d == 0 {
            return None;
        }
        x.chunks(d).enumerate().find_map(|(row, v)| {
            let count = v.iter().filter(|x| !x.is_finite()).count();
            (count > 0).then_some((layer, row, count, d))
        })
    })
}

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
    Ok(HostModel::FlashNext(Box::new(m)))
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
        let n_ctx_train = match host.description() {
            Description::Decoder(m) => m.hp.n_ctx_train,
            Description::FlashNext(m) => m.hp.n_ctx_train,
        };
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
            let piece_want = if want == Logits::All { Logits::All } else { Logits::Last };
            let r = self.model.eval(s, piece, piece_want, &mut piece_out);
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

/// Turns a stream of token byte strings into valid UTF-8 text pieces, holding back incomplete
/// multi-byte sequences (byte-fallback tokens split characters).
#[derive(Default)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    /// Adds bytes; returns the longest complete UTF-8 prefix (invalid bytes become U+FFFD).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..good]).expect("validated prefix"));
                    match e.error_len() {
                        // Incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is left (lossy).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::TextStream;

    #[test]
    fn text_stream_holds_split_characters() {
        let mut t = TextStream::default();
        let e = "é".as_bytes();
        assert_eq!(t.push(&e[..1]), "");
        assert_eq!(t.push(&e[1..]), "é");
        assert_eq!(t.push(b"a\xffb"), "a\u{FFFD}b");
    }
}
