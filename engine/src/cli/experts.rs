//! `strata experts ...`: tools of expert tiering that need no GPU. `simulate` replays a routing
//! trace (a `--dump-routing` file, or a synthetic one of Flash-Next's measured shape) through the
//! cache policies and prints hit rates per slot count.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};

use crate::experts::policy::{self, Policy};
use crate::experts::trace::{self, TraceShape};

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

fn simulate(a: &SimulateArgs) -> Result<()> {
    let (records, n_expert, what) = match &a.trace {
        Some(p) => (trace::read(p, Some(a.experts)).with_context(|| format!("reading {}", p.display()))?, a.experts as usize, p.display().to_string()),
        None => {
            let shape = TraceShape::flash_next(a.tokens, a.seed);
            (trace::synthetic(&shape), shape.n_expert as usize, format!("synthetic Flash-Next-shaped trace, {} tokens, seed {}", a.tokens, a.seed))
        }
    };
    let n_layers = records.iter().map(|r| r.layer as usize + 1).max().unwrap_or(0);
    if n_layers == 0 || records.len() % n_layers != 0 {
        bail!("the trace must hold the same layers for every token ({} records, {n_layers} layers)", records.len());
    }
    let split = records.len() / n_layers / 2 * n_layers;
    let (train, eval) = records.split_at(split);
    let counts = policy::count(train, n_layers, n_expert);
    let adaptive = match Policy::ADAPTIVE {
        Policy::Adaptive { max_swaps, decay, ratio, .. } => Policy::Adaptive { every: a.adapt_every, max_swaps, decay, ratio },
        p => p,
    };
    let policies = [Policy::Static, Policy::Lru, adaptive];
    let mut rows = Vec::new();
    for &slots in &a.slots {
        let initial = policy::top_per_layer(&counts, slots);
        let rates: Vec<f64> = policies.iter().map(|&p| policy::simulate(eval, n_layers, n_expert, slots, &initial, p).hit_rate()).collect();
        rows.push((slots, rates));
    }
    if a.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(s, r)| serde_json::json!({"slots_per_layer": s, "uniform": *s as f64 / n_expert as f64, "static": r[0], "lru": r[1], "adaptive": r[2]}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({"trace": what, "layers": n_layers, "experts": n_expert, "rows": v}))?);
        return Ok(());
    }
    println!("trace: {what}; {n_layers} layers x {n_expert} experts; profile = first half, scored on the second");
    println!("{:>6} {:>8} {:>8} {:>8} {:>10}", "slots", "uniform", "static", "LRU", "adaptive");
    for (s, r) in &rows {
        println!("{:>6} {:>7.1}% {:>7.1}% {:>7.1}% {:>9.1}%", s, 100.0 * *s as f64 / n_expert as f64, 100.0 * r[0], 100.0 * r[1], 100.0 * r[2]);
    }
    Ok(())
}
