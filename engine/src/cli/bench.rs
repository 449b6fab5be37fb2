//! `strata bench`: prompt-processing and decode speed, llama-bench style.
//!
//! pp: one evaluation of `--pp` tokens on an empty cache; tg: `--tg` single-token evaluations
//! (greedy argmax of the previous logits) after a short prompt. Each is repeated `--reps` times
//! after one warm-up; we report min and median tokens/s and the process's peak RSS.

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;

use crate::engine::Engine;
use cpu_executor::prelude::*;
use model::{Logits, argmax};

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// What to measure: the model (default), or `kernels`: every gfx11 kernel on the software
    /// RDNA3 device (instructions, bytes moved vs ideal, registers, occupancy; needs a
    /// `--features gpu` build) plus the device's own speed in lane-operations per second.
    #[arg(value_enum)]
    pub target: Option<BenchTarget>,
    /// With `kernels`: small shapes only (about a second instead of half a minute).
    #[arg(long)]
    pub quick: bool,
    /// Prompt length for the prompt-processing test.
    #[arg(long, default_value_t = 512)]
    pub pp: usize,
    /// Number of generated tokens for the decode test.
    #[arg(long, default_value_t = 128)]
    pub tg: usize,
    /// Repetitions of each test (after one warm-up run).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Print the results as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Also time every operation of the forward pass (CPU executor): one prompt pass of
    /// `--pp` tokens and `--tg` decode steps, printed as ms per token and share of the total.
    #[arg(long)]
    pub profile: bool,
    /// Also measure this machine's memory read bandwidth (all threads streaming 1 GiB) and
    /// report the decode speed as a share of the memory roofline: bandwidth / bytes one
    /// decode step reads (weights, norms and the K/V cache at the test's mean position).
    #[arg(long)]
    pub roofline: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchResult {
    pub model: String,
    /// The vocabulary size and BOS id the prompt was made with (a peer can rebuild it: ids
    /// `max(i * 2654435761 mod 2^32 mod n_vocab, 3)`, BOS first).
    pub n_vocab: usize,
    pub bos: Option<u32>,
    pub threads: usize,
    pub cpu_features: &'static str,
    pub pp: usize,
    pub pp_tok_s: Vec<f64>,
    pub pp_min: f64,
    pub pp_median: f64,
    pub tg: usize,
    pub tg_tok_s: Vec<f64>,
    pub tg_min: f64,
    pub tg_median: f64,
    pub peak_rss_mb: f64,
    /// With `--spec N`: greedy speculative decode of `tg` tokens after a repetitive prompt.
    pub spec: Option<SpecBench>,
    /// Backend of the forward pass (`cpu`, `hip (...)`, `emu (...)`).
    pub device: String,
    /// On the software device: per decode token, instructions and global bytes per part of
    /// the forward pass against the ideal bytes (the proxy for a real card's decode speed).
    pub gpu_decode_profile: Option<Vec<GpuPart>>,
    /// The same for one pass over the prompt (values per prompt token).
    pub gpu_prompt_profile: Option<Vec<GpuPart>>,
    /// With `--profile` on the CPU: wall time per operation of a decode step...
    pub cpu_decode_profile: Option<Vec<CpuPart>>,
    /// ...and of one prompt pass (per prompt token).
    pub cpu_prompt_profile: Option<Vec<CpuPart>>,
    /// With `--roofline`.
    pub roofline: Option<Roofline>,
    /// The GPU expert cache's counters over the whole run (every repetition, prompt and decode).
    pub expert_cache: Option<experts::counters::CacheStats>,
}

/// `strata bench --roofline`: decode against the memory bandwidth.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Roofline {
    /// Bytes a decode step reads at the test's mean position.
    pub decode_bytes_per_token: f64,
    /// Best of five reads of 1 GiB by every thread of the pool.
    pub read_gb_s: f64,
    /// `read_gb_s / decode_bytes_per_token`.
    pub roofline_tok_s: f64,
    /// Median decode speed over the roofline.
    pub share: f64,
}

/// One operation in `cpu_*_profile` (per token; the last row, `(between ops)`, is the time of
/// the forward chunk outside every operation).
#[derive(Debug, Clone, serde::Serialize)]
pub struct CpuPart {
    pub op: String,
    pub calls_per_token: f64,
    pub ms_per_token: f64,
    pub share: f64,
}

pub use kernel_tools::GpuPart;

