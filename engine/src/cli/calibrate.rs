//! `strata calibrate`: measure hipBLASLt algorithms for the dense GEMM shapes of a model (or a
//! built-in list) on the present device and write the calibration table (gpu/calibrate.rs).

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

use super::Common;

#[derive(Args, Debug, Clone)]
pub struct CalibrateArgs {
    /// Where to write the table (default: ~/.cache/strata/calibration/<arch>-hipblaslt-<version>.json,
    /// which generate/bench/serve then load by default).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Token counts T to measure (comma separated); a GEMM of t tokens uses the row of the
    /// smallest measured T >= t (the largest beyond it).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128,512")]
    pub tokens: Vec<usize>,
    /// Timed runs per candidate (the median is kept).
    #[arg(long, default_value_t = 10)]
    pub reps: usize,
    /// Untimed runs per candidate before timing.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Most candidate algorithms asked from hipBLASLt's heuristic per problem.
    #[arg(long, default_value_t = 16)]
    pub max_candidates: usize,
    /// Operand types to measure (f32, f16, bf16; comma separated). Default: f32 with -m (the
    /// device runs dense layers as f32 GEMMs), f16,bf16,f32 for the built-in shape list.
    #[arg(long, value_delimiter = ',')]
    pub dtype: Vec<String>,
    /// Print the table rows as JSON on stdout instead of the text summary.
    #[arg(long)]
    pub json: bool,
}

#[cfg(not(feature = "gpu"))]
pub fn run(_c: &Common, _a: &CalibrateArgs) -> Result<()> {
    bail!("`strata calibrate` needs a build with GPU support (cargo build --features gpu)")
}

#[cfg(feature = "gpu")]
pub fn run(c: &Common, a: &CalibrateArgs) -> Result<()> {
    use crate::engine::Device;
    use anyhow::Context;
    use gpu_executor::calibrate::{self as cal, CalibrateOptions};
    use gpu_executor::device::{DType, open_device_with};

    if a.tokens.is_empty() || a.tokens.contains(&0) {
        bail!("--tokens must be positive token counts, e.g. 1,8,32,128,512");
    }
    if a.reps == 0 {
        bail!("--reps must be >= 1");
    }
    let mut dtypes = Vec::new();
    for d in &a.dtype {
        match cal::parse_dtype(d) {
            Some(t) => dtypes.push(t),
            None => bail!("--dtype {d:?}: expected f32, f16 or bf16"),
        }
    }
    let kind = match c.run.device {
        Device::Hip | Device::Auto => Device::Hip,
        Device::Emu => Device::Emu,
        Device::Cpu => bail!("`strata calibrate` measures a GPU: use --device hip (or emu for the software device)"),
    };
    let shapes = match &c.model {
        Some(path) => {
            let model = model::Decoder::load(path).with_context(|| format!("loading {}", path.display()))?;
            cal::model_shapes(&model, &dtypes)
        }
        None if kind == Device::Emu => {
            bail!(
                "the built-in shapes (up to 12288x4096) would take hours on the software device: give -m MODEL (a small one)"
            )
        }
        None => cal::builtin_shapes(if dtypes.is_empty() { &[DType::F16, DType::BF16, DType::F32] } else { &dtypes }),
    };
    if shapes.is_empty() {
        bail!("the model has no dense projection that uses the GEMM path: nothing to calibrate");
    }
    let api =
        open_device_with(kind, &c.run.gpu).map_err(|e| anyhow::anyhow!("--device {}: {e}", c.run.device.name()))?;
    let info = api.info().clone();
    let Some(ver) = info.blas_lt_version.clone() else {
        bail!(
            "{} has no usable hipBLASLt ({}): nothing to calibrate",
            info.name,
            info.blas_lt.as_deref().unwrap_or("libhipblaslt not found")
        );
    };
    let out = match &a.out {
        Some(p) => p.clone(),
        None => cal::default_path(&info.arch, &ver)
            .context("no home directory for the default table location: use --out")?,
    };
    let opts = CalibrateOptions {
        tokens: a.tokens.clone(),
        reps: a.reps,
        warmup: a.warmup,
        max_candidates: a.max_candidates.max(1),
    };
    let total: usize = shapes.iter().map(|s| opts.tokens.iter().filter(|&&t| t >= s.min_t).count()).sum();
    eprintln!(
        "calibrating {} shapes x {} token counts on {} ({}), hipBLASLt {ver}",
        shapes.len(),
        opts.tokens.len(),
        info.name,
        gpu_executor::device::arch_base(&info.arch)
    );
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let b = indicatif::ProgressBar::new(total as u64);
        if let Ok(st) = indicatif::ProgressStyle::with_template("[{bar:40}] {pos}/{len} {msg}") {
            b.set_style(st);
        }
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let (table, reports) = cal::calibrate(&*api, &shapes, &opts, &mut |r| {
        bar.set_message(format!("{} N={} K={} T={}", cal::dtype_name(r.shape.dtype), r.shape.n, r.shape.k, r.t));
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    table.save(&out)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&table.rows)?);
    } else {
        println!(
            "{:<5} {:>6} {:>6} {:>5} {:>5} {:>8} {:>6} {:>12} {:>12}",
            "dtype", "N", "K", "T", "cands", "rejected", "algo", "best_us", "hipblas_us"
        );
        for r in &reports {
            match &r.row {
                Some(w) => println!(
                    "{:<5} {:>6} {:>6} {:>5} {:>5} {:>8} {:>6} {:>12.2} {:>12}",
                    w.dtype,
                    w.n,
                    w.k,
                    w.t,
                    w.candidates,
                    w.rejected,
                    w.algo_index,
                    w.median_us,
                    w.hipblas_us.map_or("-".into(), |u| format!("{u:.2}"))
                ),
                None => println!(
                    "{:<5} {:>6} {:>6} {:>5}   no row (hipBLAS): {}",
                    cal::dtype_name(r.shape.dtype),
                    r.shape.n,
                    r.shape.k,
                    r.t,
                    r.why_none.as_deref().unwrap_or("")
                ),
            }
        }
    }
    eprintln!("wrote {} ({} rows)", out.display(), table.rows.len());
    Ok(())
}
