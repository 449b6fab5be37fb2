//! The `strata` binary end to end on the default model: help, generate (greedy text equal to
//! llama.cpp's), tokenize, logits (.npy), bench, and the clear errors.

use crate::models::models_util::{gemma_path, ids, read_json};
use crate::support::strata_cmd as strata;

fn run_ok(args: &[&str]) -> String {
    let out = strata().args(args).output().expect("running strata");
    assert!(out.status.success(), "strata {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

#[test]
fn cli_help_documents_every_command_and_flag() {
    let top = run_ok(&["--help"]);
    for cmd in [
        "generate",
        "perplexity",
        "tokenize",
        "logits",
        "bench",
        "server",
        "--serve",
        "--threads",
        "--kv",
        "--prefill",
        "--max-context",
        "--model",
    ] {
        assert!(top.contains(cmd), "--help lacks {cmd}:\n{top}");
    }
    let gen_help = run_ok(&["generate", "--help"]);
    for flag in [
        "--prompt",
        "--n-predict",
        "--temp",
        "--top-k",
        "--top-p",
        "--min-p",
        "--repeat-penalty",
        "--repeat-last-n",
        "--seed",
        "--chat",
    ] {
        assert!(gen_help.contains(flag), "generate --help lacks {flag}");
    }
}

#[test]
fn cli_generate_greedy_prints_llama_cpp_text() {
    let g = read_json("gemma3-270m-q4_k_m/reference.json");
    // Prompt 2: prompt 1 reaches a near tie of llama.cpp at token 11 (see models_gemma3).
    let r = &g["greedy"][1];
    let m = gemma_path();
    let out = run_ok(&[
        "generate",
        "-m",
        m.to_str().unwrap(),
        "-p",
        r["prompt"].as_str().unwrap(),
        "-n",
        "16",
        "--temp",
        "0",
        "--threads",
        "2",
    ]);
    // generate ends its output with one newline.
    assert_eq!(out.strip_suffix('\n').unwrap_or(&out), r["text16"].as_str().unwrap());
}

#[test]
fn cli_tokenize_and_logits() {
    let g = read_json("gemma3-270m-q4_k_m/reference.json");
    let r = &g["greedy"][1];
    let m = gemma_path();
    let m = m.to_str().unwrap();
    let out = run_ok(&["tokenize", "-m", m, "-p", r["prompt"].as_str().unwrap()]);
    let got: Vec<u32> = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(got, ids(&r["prompt_ids"]));
    let npy = std::env::temp_dir().join(format!("strata-cli-logits-{}.npy", std::process::id()));
    run_ok(&["logits", "-m", m, "--tokens", "2,818,5279", "--out", npy.to_str().unwrap()]);
    let (shape, data) = strata::npy::read_f32(&npy).unwrap();
    assert_eq!(shape, vec![3, 262_144]);
    assert!(data.iter().all(|x| x.is_finite()));
    let _ = std::fs::remove_file(npy);
}

/// The C++ engine's model flag `--native` is `-m` (its serve line works unchanged, issue 38), and
/// its `--pack DIR` is refused with the advice to drop it, never silently ignored.
#[test]
fn cli_takes_the_cpp_engine_model_flags() {
    let g = read_json("gemma3-270m-q4_k_m/reference.json");
    let r = &g["greedy"][1];
    let m = gemma_path();
    let out = run_ok(&["tokenize", "--native", m.to_str().unwrap(), "-p", r["prompt"].as_str().unwrap()]);
    let got: Vec<u32> = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(got, ids(&r["prompt_ids"]));
    let out =
        strata().args(["tokenize", "-m", m.to_str().unwrap(), "--pack", "packs/iq3xxs", "-p", "x"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--pack packs/iq3xxs: Strata reads the experts directly from the GGUF model file"), "{err}");
}

#[test]
fn cli_errors_are_clear() {
    let m = gemma_path();
    let m = m.to_str().unwrap();
    let out = strata()
        .args(["generate", "-m", m, "-p", "one two three four five six", "-n", "4", "--max-context", "4"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("context") && err.contains("--max-context"), "{err}");
    let out = strata().args(["generate", "-m", "/nonexistent.gguf", "-p", "x"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.gguf"));
    let out = strata().args(["generate", "-m", m, "-p", "x", "--top-p", "0"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--top-p"));
}

#[test]
fn cli_bench_reports_json() {
    let m = gemma_path();
    let out = run_ok(&["bench", "-m", m.to_str().unwrap(), "--pp", "32", "--tg", "4", "--reps", "1", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["pp_median"].as_f64().unwrap() > 0.0);
    assert!(v["tg_median"].as_f64().unwrap() > 0.0);
    assert!(v["peak_rss_mb"].as_f64().unwrap() > 0.0);
}

/// `bench --profile` times every decoder operation (each decode step runs the head once and the
/// Q/K/V projection once per layer; the rows add up to the step) and `--roofline` counts the
/// bytes of a decode step as the GGUF's own tensor table gives them: every tensor once (the
/// tied token embedding is the output head), one embedding row, and the f16 K/V cache.
#[test]
fn cli_bench_profile_and_roofline() {
    let m = gemma_path();
    let (tg, pp) = (6usize, 16usize);
    let out = run_ok(&[
        "bench",
        "-m",
        m.to_str().unwrap(),
        "--pp",
        &pp.to_string(),
        "--tg",
        &tg.to_string(),
        "--reps",
        "1",
        "--json",
        "--profile",
        "--roofline",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let g = gguf::GgufFile::open(&m).unwrap();
    let n_layer = g.tensors().iter().filter(|t| t.name.ends_with("attn_q.weight")).count();
    let op = |prof: &serde_json::Value, name: &str| {
        prof.as_array()
            .unwrap()
            .iter()
            .find(|p| p["op"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {prof}"))
    };
    let dec = &v["cpu_decode_profile"];
    assert_eq!(op(dec, "head (norm, output)")["calls_per_token"].as_f64().unwrap(), 1.0);
    assert_eq!(op(dec, "project q,k,v")["calls_per_token"].as_f64().unwrap(), n_layer as f64);
    assert_eq!(op(dec, "attend")["calls_per_token"].as_f64().unwrap(), n_layer as f64);
    let shares: f64 = dec.as_array().unwrap().iter().map(|p| p["share"].as_f64().unwrap()).sum();
    assert!((shares - 1.0).abs() < 1e-6, "shares sum to {shares}");
    let pre = &v["cpu_prompt_profile"];
    assert!(op(pre, "glu (gate, up, act)")["ms_per_token"].as_f64().unwrap() > 0.0);

    let emb = g.tensor("token_embd.weight").unwrap();
    let tied = g.tensor("output.weight").is_none();
    let all: usize = g.tensors().iter().map(|t| t.n_bytes).sum();
    let row = emb.n_bytes / emb.dims[1] as usize;
    let weights = if tied { all + row } else { all - emb.n_bytes + row };
    let kv_per_pos: u64 = 2
        * n_layer as u64
        * g.get_u32("gemma3.attention.head_count_kv").unwrap() as u64
        * g.get_u32("gemma3.attention.key_length").unwrap() as u64;
    let pos = 8 + tg / 2;
    let want = weights as f64 + (kv_per_pos * pos as u64 * 2) as f64;
    let rl = &v["roofline"];
    assert_eq!(rl["decode_bytes_per_token"].as_f64().unwrap(), want);
    assert!(rl["read_gb_s"].as_f64().unwrap() > 0.1);
    let share = rl["share"].as_f64().unwrap();
    assert!((share - v["tg_median"].as_f64().unwrap() / rl["roofline_tok_s"].as_f64().unwrap()).abs() < 1e-9);
}
