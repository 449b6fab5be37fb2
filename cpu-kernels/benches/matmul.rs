//! Kernel benchmark: matvec GB/s (of weights) and matmul GFLOPS per weight type and path.
//!
//! `cargo bench -p cpu-kernels [-- FILTER...]`; a FILTER is matched against the row label
//! (e.g. `q4_K`, `matmul`, `dram`, `avx2`). Median of several runs after a warm-up; threads =
//! rayon's default (all cores). Weights: 64 rows quantized from random data by `quant`'s
//! reference quantizer, repeated to the full size (the kernels' speed does not depend on the
//! values, and the slow reference quantizers would dominate the run otherwise).

use cpu_kernels::{Gemm, GgmlType, Path, QTensor, try_matmul_gemm, try_matmul_with};
use std::time::Instant;

fn weights(ty: GgmlType, rows: usize, k: usize) -> Vec<u8> {
    let rb = ty.row_bytes(k).unwrap();
    let base_rows = 64.min(rows);
    let mut seed = 0x1234_5678u64;
    let mut base = vec![0u8; base_rows * rb];
    let mut row = vec![0f32; k];
    if !ty.has_quantizer() {
        // Read-only types: random bytes (speed does not depend on the values).
        for b in base.iter_mut() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *b = (seed >> 32) as u8;
        }
    }
    for r in (0..base_rows).filter(|_| ty.has_quantizer()) {
        for v in row.iter_mut() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *v = ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
        }
        quant::quantize_row(ty, &row, &mut base[r * rb..(r + 1) * rb]).unwrap();
    }
    let mut w = Vec::with_capacity(rows * rb);
    while w.len() < rows * rb {
        let take = (rows * rb - w.len()).min(base.len());
        w.extend_from_slice(&base[..take]);
    }
    w
}

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}
unsafe extern "C" {
    fn clock_gettime(clk: i32, tp: *mut Timespec) -> i32;
}
const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

