//! `strata synth`: writes a small random-weight Flash-Next (`qwen4exp`) model, and optionally
//! its MTP draft head, with [`synth::qwen4exp`] (for tests, benchmarks, demos).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use quant::GgmlType;

use synth::qwen4exp::{SynthConfig, SynthMtp, write, write_mtp};

#[derive(Args, Debug, Clone)]
pub struct SynthArgs {
    /// Output prefix: writes PREFIX.gguf (or PREFIX-0000K-of-00002.gguf with --split-ple) and,
    /// with --mtp-head, PREFIX-mtp.gguf.
    #[arg(long)]
    pub out: PathBuf,
    /// Shape: `public` (the llama.cpp fixtures' shape: 4 layers, hidden 256, vocab 1024),
    /// `tiny` (4 layers G/QSA/dense/G, hidden 128, vocab 300: fastest), or `flash-next`
    /// (Flash-Next's dimensions, one GDN and one QSA layer, IQ3_XXS gate/up and IQ4_NL down
    /// experts as random blocks, tied Q8_0 vocabulary: a 3.1 GB file for `strata bench --device
    /// emu` cost counts).
    #[arg(long, value_enum, default_value_t = Preset::Public)]
    pub preset: Preset,
    /// Type of the big matrices [default: f32; q8_0 for `flash-next`].
    #[arg(long = "type", value_enum)]
    pub ty: Option<MatType>,
    /// Tie the output head to the token embedding (no output.weight). Tied synthetic models
    /// settle into repeating a token, so drafters get accepted.
    #[arg(long)]
    pub tied: bool,
    /// Put the PLE table in a second shard, as the release does.
    #[arg(long)]
    pub split_ple: bool,
    /// Random seed of the weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write an MTP (NextN) draft head: `random`, or `echo` (a head whose drafts repeat
    /// its input token; see the model writer's docs).
    /// (`--mtp` itself is the engine's option: the head a speculative run drafts with.)
    #[arg(long, value_enum)]
    pub mtp_head: Option<MtpKind>,
    /// Type of the MTP head's matrices (default: --type).
    #[arg(long, value_enum)]
    pub mtp_type: Option<MatType>,
    /// Compress ratio recorded for the MTP block; > 0 also writes its `indexer.*` tensors, as
    /// the published heads carry them (the head attends densely either way).
    #[arg(long, default_value_t = 0)]
    pub mtp_ratio: usize,
    /// Omit the head's own output mixer (`nextn.hc_head_*`): the model's `output_hc_*` is used.
    /// Not with `--mtp-head echo`.
    #[arg(long)]
    pub mtp_no_hc_head: bool,
    /// Give the MTP head its own embedding and output tables (nextn.embed_tokens,
    /// nextn.shared_head_head) instead of sharing the model's.
    #[arg(long)]
    pub mtp_own_tables: bool,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    Public,
    Tiny,
    FlashNext,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatType {
    F32,
    F16,
    #[value(name = "q8_0")]
    Q8_0,
}

impl MatType {
    fn ggml(self) -> GgmlType {
        match self {
            MatType::F32 => GgmlType::F32,
            MatType::F16 => GgmlType::F16,
            MatType::Q8_0 => GgmlType::Q8_0,
        }
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MtpKind {
    Random,
    Echo,
}

pub fn run(a: &SynthArgs) -> Result<()> {
    let mut cfg = match a.preset {
        Preset::Public => SynthConfig::public(),
        Preset::Tiny => SynthConfig::tiny(),
        Preset::FlashNext => SynthConfig::qwen4exp(),
    };
    if let Some(t) = a.ty {
        cfg.matrix_type = t.ggml();
    }
    cfg.tied |= a.tied;
    if a.mtp_ratio > 64 {
        anyhow::bail!("--mtp-ratio must be in 0..=64 (got {})", a.mtp_ratio);
    }
    if let Some(dir) = a.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if a.preset == Preset::FlashNext {
        eprintln!("writing Flash-Next's dimensions (3.1 GB; about 30 s and 6 GB of RAM)...");
    }
    let paths = write(&cfg, a.seed, &a.out, a.split_ple).with_context(|| format!("writing {}", a.out.display()))?;
    for p in &paths {
        println!("{}", p.display());
    }
    if let Some(kind) = a.mtp_head {
        let m = SynthMtp {
            matrix_type: a.mtp_type.or(a.ty).map_or(cfg.matrix_type, MatType::ggml),
            ratio: a.mtp_ratio,
            own_tables: a.mtp_own_tables,
            hc_head: !a.mtp_no_hc_head,
            echo: kind == MtpKind::Echo,
        };
        let path = PathBuf::from(format!("{}-mtp.gguf", a.out.display()));
        write_mtp(&cfg, &m, a.seed, &path).with_context(|| format!("writing {}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(())
}
