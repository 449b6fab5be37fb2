//! `strata bench`: prompt-processing and decode speed, llama-bench style.
//!
//! pp: one evaluation of `--pp` tokens on an empty cache; tg: `--tg` single-token evaluations
//! (greedy argmax of the previous logits) after a short prompt. Each is repeated `--reps` times
//! after one warm-up; we report min and median tokens/s and the process's peak RSS.

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;

use crate::engine::Engine;
use crate::model::Logits;

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
    #[command(flatten)]
    pub spec: super::SpecArgs,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchResult {
    pub model: String,
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
}

/// One part of the forward pass in `gpu_decode_profile` (values per decoded token).
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuPart {
    pub part: String,
    pub instructions: f64,
    pub global_bytes: f64,
    pub ideal_bytes: f64,
}

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
    #[cfg(feature = "gpu")]
    print!("{}", crate::gpu::bench_kernels(a.quick));
    #[cfg(not(feature = "gpu"))]
    {
        let _ = a;
        bail!("this strata was built without the gfx11 kernels: rebuild with `cargo build --release --features gpu` (./setup.sh --backend hip)");
    }
    #[cfg(feature = "gpu")]
    {
        let ops = emulator::bench_lane_ops_per_sec();
        println!("software device speed: {:.0} million lane-operations/s on one core (target >= 50)", ops / 1e6);
        Ok(())
    }
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
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()))
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
    let mut sess = e.model.new_session_with(e.opts.kv, cap, e.opts.prefill, e.opts.ordered_attention)?;
    let mut logits = Vec::new();
    let mut pp_tok_s = Vec::new();
    for rep in 0..=a.reps {
        sess.reset();
        let t = Instant::now();
        e.model.eval(&mut sess, &prompt, Logits::Last, &mut logits)?;
        let dt = t.elapsed().as_secs_f64();
        if rep > 0 {
            pp_tok_s.push(a.pp as f64 / dt);
        }
    }
    let mut tg_tok_s = Vec::new();
    for rep in 0..=a.reps {
        sess.reset();
        e.model.eval(&mut sess, &prompt[..prompt.len().min(8)], Logits::Last, &mut logits)?;
        let t = Instant::now();
        for _ in 0..a.tg {
            let next = argmax(&logits);
            e.model.eval(&mut sess, &[next], Logits::Last, &mut logits)?;
        }
        let dt = t.elapsed().as_secs_f64();
        if rep > 0 {
            tg_tok_s.push(a.tg as f64 / dt);
        }
    }
    let spec = match a.spec.to_config()? {
        None => None,
        Some(sc) => {
            // The pseudo-text never repeats; the drafter needs repetition, so the prompt is a
            // 16-token phrase said three times.
            let phrase = &prompt[..prompt.len().min(16)];
            let p: Vec<u32> = phrase.iter().chain(phrase).chain(phrase).copied().collect();
            let run = super::generate::spec_generate(e, &p, a.tg, sc, a.spec.mtp.as_deref())?;
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
    let gpu_decode_profile = gpu_profile(e, &prompt[..prompt.len().min(8)], a.tg.min(8))?;
    Ok(BenchResult {
        device: e.model.backend(),
        gpu_decode_profile,
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
    })
}

/// Decodes `steps` tokens after `prompt` with the device counters on (software device only).
#[cfg(feature = "gpu")]
fn gpu_profile(e: &Engine, prompt: &[u32], steps: usize) -> Result<Option<Vec<GpuPart>>> {
    use crate::engine::AnyModel;
    let AnyModel::Gpu(m) = &e.model else { return Ok(None) };
    if m.api().info().backend != crate::gpu::device::Device::Emu {
        return Ok(None);
    }
    let mut sess = m.new_session(e.opts.kv, prompt.len() + steps + 1, e.opts.prefill)?;
    let mut logits = Vec::new();
    m.eval(&mut sess, prompt, Logits::Last, &mut logits)?;
    sess.profile = Some(Default::default());
    for _ in 0..steps {
        let next = argmax(&logits);
        m.eval(&mut sess, &[next], Logits::Last, &mut logits)?;
    }
    let p = sess.profile.take().expect("set above");
    let per = |x: u64| x as f64 / p.tokens.max(1) as f64;
    let mut parts: Vec<GpuPart> = p
        .parts
        .iter()
        .map(|(k, v)| GpuPart {
            part: k.to_string(),
            instructions: per(v.launches_instructions),
            global_bytes: per(v.global_bytes),
            ideal_bytes: per(v.ideal_bytes),
        })
        .collect();
    let total = |f: fn(&GpuPart) -> f64, parts: &[GpuPart]| parts.iter().map(f).sum::<f64>();
    parts.push(GpuPart {
        part: "total".into(),
        instructions: total(|p| p.instructions, &parts),
        global_bytes: total(|p| p.global_bytes, &parts),
        ideal_bytes: total(|p| p.ideal_bytes, &parts),
    });
    Ok(Some(parts))
}

#[cfg(not(feature = "gpu"))]
fn gpu_profile(_: &Engine, _: &[u32], _: usize) -> Result<Option<Vec<GpuPart>>> {
    Ok(None)
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = (0usize, f32::NEG_INFINITY);
    for (i, &v) in x.iter().enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0 as u32
}

pub fn run(e: &Engine, a: &BenchArgs) -> Result<()> {
    let r = bench(e, a)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!("model: {} (device {}, {} threads, {}, kv {:?})", r.model, r.device, r.threads, r.cpu_features, e.opts.kv);
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
                println!("  MTP head: {rows} rows ({:.2} per decoded token, prompt included)", rows as f64 / r.tg.max(1) as f64);
            }
        }
        if let Some(parts) = &r.gpu_decode_profile {
            println!("software-device decode profile, per token (global bytes vs the ideal: weights + KV + activations):");
            println!("  {:<10} {:>14} {:>14} {:>14} {:>7}", "part", "instructions", "global bytes", "ideal bytes", "ratio");
            for p in parts {
                println!(
                    "  {:<10} {:>14.0} {:>14.0} {:>14.0} {:>7.3}",
                    p.part,
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