/// This thread's CPU time in seconds: unlike wall time it does not count time the shared,
/// often oversubscribed VM gave to other processes.
fn thread_cpu_secs() -> f64 {
    let mut t = Timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec (two i64 on x86_64 Linux) into `t`.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
    if rc != 0 {
        return f64::NAN;
    }
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// (median wall seconds, best wall seconds) over `runs` after a warm-up.
fn time_wall(mut f: impl FnMut(), runs: usize) -> (f64, f64) {
    f(); // warm-up (page faults, rayon pool)
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (t[t.len() / 2], t[0])
}

/// Best single-thread CPU seconds over `runs` (run on a 1-thread pool, measured inside it).
fn time_1t_cpu(pool: &rayon::ThreadPool, mut f: impl FnMut() + Send, runs: usize) -> f64 {
    pool.install(|| {
        f();
        (0..runs)
            .map(|_| {
                let s = thread_cpu_secs();
                f();
                thread_cpu_secs() - s
            })
            .fold(f64::INFINITY, f64::min)
    })
}

fn main() {
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let wanted = |label: &str| filters.is_empty() || filters.iter().all(|f| label.contains(f.as_str()));
    let types = [
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Q5_0,
        GgmlType::F32,
        GgmlType::IQ3XXS,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
        GgmlType::Q5K,
        GgmlType::IQ4NL,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::IQ4XS,
        GgmlType::IQ3S,
        GgmlType::IQ2XXS,
        GgmlType::IQ2XS,
        GgmlType::IQ2S,
        GgmlType::IQ1S,
        GgmlType::IQ1M,
    ];
    let paths: Vec<Path> = Path::all_available().into_iter().filter(|p| *p != Path::Portable).collect();
    println!("threads: {}, cpu_features: {}", rayon::current_num_threads(), cpu_kernels::cpu_features());
    let pool1 = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    println!("2t = all threads, wall clock (median / best); 1t cpu = one thread, CPU time (best)");
    println!(
        "{:<40} {:>9} {:>8} {:>8} {:>9} | {:>8} {:>9}",
        "case", "2t ms", "GB/s", "best", "GFLOPS", "1t GB/s", "1t GFLOPS"
    );
    let k = 4096;
    for &ty in &types {
        for (rows, tag) in [(4096usize, "4096x4096"), (32768, "32768x4096 dram")] {
            let any = paths.iter().any(|p| wanted(&format!("matvec {} {tag} {p:?}", ty.name())));
            if !any {
                continue;
            }
            let w = weights(ty, rows, k);
            let t = QTensor { ty, data: &w, rows, cols: k };
            let x: Vec<f32> = (0..k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
            let mut y = vec![0f32; rows];
            for &p in &paths {
                let label = format!("matvec {} {tag} {p:?}", ty.name());
                if !wanted(&label) {
                    continue;
                }
                let runs = if rows > 4096 { 15 } else { 41 };
                let (s, best) = time_wall(|| try_matmul_with(p, &t, &x, 1, &mut y).unwrap(), runs);
                let c1 = time_1t_cpu(&pool1, || try_matmul_with(p, &t, &x, 1, &mut y).unwrap(), runs.min(15));
                let gb = w.len() as f64 / 1e9;
                let gf = 2.0 * (rows * k) as f64 / 1e9;
                println!(
                    "{label:<40} {:>9.3} {:>8.1} {:>8.1} {:>9.1} | {:>8.1} {:>9.1}",
                    s * 1e3,
                    gb / s,
                    gb / best,
                    gf / s,
                    gb / c1,
                    gf / c1
                );
            }
        }
    }
    // Shapes of the default model (Gemma 3 270M: d_model 640, FFN 2048, vocab 262144; tensors
    // with K = 640 are Q8_0/Q5_0 since 640 is not a multiple of 256) and of Qwen2.5-Coder-0.5B
    // Q4_K_M (d_model 896, FFN 4864: gate/up and attention in Q5_0/Q8_0, down in Q4_K/Q6_K).
    // SmolLM2-135M Q4_1: d_model 576, FFN 1536.
    let shapes: [(&str, GgmlType, usize, usize, &str); 12] = [
        ("gemma", GgmlType::Q8_0, 262144, 640, "output"),
        ("gemma", GgmlType::Q5_0, 2048, 640, "ffn_up"),
        ("gemma", GgmlType::Q8_0, 2048, 640, "ffn_up"),
        ("gemma", GgmlType::Q4K, 640, 2048, "ffn_down"),
        ("gemma", GgmlType::Q6K, 640, 2048, "ffn_down"),
        ("qwen2.5", GgmlType::Q5_0, 4864, 896, "ffn_up"),
        ("qwen2.5", GgmlType::Q8_0, 896, 896, "attn_q"),
        ("qwen2.5", GgmlType::Q4K, 896, 4864, "ffn_down"),
        ("qwen2.5", GgmlType::Q6K, 896, 4864, "ffn_down"),
        ("smollm2", GgmlType::Q4_1, 1536, 576, "ffn_up"),
        ("smollm2", GgmlType::Q4_1, 576, 1536, "ffn_down"),
        ("smollm2", GgmlType::Q4_1, 576, 576, "attn_q"),
    ];
    for (model, ty, rows, k, what) in shapes {
        for n in [1usize, 512] {
            if n == 512 && rows > 8192 {
                continue;
            }
            // Also with the row tiles (`Gemm::Tiles`, label suffix "tiles") where they apply.
            let modes: &[(Gemm, &str)] = if Gemm::tiles_apply(ty, n) {
                &[(Gemm::Lanes, ""), (Gemm::Tiles, " tiles")]
            } else {
                &[(Gemm::Lanes, "")]
            };
            let cases: Vec<(Path, Gemm, String)> = paths
                .iter()
                .flat_map(|&p| {
                    modes.iter().map(move |&(g, sfx)| {
                        (p, g, format!("{model} {what} {} {rows}x{k} n={n} {p:?}{sfx}", ty.name()))
                    })
                })
                .collect();
            let labels: Vec<&String> = cases.iter().map(|c| &c.2).collect();
            if !labels.iter().any(|l| wanted(l)) {
                continue;
            }
            let w = weights(ty, rows, k);
            let t = QTensor { ty, data: &w, rows, cols: k };
            let x: Vec<f32> = (0..n * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
            let mut y = vec![0f32; rows * n];
            for (p, g, label) in &cases {
                let (p, g) = (*p, *g);
                if !wanted(label) {
                    continue;
                }
                let runs = if n == 1 { 21 } else { 5 };
                let (s, best) = time_wall(|| try_matmul_gemm(p, g, &t, &x, n, &mut y).unwrap(), runs);
                let c1 = time_1t_cpu(&pool1, || try_matmul_gemm(p, g, &t, &x, n, &mut y).unwrap(), runs.min(7));
                let gb = w.len() as f64 / 1e9;
                let gf = 2.0 * (rows * k * n) as f64 / 1e9;
                println!(
                    "{label:<40} {:>9.3} {:>8.1} {:>8.1} {:>9.1} | {:>8.1} {:>9.1}",
                    s * 1e3,
                    gb / s,
                    gb / best,
                    gf / s,
                    gb / c1,
                    gf / c1
                );
            }
        }
    }
    // The exact (llama.cpp float order) kernels Gemma 3 runs, `matmul_ggml`, per path (the
    // portable path is the scalar definition). n = 1 decode, 4 (< 8: K-quants exact), 512 prompt.
    let ggml_shapes: [(GgmlType, usize, usize, &str); 6] = [
        (GgmlType::Q8_0, 262144, 640, "output"),
        (GgmlType::Q5_0, 2048, 640, "ffn_up"),
        (GgmlType::Q5_0, 1024, 640, "attn_q"),
        (GgmlType::Q8_0, 256, 640, "attn_v"),
        (GgmlType::Q4K, 640, 2048, "ffn_down"),
        (GgmlType::Q6K, 640, 2048, "ffn_down"),
    ];
    let all_paths = Path::all_available();
    for (ty, rows, k, what) in ggml_shapes {
        for n in [1usize, 4, 512] {
            if (n > 1 && rows > 4096) || (n == 512 && matches!(ty, GgmlType::Q4K | GgmlType::Q6K)) {
                continue;
            }
            let labels: Vec<String> =
                all_paths.iter().map(|p| format!("ggml {what} {} {rows}x{k} n={n} {p:?}", ty.name())).collect();
            if !labels.iter().any(|l| wanted(l)) {
                continue;
            }
            let w = weights(ty, rows, k);
            let t = QTensor { ty, data: &w, rows, cols: k };
            let x: Vec<f32> = (0..n * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
            let mut y = vec![0f32; rows * n];
            for (&p, label) in all_paths.iter().zip(&labels) {
                if !wanted(label) || (p == Path::Portable && n * rows * k > (1 << 28)) {
                    continue;
                }
                let runs = if n == 1 { 21 } else { 5 };
                let (s, best) = time_wall(|| cpu_kernels::try_matmul_ggml_with(p, &t, &x, n, &mut y).unwrap(), runs);
                let c1 = time_1t_cpu(
                    &pool1,
                    || cpu_kernels::try_matmul_ggml_with(p, &t, &x, n, &mut y).unwrap(),
                    runs.min(7),
                );
                let gb = w.len() as f64 / 1e9;
                let gf = 2.0 * (rows * k * n) as f64 / 1e9;
                println!(
                    "{label:<40} {:>9.3} {:>8.1} {:>8.1} {:>9.1} | {:>8.1} {:>9.1}",
                    s * 1e3,
                    gb / s,
                    gb / best,
                    gf / s,
                    gb / c1,
                    gf / c1
                );
            }
        }
    }
    let n = 512;
    for &ty in &types {
        let any = paths.iter().any(|p| wanted(&format!("matmul {} 4096x4096 n=512 {p:?}", ty.name())));
        if !any {
            continue;
        }
        let rows = 4096;
        let w = weights(ty, rows, k);
        let t = QTensor { ty, data: &w, rows, cols: k };
        let x: Vec<f32> = (0..n * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        let mut y = vec![0f32; rows * n];
        for &p in &paths {
            let label = format!("matmul {} 4096x4096 n=512 {p:?}", ty.name());
            if !wanted(&label) {
                continue;
            }
            let (s, best) = time_wall(|| try_matmul_with(p, &t, &x, n, &mut y).unwrap(), 3);
            let c1 = time_1t_cpu(&pool1, || try_matmul_with(p, &t, &x, n, &mut y).unwrap(), 2);
            let gf = 2.0 * (rows * k * n) as f64 / 1e9;
            println!(
                "{label:<40} {:>9.3} {:>8} {:>8} {:>9.1} | {:>8} {:>9.1}  (best 2t {:.1})",
                s * 1e3,
                "",
                "",
                gf / s,
                "",
                gf / c1,
                gf / best
            );
        }
    }

    // The GPU's CPU pool for one decode token: the gate and up products of the missed experts
    // of a MoE layer (Flash-Next: 2560 -> 640, top-10; a miss share of 4), llama.cpp's order,
    // with the activation quantized per product (as before) and once for the layer
    // (`prepare_acts_as`, the same bits).
    for ty in [GgmlType::IQ3XXS, GgmlType::Q4K, GgmlType::Q8_0] {
        let label = format!("moe misses {} 4x2x640x2560 n=1", ty.name());
        if !wanted(&label) {
            continue;
        }
        let (rows, k, experts) = (640usize, 2560usize, 4usize);
        let w = weights(ty, rows * 2 * experts, k);
        let rb = ty.row_bytes(k).unwrap();
        let mats: Vec<QTensor> = (0..2 * experts)
            .map(|i| QTensor { ty, data: &w[i * rows * rb..(i + 1) * rows * rb], rows, cols: k })
            .collect();
        let x: Vec<f32> = (0..k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        let each = || {
            let mut y = vec![0f32; rows];
            mats.iter().for_each(|t| cpu_kernels::try_matmul_ggml(t, &x, 1, &mut y).unwrap());
        };
        let once = || {
            let mut y = vec![0f32; rows];
            let acts = cpu_kernels::prepare_acts_as(cpu_kernels::ActsFor::Ggml, ty, &x, 1, k).unwrap();
            mats.iter().for_each(|t| cpu_kernels::try_matmul_prepared(t, &acts, &mut y).unwrap());
        };
        let (a, _) = time_wall(each, 41);
        let (b, _) = time_wall(once, 41);
        let (a1, b1) = (time_1t_cpu(&pool1, each, 15), time_1t_cpu(&pool1, once, 15));
        println!(
            "{label:<40} per product {:.1} us, once {:.1} us (2t wall); 1t cpu {:.1} / {:.1} us",
            a * 1e6,
            b * 1e6,
            a1 * 1e6,
            b1 * 1e6
        );
    }
}
