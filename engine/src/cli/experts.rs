//! `strata experts ...`: tools of expert tiering that need no GPU. `simulate` replays a routing
//! trace (a `--dump-routing` file, or a synthetic one of Flash-Next's measured shape) through the
//! cache policies and prints hit rates per slot count.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};

use experts::policy::{self, Policy};
use experts::trace::{self, TraceShape};

#[derive(Args, Debug)]
pub struct ExpertsArgs {
    #[command(subcommand)]
    pub command: ExpertsCmd,
}

#[derive(Subcommand, Debug)]
pub enum ExpertsCmd {
    /// Hit rate of the expert-cache policies (static profile, LRU, adaptive) per slot count.
    ///
    /// The first half of the trace is the profiling run (the static profile is its top experts
    /// per layer, and every policy starts from it); the second half is scored.
    Simulate(SimulateArgs),
}

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// A `--dump-routing` file (records: i32 layer, i32 k, k x i32 ids, k x f32 weights).
    /// Default: a synthetic trace of Flash-Next's shape (48 layers, 512 experts, top-10).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Experts per layer of the model the trace is from (with --trace).
    #[arg(long, default_value_t = 512)]
    pub experts: u32,
    /// Tokens of the synthetic trace.
    #[arg(long, default_value_t = 4000)]
    pub tokens: usize,
    /// Seed of the synthetic trace.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Slots per layer to simulate (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [16usize, 32, 64, 128, 256])]
    pub slots: Vec<usize>,
    /// Adaptive policy: tokens between adaptations (`--adapt-every`).
    #[arg(long, default_value_t = 4)]
    pub adapt_every: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &ExpertsArgs) -> Result<()> {
    match &a.command {
        ExpertsCmd::Simulate(s) => simulate(s),
    }
}

/// A routing trace: a `--dump-routing` file, or a synthetic one of Flash-Next's measured shape
/// (48 layers x 512 experts, top-10, unless `shape` says otherwise). Returns the records, the
/// experts per layer, the layers and a description.
fn load_trace(
    file: Option<&Path>,
    experts: u32,
    shape: TraceShape,
) -> Result<(Vec<trace::Routing>, usize, usize, String)> {
    let (records, n_expert, what) = match file {
        Some(p) => (
            trace::read(p, Some(experts)).with_context(|| format!("reading {}", p.display()))?,
            experts as usize,
            p.display().to_string(),
        ),
        None => (
            trace::synthetic(&shape),
            shape.n_expert as usize,
            format!("synthetic Flash-Next-shaped trace, {} tokens, seed {}", shape.tokens, shape.seed),
        ),
    };
    let n_layers = records.iter().map(|r| r.layer as usize + 1).max().unwrap_or(0);
    if n_layers == 0 || records.len() % n_layers != 0 {
        bail!("the trace must hold the same layers for every token ({} records, {n_layers} layers)", records.len());
    }
    Ok((records, n_expert, n_layers, what))
}

/// Hit rates of the static profile, LRU and the adaptive policy (every `adapt_every` tokens)
/// at `slots` per layer: the first half of the trace is the profiling run, the second is scored.
fn hit_rates(
    records: &[trace::Routing],
    n_layers: usize,
    n_expert: usize,
    slots: usize,
    adapt_every: usize,
) -> [f64; 3] {
    let split = records.len() / n_layers / 2 * n_layers;
    let (train, eval) = records.split_at(split);
    let counts = policy::count(train, n_layers, n_expert);
    let adaptive = match Policy::ADAPTIVE {
        Policy::Adaptive { max_swaps, decay, ratio, .. } => {
            Policy::Adaptive { every: adapt_every, max_swaps, decay, ratio }
        }
        p => p,
    };
    let initial = policy::top_per_layer(&counts, slots);
    [Policy::Static, Policy::Lru, adaptive]
        .map(|p| policy::simulate(eval, n_layers, n_expert, slots, &initial, p).hit_rate())
}

fn simulate(a: &SimulateArgs) -> Result<()> {
    let (records, n_expert, n_layers, what) =
        load_trace(a.trace.as_deref(), a.experts, TraceShape::qwen4exp(a.tokens, a.seed))?;
    let mut rows = Vec::new();
    for &slots in &a.slots {
        rows.push((slots, hit_rates(&records, n_layers, n_expert, slots, a.adapt_every)));
    }
    if a.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(s, r)| serde_json::json!({"slots_per_layer": s, "uniform": *s as f64 / n_expert as f64, "static": r[0], "lru": r[1], "adaptive": r[2]}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"trace": what, "layers": n_layers, "experts": n_expert, "rows": v})
            )?
        );
        return Ok(());
    }
    println!("trace: {what}; {n_layers} layers x {n_expert} experts; profile = first half, scored on the second");
    println!("{:>6} {:>8} {:>8} {:>8} {:>10}", "slots", "uniform", "static", "LRU", "adaptive");
    for (s, r) in &rows {
        println!(
            "{:>6} {:>7.1}% {:>7.1}% {:>7.1}% {:>9.1}%",
            s,
            100.0 * *s as f64 / n_expert as f64,
            100.0 * r[0],
            100.0 * r[1],
            100.0 * r[2]
        );
    }
    Ok(())
}

