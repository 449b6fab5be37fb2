//! The GPU backend's settings: part of the engine configuration (`cli::CommonArgs`, so they are
//! flags, `--engine-config` JSON fields and `STRATA_GPU_*` environment overrides at once, all
//! parsed by clap in one place) and read by `gpu::model::GpuModel`. Plain data, compiled with or
//! without the `gpu` feature, so a CPU-only build accepts and forwards the same configuration.
//! [`Device`], the one device enum (`--device`), lives here too: the configuration, the engine
//! and the GPU executor all read it.

use clap::builder::BoolishValueParser;

/// Where the forward pass runs (`--device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// A usable AMD gfx11 GPU through HIP when one is present, otherwise the CPU (saying why
    /// when a ROCm runtime was found but could not be used).
    #[default]
    Auto,
    /// The CPU backend.
    Cpu,
    /// An AMD gfx11 GPU through ROCm's HIP runtime (loaded at run time); an error if none.
    Hip,
    /// The software RDNA3 device running the same gfx1100 kernels (slow: tests, debugging,
    /// instruction and byte counts).
    Emu,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Auto => "auto",
            Device::Cpu => "cpu",
            Device::Hip => "hip",
            Device::Emu => "emu",
        }
    }
}

/// Shortest prompt chunk the `Auto` prefill rule sends to the dequantize + GEMM path.
pub const GEMM_MIN_TOKENS: usize = 32;