/// `strata bench --spec N` results.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SpecBench {
    /// `suffix`, or `MTP` with `--mtp`.
    pub drafter: &'static str,
    pub min_p: f32,
    pub n_draft: usize,
    pub tok_s: f64,
    pub acceptance_rate: f64,
    pub tokens_per_verify: f64,
    pub stats_drafted: u64,
    pub stats_accepted: u64,
    pub verify_steps: u64,
    /// With `--mtp`: rows the MTP head ran (catch-up pairs incl. the prompt, and chained drafts).
    pub mtp_head_rows: Option<u64>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchTarget {
    /// The model given with -m (or the default model).
    Model,
    /// The gfx11 kernels on the software device.
    Kernels,
}

/// `strata bench kernels`.
pub fn run_kernels(a: &BenchArgs) -> Result<()> {
    print!("{}", kernel_tools::kernel_bench_report(a.quick)?);
    Ok(())
}

fn min_median(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    (s[0], s[s.len() / 2])
}

/// Peak resident set size of this process in MiB (VmHWM), 0 where /proc is unavailable.
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

pub fn bench(e: &Engine, a: &BenchArgs) -> Result<BenchResult> {
    if a.pp == 0 || a.tg == 0 || a.reps == 0 {
        bail!("--pp, --tg and --reps must be >= 1");
    }
    let nv = e.model.n_vocab() as u32;
    // Deterministic pseudo-text: ids spread over the vocabulary, BOS first.
    let mut prompt: Vec<u32> = (0..a.pp as u32).map(|i| (i.wrapping_mul(2_654_435_761) % nv.max(1)).max(3)).collect();
    if let Some(b) = e.tokenizer.bos() {
        prompt[0] = b;
    }
    let cap = (a.pp).max(a.tg + 8);
    let mut sess = e.new_session_with_capacity(cap)?;
    let mut logits = Vec::new();
    let mut pp_tok_s = Vec::new();
    for rep in 0..=a.reps {
        sess.reset();
        let t = Instant::now();
        e.eval(&mut *sess, &prompt, Logits::Last, &mut logits)?;
        let dt = t.elapsed().as_secs_f64();
        if rep > 0 {
            pp_tok_s.push(a.pp as f64 / dt);
        }
    }
    let mut tg_tok_s = Vec::new();
    for rep in 0..=a.reps {
        sess.reset();
        e.eval(&mut *sess, &prompt[..prompt.len().min(8)], Logits::Last, &mut logits)?;
        let t = Instant::now();
        for _ in 0..a.tg {
            let next = argmax(&logits);
            e.eval(&mut *sess, &[next], Logits::Last, &mut logits)?;
        }
        let dt = t.elapsed().as_secs_f64();
        if rep > 0 {
            tg_tok_s.push(a.tg as f64 / dt);
        }
    }
    let spec = match e.opts.spec {
        None => None,
        Some(sc) => {
            // The pseudo-text never repeats; the drafter needs repetition, so the prompt is a
            // 16-token phrase said three times.
            let phrase = &prompt[..prompt.len().min(16)];
            let p: Vec<u32> = phrase.iter().chain(phrase).chain(phrase).copied().collect();
            let run = super::generate::spec_generate(
                e,
                &p,
                a.tg,
                sc,
                crate::sampler::SamplerConfig::greedy(),
                e.opts.mtp.as_deref(),
            )?;
            let (st, dt) = (run.stats, run.secs);
            Some(SpecBench {
                mtp_head_rows: run.mtp.map(|m| m.real_rows + m.chained_rows),
                drafter: run.drafter,
                min_p: sc.min_p,
                n_draft: sc.n_draft,
                tok_s: st.decoded as f64 / dt.max(1e-9),
                acceptance_rate: st.acceptance_rate(),
                tokens_per_verify: st.tokens_per_verify(),
                stats_drafted: st.drafted,
                stats_accepted: st.accepted,
                verify_steps: st.verify_steps,
            })
        }
    };
    let (pp_min, pp_median) = min_median(&pp_tok_s);
    let (tg_min, tg_median) = min_median(&tg_tok_s);
    let on_emu = e.opts.device == gpu_executor::Device::Emu && e.gpu.is_some();
    let profile = if on_emu {
        let cfg = e.session_config(prompt.len() + a.tg.min(8) + 1);
        kernel_tools::device_profile(&*e.model, &cfg, &prompt, a.tg.min(8))?
    } else {
        None
    };
    let (gpu_prompt_profile, gpu_decode_profile) = match profile {
        Some((p, d)) => (Some(p), Some(d)),
        None => (None, None),
    };
    // The CPU's own profile and roofline: the shared decoder on the CPU.
    let on_cpu = e.model.downcast_ref::<cpu_executor::CpuDecoder>().map(|c| &c.0);
    let (cpu_prompt_profile, cpu_decode_profile) = match on_cpu {
        Some(m) if a.profile => {
            let (p, d) = cpu_profile(m, e, &prompt, a.tg)?;
            (Some(p), Some(d))
        }
        _ => (None, None),
    };
    let roofline = match on_cpu {
        Some(m) if a.roofline => {
            let kv_bytes = e.opts.kv.bytes_per_value();
            let bytes = m.decode_bytes(8 + a.tg / 2, kv_bytes);
            let bw = read_bandwidth_gb_s();
            Some(Roofline {
                decode_bytes_per_token: bytes,
                read_gb_s: bw,
                roofline_tok_s: bw * 1e9 / bytes,
                share: tg_median * bytes / (bw * 1e9),
            })
        }
        _ => None,
    };
    Ok(BenchResult {
        n_vocab: nv as usize,
        bos: e.tokenizer.bos(),
        roofline,
        cpu_decode_profile,
        cpu_prompt_profile,
        device: e.model.backend(),
        gpu_decode_profile,
        gpu_prompt_profile,
        model: e.path.display().to_string(),
        threads: rayon::current_num_threads(),
        cpu_features: cpu_kernels::cpu_features(),
        pp: a.pp,
        pp_tok_s,
        pp_min,
        pp_median,
        tg: a.tg,
        tg_tok_s,
        tg_min,
        tg_median,
        peak_rss_mb: peak_rss_mb(),
        spec,
        expert_cache: e.model.expert_cache_stats(),
    })
}