/// `strata plan`: the VRAM split and projected decode speed of a MoE model on a machine.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The card's VRAM, GiB (RX 7900 XTX: 24).
    #[arg(long, default_value_t = 24.0)]
    pub vram_gib: f64,
    /// The card's memory bandwidth, GB/s (RX 7900 XTX: 960).
    #[arg(long, default_value_t = 960.0)]
    pub gpu_gbs: f64,
    /// Share of that bandwidth the decode kernels reach (llama.cpp's ROCm kernels 0.54-0.57,
    /// the best Vulkan ones about 0.70, as published for the RX 7900 XTX).
    #[arg(long, default_value_t = 0.55)]
    pub gpu_efficiency: f64,
    /// CPU cores; the pool gets all but one unless --pool-workers says otherwise.
    #[arg(long, default_value_t = 16)]
    pub cpu_cores: usize,
    /// One core's rate on the experts' type, GB of weights per second (IQ3_XXS matvec: 8.3 on
    /// this project's Zen 4 test machine, docs/cpu-kernels.md).
    #[arg(long, default_value_t = 8.3)]
    pub cpu_core_gbs: f64,
    /// RAM bandwidth, GB/s (two channels of DDR5-6000 stream about 60-70).
    #[arg(long, default_value_t = 60.0)]
    pub ram_gbs: f64,
    /// RAM, GiB.
    #[arg(long, default_value_t = 64.0)]
    pub ram_gib: f64,
    /// One MoE layer's GPU → CPU → GPU handoff, microseconds.
    #[arg(long, default_value_t = 20.0)]
    pub handoff_us: f64,
    /// Host-to-device link rate, GB/s (PCIe 4.0 x16 moves about 25 in practice), at which the
    /// card reads the misses --pcie-frac gives it from RAM.
    #[arg(long, default_value_t = 25.0)]
    pub pcie_gbs: f64,
    /// VRAM for what is neither weights, KV nor experts (graphs, workspaces, recurrent states,
    /// the MTP head), MiB.
    #[arg(long, default_value_t = 512)]
    pub extra_mib: u64,
    /// Built-in Flash-Next shape (without -m): bits per weight of the dense (non-expert) weights.
    #[arg(long, default_value_t = 6.5625)]
    pub dense_bits: f64,
    /// A `--dump-routing` file for the hit rate (default: a synthetic trace of Flash-Next's
    /// measured locality, shaped like the model).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Tokens and seed of the synthetic trace.
    #[arg(long, default_value_t = 4000)]
    pub tokens: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `strata plan` for `model` (None: the built-in Flash-Next IQ3_XXS shape) with the