/// Options of the GPU backend (`--device hip|emu`).
#[derive(Clone, Copy, Debug, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "GPU backend (--device hip|emu)")]
pub struct GpuOptions {
    /// Attention numerics on the device: ordered (bit-identical to the CPU's ordered
    /// attention) or fast (WMMA f16 tiles, within a tolerance).
    #[arg(id = "gpu_attn", long = "gpu-attn", value_enum, ignore_case = true, global = true, env = "STRATA_GPU_ATTN", default_value_t = AttnMode::Ordered)]
    pub attn: AttnMode,
    /// Capture each decode window's launches once per window size and replay the graph with
    /// new inputs in device buffers (MoE models: the windows whose experts run by device
    /// dispatch, see --gpu-moe).
    #[arg(id = "gpu_graphs", long = "gpu-graphs", global = true, env = "STRATA_GPU_GRAPHS", value_name = "on|off", default_value = "on", action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub graphs: bool,
    /// How quantized projections of prompt chunks longer than a window run: auto (MMVQ below
    /// 32 tokens, from 32 dequantize + one GEMM), mmvq, gemm or mmq (LDS-tiled int8 kernels).
    #[arg(id = "gpu_prefill", long = "gpu-prefill", value_enum, ignore_case = true, global = true, env = "STRATA_GPU_PREFILL", default_value_t = PrefillPath::Auto)]
    pub prefill: PrefillPath,
    /// Dense FFNs in decode/verify windows (and the MoE device path): one fused gate/up MMVQ +
    /// GLU launch instead of three (bit-identical).
    #[arg(id = "gpu_fused_glu", long = "gpu-fused-glu", global = true, env = "STRATA_GPU_FUSED_GLU", value_name = "on|off", default_value = "on", action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub fused_glu: bool,
    /// Ordered-numerics mode: every matrix product runs `quantize_ref` + `mmv_ordered` (the
    /// `quant` crate's reference quantizer and `vec_dot`, one work-item per output) on the
    /// weights as stored, Gemma's GELU uses the CPU's f16 table, windows are at most
    /// `abi::MAX_COLS` tokens and MoE layers use the host-readback expert path. With the CPU
    /// backend's ordered mode (`Session::ordered`) whole layers and logits are bit-identical.
    /// Much slower (docs/amd-hip-performance.md). Set by the engine's `--ordered`.
    #[arg(skip)]
    #[serde(skip)]
    pub ordered: bool,
    /// Inner product of the MMQ prefill path: wmma (int8 WMMA tiles) or dot4
    /// (`v_dot4_i32_iu8`); bit-identical.
    #[arg(id = "gpu_mmq", long = "gpu-mmq", value_enum, ignore_case = true, global = true, env = "STRATA_GPU_MMQ", default_value_t = MmqVariant::Wmma)]
    pub mmq: MmqVariant,
    /// Routed experts: auto (device dispatch for decode windows, host readback for longer
    /// chunks), device or host.
    #[arg(id = "gpu_moe", long = "gpu-moe", value_enum, ignore_case = true, global = true, env = "STRATA_GPU_MOE", default_value_t = MoePath::Auto)]
    pub moe: MoePath,
    /// VRAM slots per MoE layer for routed experts, or auto: as many as fit in the free VRAM
    /// after the other weights and one session of --max-context, minus --vram-reserve-mib
    /// (every expert resident when all fit). Default: every expert resident (qwen4exp: auto).
    /// With fewer slots than experts, an expert is copied into a free slot on first use and,
    /// once the slots are full, computed on the CPU; the cache's hits and lookups are printed
    /// after generation. MoE layers then read the router's choice back (no decode graphs).
    /// qwen3moe: bit-identical to the all-resident run with --ordered; qwen4exp (Flash-Next):
    /// the CPU experts use the CPU backend's products.
    #[arg(
        id = "expert_cache",
        long = "expert-cache",
        global = true,
        env = "STRATA_EXPERT_CACHE",
        value_name = "N|auto"
    )]
    pub expert_cache: Option<ExpertCacheSize>,
    /// Adaptive residency of the expert cache: every N tokens, per MoE layer, copy in up to 2
    /// of the most-routed experts without a slot (exponentially decayed counts, routed at least
    /// twice as often) in place of the least-routed residents; 0 = static (the slots keep what
    /// the profile or first use put there).
    #[arg(
        id = "adapt_every",
        long = "adapt-every",
        global = true,
        env = "STRATA_ADAPT_EVERY",
        value_name = "N",
        default_value_t = 4
    )]
    pub adapt_every: usize,
    /// CPU workers that compute the experts without a VRAM slot (their own thread pool, rows
    /// split across the workers, while the device runs the resident experts); 0 = every
    /// physical core but one.
    #[arg(
        id = "pool_workers",
        long = "pool-workers",
        global = true,
        env = "STRATA_POOL_WORKERS",
        value_name = "N",
        default_value_t = 0
    )]
    pub pool_workers: usize,
    /// Share of a decode window's expert-cache misses computed on the device instead of the CPU
    /// pool (most-used misses first): in decode graphs the card reads them in place from RAM
    /// over PCIe (the experts in RAM are pinned and mapped at load); on the host-readback path
    /// (the ordered mode, profiling) each is copied into a staging slot. 0 = every decode miss
    /// on the CPU, 1 = none (prompt chunks stream all their misses either way).
    #[arg(id = "pcie_frac", long = "pcie-frac", global = true, env = "STRATA_PCIE_FRAC", value_name = "F", default_value_t = 0.0, value_parser = parse_share)]
    pub pcie_frac: f64,
    /// VRAM left free by --expert-cache auto (MiB), for the display, other programs and the
    /// runtime's own allocations.
    #[arg(
        id = "vram_reserve_mib",
        long = "vram-reserve-mib",
        global = true,
        env = "STRATA_VRAM_RESERVE_MIB",
        value_name = "MIB",
        default_value_t = 1024
    )]
    pub vram_reserve_mib: u64,
    /// VRAM of the software device (--device emu), in MiB: allocations past it fail as on a
    /// card of that size.
    #[arg(id = "emu_vram_mib", long = "emu-vram-mib", global = true, env = "STRATA_EMU_VRAM_MIB", value_name = "MIB", default_value_t = 24 << 10)]
    pub emu_vram_mib: u64,
}

/// `--expert-cache N|auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "SlotsOrWord")]
pub enum ExpertCacheSize {
    /// This many slots per MoE layer (every expert resident when it is at least the count).
    Slots(u32),
    /// As many as fit in the free VRAM (see [`GpuOptions::expert_cache`]).
    Auto,
}

impl std::str::FromStr for ExpertCacheSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            w if w.eq_ignore_ascii_case("auto") => Ok(ExpertCacheSize::Auto),
            n => {
                n.parse().map(ExpertCacheSize::Slots).map_err(|_| format!("{s:?}: expected a number of slots or auto"))
            }
        }
    }
}

impl std::fmt::Display for ExpertCacheSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExpertCacheSize::Slots(n) => write!(f, "{n}"),
            ExpertCacheSize::Auto => f.write_str("auto"),
        }
    }
}

impl From<ExpertCacheSize> for String {
    fn from(v: ExpertCacheSize) -> String {
        v.to_string()
    }
}

/// The engine configuration's `expert_cache`: a number or a word.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum SlotsOrWord {
    Slots(u32),
    Word(String),
}

