//! `--device` end to end through the binary: `generate --device emu` prints the same greedy
//! text as `--device cpu` (and as llama.cpp) on the synthetic MoE models of
//! testdata/reference/tiny-qwen3moe; `--device hip` fails over with a clear message where there
//! is no ROCm; `bench --device emu` reports the per-part decode profile.

use crate::models::models_util::{read_json, reference};
use crate::support::strata_cmd as strata;

fn generate(model: &str, device: &str, prompt: &str, n: usize) -> String {
    let m = reference(&format!("tiny-qwen3moe/tiny-qwen3moe-v1024-{model}.gguf"));
    let out = strata()
        .args([
            "generate",
            "-m",
            m.to_str().unwrap(),
            "-p",
            prompt,
            "-n",
            &n.to_string(),
            "--temp",
            "0",
            "--device",
            device,
        ])
        .output()
        .expect("running strata");
    assert!(out.status.success(), "generate --device {device} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn cli_generate_device_emu_equals_cpu_on_tiny_moe() {
    for model in ["q8_0", "mixed"] {
        let g = read_json(&format!("tiny-qwen3moe/ref-{model}/greedy.json"));
        let prompt = g["results"][1]["prompt"].as_str().unwrap().to_string();
        let cpu = generate(model, "cpu", &prompt, 16);
        let emu = generate(model, "emu", &prompt, 16);
        eprintln!("{model}: cpu {cpu:?}\n{model}: emu {emu:?}");
        assert_eq!(emu, cpu, "{model}: --device emu and --device cpu disagree");
    }
}

#[test]
fn cli_device_hip_fails_over_cleanly_without_rocm() {
    if strata::gpu::device::open_device(strata::gpu::device::Device::Hip).is_ok() {
        eprintln!("a HIP device is present: nothing to check here");
        return;
    }
    let m = reference("tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf");
    let out = strata()
        .args(["generate", "-m", m.to_str().unwrap(), "-p", "hi", "-n", "2", "--device", "hip"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--device hip") && err.contains("libamdhip64"), "unclear error: {err}");
    assert!(!err.contains("panicked"), "{err}");
    // auto: the CPU, without noise when ROCm is simply absent.
    let out = strata()
        .args(["generate", "-m", m.to_str().unwrap(), "-p", "hi", "-n", "2", "--temp", "0", "--device", "auto"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn cli_bench_device_emu_reports_decode_profile() {
    let m = reference("tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf");
    let out = strata()
        .args([
            "bench",
            "-m",
            m.to_str().unwrap(),
            "--device",
            "emu",
            "--pp",
            "8",
            "--tg",
            "2",
            "--reps",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["device"].as_str().unwrap().starts_with("emu"), "{v}");
    let parts = v["gpu_decode_profile"].as_array().expect("profile on emu");
    let names: Vec<&str> = parts.iter().map(|p| p["part"].as_str().unwrap()).collect();
    for want in ["embed", "attention", "moe", "head", "total"] {
        assert!(names.contains(&want), "missing part {want}: {names:?}");
    }
    for p in parts {
        let (g, i) = (p["global_bytes"].as_f64().unwrap(), p["ideal_bytes"].as_f64().unwrap());
        // Every part reads at least its weights once: fewer bytes than ideal means a miscount.
        assert!(g >= 0.9 * i && i > 0.0, "{p}");
        assert!(p["instructions"].as_f64().unwrap() > 0.0, "{p}");
    }
}

/// Flash-Next's device forward pass reports one row per operation of its program (GR read /
/// write, GDN, QSA, MoE, PLE, embed, head), each moving at least its weights once.
#[test]
fn cli_bench_device_emu_reports_qwen4exp_profile() {
    let m = reference("tiny-qwen4exp/tiny-qwen4exp-public-f32.gguf");
    let out = strata()
        .args([
            "bench",
            "-m",
            m.to_str().unwrap(),
            "--device",
            "emu",
            "--pp",
            "8",
            "--tg",
            "2",
            "--reps",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let parts = v["gpu_decode_profile"].as_array().expect("profile on emu");
    let names: Vec<&str> = parts.iter().map(|p| p["part"].as_str().unwrap()).collect();
    for want in ["embed", "gr read", "gdn", "qsa", "gr write", "moe", "ple", "head", "total"] {
        assert!(names.contains(&want), "missing part {want}: {names:?}");
    }
    for p in parts {
        let (g, i) = (p["global_bytes"].as_f64().unwrap(), p["ideal_bytes"].as_f64().unwrap());
        assert!(g >= 0.9 * i && i > 0.0, "{p}");
        assert!(p["instructions"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["launches"].as_f64().unwrap() >= 1.0, "{p}");
    }
    // Launch counts follow the program: one `get_rows` for the embedding, one `gr_combine` per
    // GR write (2 per layer of the 4-layer fixture).
    let launches = |part: &str| parts.iter().find(|p| p["part"] == part).unwrap()["launches"].as_f64().unwrap();
    assert_eq!((launches("embed"), launches("gr write")), (1.0, 8.0), "{parts:?}");
}