/// engine configuration's --kv, --max-context, --vram-reserve-mib, --pool-workers and
/// --adapt-every.
pub fn plan(a: &PlanArgs, model: Option<&Path>, c: &super::CommonArgs) -> Result<()> {
    use experts::plan::{Machine, ModelShape, gib, project, slots};
    let kv_elem = match c.kv {
        cpu_executor::kv_cache::KvType::F32 => 4.0,
        cpu_executor::kv_cache::KvType::F16 => 2.0,
        cpu_executor::kv_cache::KvType::Int8 => 1.0 + 4.0 / 256.0, // a scale per head row of 256
    };
    let m = match model {
        Some(p) => {
            let g = gguf::GgufFile::open(p).with_context(|| format!("reading the header of {}", p.display()))?;
            ModelShape::from_gguf(&g, &p.display().to_string(), kv_elem)
                .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
        }
        None => ModelShape::qwen4exp_iq3xxs(a.dense_bits, kv_elem),
    };
    for (what, v) in [
        ("--vram-gib", a.vram_gib),
        ("--gpu-gbs", a.gpu_gbs),
        ("--gpu-efficiency", a.gpu_efficiency),
        ("--cpu-core-gbs", a.cpu_core_gbs),
        ("--ram-gbs", a.ram_gbs),
        ("--ram-gib", a.ram_gib),
        ("--pcie-gbs", a.pcie_gbs),
    ] {
        if !(v.is_finite() && v > 0.0) {
            bail!("{what} must be a positive number (got {v})");
        }
    }
    if a.gpu_efficiency > 1.0 {
        bail!("--gpu-efficiency is a share of the bandwidth, at most 1 (got {})", a.gpu_efficiency);
    }
    let workers = if c.gpu.pool_workers > 0 { c.gpu.pool_workers } else { a.cpu_cores.saturating_sub(1).max(1) };
    let mc = Machine {
        vram_bytes: (a.vram_gib * (1u64 << 30) as f64) as u64,
        gpu_gbs: a.gpu_gbs,
        gpu_efficiency: a.gpu_efficiency,
        pool_workers: workers,
        cpu_core_gbs: a.cpu_core_gbs,
        ram_gbs: a.ram_gbs,
        ram_bytes: (a.ram_gib * (1u64 << 30) as f64) as u64,
        handoff_us: a.handoff_us,
        pcie_gbs: a.pcie_gbs,
        pcie_frac: c.gpu.pcie_frac,
    };
    let ctx = if c.max_context == 0 { 4096 } else { c.max_context };
    let (reserve, extra) = (c.gpu.vram_reserve_mib << 20, a.extra_mib << 20);
    let n = slots(&m, &mc, ctx, reserve, extra);
    // The trace: the given one, or Flash-Next's locality in this model's shape.
    let mut shape = TraceShape::qwen4exp(a.tokens, a.seed);
    (shape.n_layers, shape.n_expert, shape.k) = (m.n_moe_layers as u32, m.n_expert as u32, m.k as u32);
    shape.topic = (shape.topic * m.n_expert / 512).max(m.k);
    let (records, n_expert, n_layers, what) = load_trace(a.trace.as_deref(), m.n_expert as u32, shape)?;
    if (n_layers, n_expert) != (m.n_moe_layers, m.n_expert) {
        bail!("the trace has {n_layers} layers x {n_expert} experts, the model {} x {}", m.n_moe_layers, m.n_expert);
    }
    let [st, lru, adaptive] = hit_rates(&records, n_layers, n_expert, n, c.gpu.adapt_every);
    let hit = if c.gpu.adapt_every == 0 { st } else { adaptive };
    let p = project(&m, &mc, ctx, reserve, extra, n, hit);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "model": m.name, "vram_gib": a.vram_gib, "slots_per_layer": n, "experts_cached": n * m.n_moe_layers,
                "cached_gib": gib(p.cached_bytes), "resident_gib": gib(m.resident_bytes), "kv_gib": gib(p.kv_bytes),
                "ram_experts_gib": gib(p.ram_expert_bytes), "fits_ram": p.fits_ram, "trace": what,
                "hit_rate": {"used": hit, "static": st, "lru": lru, "adaptive": adaptive},
                "gpu_ms": p.gpu_ms, "cpu_ms": p.cpu_ms, "pcie_ms": p.pcie_ms, "pcie_frac": c.gpu.pcie_frac, "handoff_ms": p.handoff_ms, "token_ms": p.token_ms, "tokens_per_s": p.tokens_per_s,
            }))?
        );
        return Ok(());
    }
    println!(
        "model: {} — {} layers ({} MoE) x {} experts, top-{}, {:.2} MB an expert; dense {:.2} GiB read per token",
        m.name,
        m.n_layers,
        m.n_moe_layers,
        m.n_expert,
        m.k,
        m.expert_bytes as f64 / 1e6,
        gib(m.dense_bytes)
    );
    println!(
        "machine: {:.1} GiB VRAM at {:.0} GB/s x {:.2}; {} CPU workers x {:.1} GB/s (RAM {:.0} GB/s); {:.0} GiB RAM",
        a.vram_gib, a.gpu_gbs, a.gpu_efficiency, workers, a.cpu_core_gbs, a.ram_gbs, a.ram_gib
    );
    println!(
        "VRAM: weights {:.2} GiB + KV {:.2} GiB ({ctx} positions, --kv {:?}) + other {:.2} GiB + reserve {:.2} GiB; experts: {n} of {} per layer ({} experts, {:.2} GiB)",
        gib(m.resident_bytes),
        gib(p.kv_bytes),
        c.kv,
        gib(extra),
        gib(reserve),
        m.n_expert,
        n * m.n_moe_layers,
        gib(p.cached_bytes)
    );
    println!(
        "RAM: {:.2} GiB of experts outside VRAM{}",
        gib(p.ram_expert_bytes),
        if p.fits_ram {
            " (fit in RAM with 8 GiB to spare)"
        } else {
            " (more than RAM minus 8 GiB: --mmap-experts, the page cache and the SSD serve them)"
        }
    );
    println!(
        "routing: {what}: hit rate {:.1}% ({}; static profile {:.1}%, LRU {:.1}%, adaptive {:.1}%)",
        100.0 * hit,
        if c.gpu.adapt_every == 0 {
            "--adapt-every 0".to_string()
        } else {
            format!("adaptive every {}", c.gpu.adapt_every)
        },
        100.0 * st,
        100.0 * lru,
        100.0 * adaptive
    );
    println!(
        "decode, per token: GPU {:.2} ms (of which reading misses over PCIe {:.2} ms, --pcie-frac {}), CPU pool {:.2} ms, handoffs {:.2} ms → {:.2} ms = {:.1} tokens/s (plain decode: no speculation)",
        p.gpu_ms, p.pcie_ms, c.gpu.pcie_frac, p.cpu_ms, p.handoff_ms, p.token_ms, p.tokens_per_s
    );
    let by_share: Vec<String> = [0.0, 0.25, 0.5, 1.0]
        .iter()
        .map(|&f| {
            format!(
                "{f}: {:.1}",
                project(&m, &Machine { pcie_frac: f, ..mc }, ctx, reserve, extra, n, hit).tokens_per_s
            )
        })
        .collect();
    println!("misses over PCIe at {:.0} GB/s, tokens/s by --pcie-frac: {}", a.pcie_gbs, by_share.join(", "));
    Ok(())
}