/// Read bandwidth of the pool's threads streaming over 1 GiB (best of five passes), GB/s.
fn read_bandwidth_gb_s() -> f64 {
    let buf = vec![1u64; (1usize << 30) / 8];
    let chunk = buf.len().div_ceil(rayon::current_num_threads() * 4);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        let sum = std::sync::atomic::AtomicU64::new(0);
        cpu_kernels::team::with_team(|| {
            cpu_kernels::team::for_each(buf.len().div_ceil(chunk), |i| {
                let c = &buf[i * chunk..((i + 1) * chunk).min(buf.len())];
                let lanes = c.chunks_exact(8).fold([0u64; 8], |mut acc, v| {
                    for j in 0..8 {
                        acc[j] = acc[j].wrapping_add(v[j]);
                    }
                    acc
                });
                sum.fetch_add(lanes.iter().sum::<u64>(), std::sync::atomic::Ordering::Relaxed);
            })
        });
        std::hint::black_box(sum);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (buf.len() * 8) as f64 / best / 1e9
}

/// One timed prompt pass over `prompt`, then `steps` timed decode steps (CPU executor).
fn cpu_profile(m: &model::Decoder, e: &Engine, prompt: &[u32], steps: usize) -> Result<(Vec<CpuPart>, Vec<CpuPart>)> {
    use model::op_profile::OpProfile;
    let mut sess = m.new_session(e.opts.kv, prompt.len().max(steps + 8) + 1, e.opts.prefill);
    sess.ordered_attention = e.opts.ordered_attention;
    sess.tiles = e.opts.cpu_tiles;
    let mut logits = Vec::new();
    m.eval(&mut sess, &prompt[..prompt.len().min(8)], Logits::Last, &mut logits)?; // warm-up
    sess.reset();
    sess.profile = Some(OpProfile::default());
    m.eval(&mut sess, prompt, Logits::Last, &mut logits)?;
    let pp = parts(&sess.profile.take().expect("set above"), prompt.len());
    sess.reset();
    m.eval(&mut sess, &prompt[..prompt.len().min(8)], Logits::Last, &mut logits)?;
    sess.profile = Some(OpProfile::default());
    for _ in 0..steps {
        let next = argmax(&logits);
        m.eval(&mut sess, &[next], Logits::Last, &mut logits)?;
    }
    let tg = parts(&sess.profile.take().expect("set above"), steps);
    Ok((pp, tg))
}