impl TryFrom<SlotsOrWord> for ExpertCacheSize {
    type Error = String;
    fn try_from(v: SlotsOrWord) -> Result<Self, String> {
        match v {
            SlotsOrWord::Slots(n) => Ok(ExpertCacheSize::Slots(n)),
            SlotsOrWord::Word(w) => w.parse(),
        }
    }
}

/// A share between 0 and 1 (`--pcie-frac`).
fn parse_share(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number between 0 and 1"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{v} is not between 0 and 1"));
    }
    Ok(v)
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            attn: AttnMode::Ordered,
            graphs: true,
            prefill: PrefillPath::Auto,
            fused_glu: true,
            ordered: false,
            mmq: MmqVariant::Wmma,
            moe: MoePath::Auto,
            expert_cache: None,
            adapt_every: 4,
            pool_workers: 0,
            pcie_frac: 0.0,
            vram_reserve_mib: 1024,
            emu_vram_mib: 24 << 10,
        }
    }
}

/// Attention numerics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttnMode {
    /// Bit-identical to `cpu::attention::attend_ordered` (fixed accumulation order).
    Ordered,
    /// WMMA f16 tiles (`v_wmma_f32_16x16x16_f16`), GQA heads sharing K/V loads, cells split
    /// over 4 waves with an online softmax: within a tolerance of the CPU (tests/gpu/gpu_ops.rs).
    Fast,
}

/// Inner product of `GpuOps::mmq`: int8 WMMA tiles (`v_wmma_i32_16x16x16_iu8`) or
/// `v_dot4_i32_iu8`. Bit-identical results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MmqVariant {
    #[default]
    Wmma,
    Dot4,
}

/// How the routed-expert FFN finds the router's choice.
///
/// Rule (`Auto`): windows of up to `abi::MAX_COLS` tokens (decode steps, speculative
/// verification) use device dispatch — `mmvq_moe_*` reads `sel_ids` on the device, no host
/// synchronisation, so the window is captured as a graph and replayed; longer prompt chunks
/// use the host readback, which runs each chosen expert once on all its tokens by the prompt
/// rule (GEMM or MMQ from 32 tokens: dense routing such as 128 experts top-8 over 512 tokens
/// gives ~32 a expert, whose weights MMVQ would read once per 4-8 columns). `Device` runs
/// prompt chunks by device dispatch over slots sorted by expert (`moe_sort_slots`), each
/// expert read about once a chunk. Experts without an MMVQ type (F32/F16) always use the host
/// path. Both paths give identical bits. (Flash-Next's chunks, ~1.75 tokens per chosen
/// expert, always take sorted device dispatch when every expert is resident.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MoePath {
    Auto,
    /// Device dispatch for every chunk (in groups of 8 tokens) when the experts are quantized.
    Device,
    /// Always read the choice back to the host (no graphs for MoE models).
    Host,
}

/// Prefill path for quantized projections.
///
/// Rule (`Auto`): a chunk of fewer than [`GEMM_MIN_TOKENS`] tokens runs MMVQ, 8 columns per
/// launch — decode steps and speculative-verification windows (up to 9 tokens), whose columns
/// are then computed exactly like single steps; a longer chunk (a prompt) dequantizes each layer
/// matrix to f32 in a scratch buffer and runs one GEMM over the whole chunk (hipBLAS on a card),
/// reading the weights once instead of once per 8 tokens. Matrices larger than the scratch (the
/// output head, expert stacks) keep MMVQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PrefillPath {
    Auto,
    /// Always MMVQ in windows of 8 columns.
    Mmvq,
    /// Dequantize + GEMM whenever a chunk has more than one token.
    #[value(name = "gemm", alias = "dequant-gemm")]
    #[serde(rename = "gemm")]
    DequantGemm,
    /// MMQ (`mmq_*`: int8 weights x Q8_1 activations, 256 x 64 tiles staged in LDS, WMMA or
    /// dot4 by [`GpuOptions::mmq`]) for every matrix type with an MMQ kernel (Q8_0, Q4_K,
    /// Q6_K, IQ3_XXS) from [`GEMM_MIN_TOKENS`] tokens; other types (F32, F16) take the
    /// `Auto` rule. Reads each weight once per 64 tokens, no dequantized scratch copy, but
    /// exact int8 dots of Q8_1-rounded activations (not the f16 GEMM's numerics).
    Mmq,
}
