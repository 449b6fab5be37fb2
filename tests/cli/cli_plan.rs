//! `strata plan`: the VRAM split and projected decode speed of a MoE model, without a GPU. The
//! built-in Flash-Next IQ3_XXS shape on an RX 7900 XTX is checked against the C++ engine's
//! published cache size on that card (11,142 experts, 232 per layer, with int8 KV and 1 GiB
//! reserved: docs/expert-tiering.md); more VRAM never gives fewer slots or a slower
//! token; a model file is read by its header; bad input is an error, not a panic.

use std::process::Command;

use crate::models::models_util::{gemma_path, reference};

fn plan(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_strata")).arg("plan").args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(args: &[&str]) -> serde_json::Value {
    let (ok, out, err) = plan(&[args, &["--json", "--tokens", "1000"]].concat());
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn plan_qwen4exp_on_a_7900_xtx_holds_about_as_many_experts_as_the_cpp_engine() {
    let v = json(&["--kv", "int8"]);
    let slots = v["slots_per_layer"].as_u64().unwrap();
    assert!((209..=255).contains(&slots), "{slots} slots per layer, the C++ engine 232: {v}");
    let (hit, st) = (v["hit_rate"]["used"].as_f64().unwrap(), v["hit_rate"]["static"].as_f64().unwrap());
    assert!(hit > st && hit < 1.0, "the adaptive cache beats the static profile on Flash-Next's locality: {v}");
    assert!(v["tokens_per_s"].as_f64().unwrap() > 0.0 && v["fits_ram"].as_bool() == Some(true), "{v}");
    // More VRAM: at least as many slots, and a token no slower.
    let big = json(&["--kv", "int8", "--vram-gib", "48"]);
    assert!(big["slots_per_layer"].as_u64() > Some(slots), "{big}");
    assert!(big["token_ms"].as_f64() <= v["token_ms"].as_f64(), "{big}\n{v}");
    // The text form says the same.
    let (ok, out, err) = plan(&["--kv", "int8", "--tokens", "1000"]);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("experts: {slots} of 512 per layer")) && out.contains("tokens/s"), "{out}");
}

#[test]
fn plan_reads_a_model_header_and_refuses_bad_input() {
    let moe = reference("tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf");
    let v = json(&[
        "-m",
        moe.to_str().unwrap(),
        "--vram-gib",
        "0.002",
        "--vram-reserve-mib",
        "0",
        "--extra-mib",
        "0",
        "--max-context",
        "64",
    ]);
    let slots = v["slots_per_layer"].as_u64().unwrap();
    assert!(slots > 0 && slots < 8, "2 MiB holds some of the 8 experts of each layer: {v}");
    let (ok, _, err) = plan(&["-m", gemma_path().to_str().unwrap()]);
    assert!(!ok && err.contains("not a MoE model") && !err.contains("panicked"), "{err}");
    let (ok, _, err) = plan(&["--gpu-efficiency", "1.5"]);
    assert!(!ok && err.contains("--gpu-efficiency"), "{err}");
    let (ok, _, err) = plan(&["-m", "/nonexistent.gguf"]);
    assert!(!ok && err.contains("/nonexistent.gguf"), "{err}");
}