/// Per-token rows of a profile, the slowest first, then the time between operations.
fn parts(p: &model::op_profile::OpProfile, tokens: usize) -> Vec<CpuPart> {
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e3 / tokens.max(1) as f64;
    let total = per(p.total).max(1e-12);
    let mut v: Vec<CpuPart> = p
        .ops
        .iter()
        .map(|(op, (d, n))| CpuPart {
            op: op.to_string(),
            calls_per_token: *n as f64 / tokens.max(1) as f64,
            ms_per_token: per(*d),
            share: per(*d) / total,
        })
        .collect();
    v.sort_by(|a, b| b.ms_per_token.total_cmp(&a.ms_per_token));
    let between = per(p.unaccounted());
    v.push(CpuPart { op: "(between ops)".into(), calls_per_token: 0.0, ms_per_token: between, share: between / total });
    v
}

pub fn run(e: &Engine, a: &BenchArgs) -> Result<()> {
    let r = bench(e, a)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "model: {} (device {}, {} threads, {}, kv {:?})",
            r.model, r.device, r.threads, r.cpu_features, e.opts.kv
        );
        println!("pp{}: min {:.1} tok/s, median {:.1} tok/s  {:?}", r.pp, r.pp_min, r.pp_median, r.pp_tok_s);
        println!("tg{}: min {:.1} tok/s, median {:.1} tok/s  {:?}", r.tg, r.tg_min, r.tg_median, r.tg_tok_s);
        if let Some(sp) = &r.spec {
            println!(
                "spec{} ({} drafter, min-p {}, tg{} incl. prompt pass): {:.1} tok/s, acceptance rate {:.1}% ({}/{} drafts), {:.2} tokens per verify step ({} steps)",
                sp.n_draft,
                sp.drafter,
                sp.min_p,
                r.tg,
                sp.tok_s,
                100.0 * sp.acceptance_rate,
                sp.stats_accepted,
                sp.stats_drafted,
                sp.tokens_per_verify,
                sp.verify_steps
            );
            if let Some(rows) = sp.mtp_head_rows {
                println!(
                    "  MTP head: {rows} rows ({:.2} per decoded token, prompt included)",
                    rows as f64 / r.tg.max(1) as f64
                );
            }
        }
        for (what, prof) in
            [("prompt pass, per prompt token", &r.cpu_prompt_profile), ("decode, per token", &r.cpu_decode_profile)]
        {
            let Some(prof) = prof else { continue };
            let total: f64 = prof.iter().map(|p| p.ms_per_token).sum();
            println!("CPU {what}: {total:.3} ms ({:.1} tok/s while timed)", 1e3 / total.max(1e-12));
            println!("  {:<22} {:>8} {:>10} {:>7}", "operation", "calls", "ms", "share");
            for p in prof {
                println!(
                    "  {:<22} {:>8.1} {:>10.4} {:>6.1}%",
                    p.op,
                    p.calls_per_token,
                    p.ms_per_token,
                    100.0 * p.share
                );
            }
        }
        if let Some(c) = &r.expert_cache {
            println!("{c} (whole run, all repetitions)");
        }
        if let Some(rl) = &r.roofline {
            println!(
                "roofline: {:.1} MB read per decode token, memory read {:.1} GB/s -> at most {:.1} tok/s; decode reached {:.1}% of it",
                rl.decode_bytes_per_token / 1e6,
                rl.read_gb_s,
                rl.roofline_tok_s,
                100.0 * rl.share
            );
        }
        for (what, parts) in
            [("prompt pass, per prompt token", &r.gpu_prompt_profile), ("decode, per token", &r.gpu_decode_profile)]
        {
            let Some(parts) = parts else { continue };
            println!("software-device profile of the {what} (global bytes vs the ideal: weights + KV + activations):");
            println!(
                "  {:<10} {:>9} {:>14} {:>14} {:>14} {:>7}",
                "part", "launches", "instructions", "global bytes", "ideal bytes", "ratio"
            );
            for p in parts {
                println!(
                    "  {:<10} {:>9.1} {:>14.0} {:>14.0} {:>14.0} {:>7.3}",
                    p.part,
                    p.launches,
                    p.instructions,
                    p.global_bytes,
                    p.ideal_bytes,
                    p.global_bytes / p.ideal_bytes.max(1.0)
                );
            }
        }
        println!("peak RSS: {:.1} MB", r.peak_rss_mb);
    }
    Ok(())
}
