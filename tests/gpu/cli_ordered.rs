//! `--ordered` end to end through the binary: with it, `--device emu` and `--device cpu`
//! write byte-identical logits files (`strata logits`) and print the same greedy text
//! (`strata generate`) on the llama.cpp-written tiny-qwen3moe models (Q8_0; mixed F16/Q8_0;
//! F32), and the old flag name `--ordered-attention` does the same; likewise on the tiny
//! Flash-Next (qwen4exp) fixtures, f32 and two-shard Q8_0, over llama.cpp's 300-token sequence
//! (the QSA indexer's sparse selection).

use crate::models::models_util::{read_json, reference};
use crate::support::strata_cmd as strata;

fn model(name: &str) -> String {
    reference(&format!("tiny-qwen3moe/tiny-qwen3moe-v1024-{name}.gguf")).to_str().unwrap().to_string()
}

fn logits(name: &str, device: &str, flag: &str) -> Vec<u8> {
    let out_path =
        std::env::temp_dir().join(format!("strata-cli-ordered-{}-{name}-{device}{flag}.npy", std::process::id()));
    let mut cmd = strata();
    cmd.args(["logits", "-m", &model(name), "--tokens", "1,5,9,300,17,44,2,8,900,31,7", "--device", device]);
    if !flag.is_empty() {
        cmd.arg(flag);
    }
    let out = cmd.arg("--out").arg(&out_path).output().expect("running strata");
    assert!(out.status.success(), "logits --device {device} {flag} failed: {}", String::from_utf8_lossy(&out.stderr));
    let b = std::fs::read(&out_path).unwrap();
    let _ = std::fs::remove_file(&out_path);
    b
}

#[test]
fn cli_ordered_logits_emu_bit_identical_to_cpu() {
    for name in ["q8_0", "mixed", "f32"] {
        let cpu = logits(name, "cpu", "--ordered");
        let emu = logits(name, "emu", "--ordered");
        assert!(cpu.len() > 11 * 1024 * 4, "{name}: short file");
        assert!(cpu == emu, "{name}: --ordered logits of --device emu and --device cpu differ");
        // The default modes are not bit-identical (what the mode is for).
        let fast = logits(name, "emu", "");
        eprintln!("{name}: --ordered emu == cpu ({} bytes); default emu == ordered cpu: {}", cpu.len(), fast == cpu);
    }
    assert!(logits("q8_0", "emu", "--ordered-attention") == logits("q8_0", "cpu", "--ordered"), "alias");
}

#[test]
fn cli_ordered_generate_emu_equals_cpu() {
    for name in ["q8_0", "mixed"] {
        let g = read_json(&format!("tiny-qwen3moe/ref-{name}/greedy.json"));
        let prompt = g["results"][0]["prompt"].as_str().unwrap().to_string();
        let run = |device: &str| {
            let out = strata()
                .args([
                    "generate",
                    "-m",
                    &model(name),
                    "-p",
                    &prompt,
                    "-n",
                    "16",
                    "--temp",
                    "0",
                    "--device",
                    device,
                    "--ordered",
                ])
                .output()
                .expect("running strata");
            assert!(
                out.status.success(),
                "generate --device {device} --ordered: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let (cpu, emu) = (run("cpu"), run("emu"));
        eprintln!("{name}: cpu {cpu:?}\n{name}: emu {emu:?}");
        assert!(!cpu.trim().is_empty());
        assert_eq!(emu, cpu, "{name}: --ordered --device emu and --device cpu disagree");
    }
}

/// Flash-Next: `strata logits --ordered` of llama.cpp's 300-token sequence (sparse selection)
/// and `strata generate --temp 0 --ordered` are byte-identical on `--device emu` and `--device
/// cpu`, for the f32 and the two-shard Q8_0 fixtures.
#[test]
fn cli_ordered_qwen4exp_emu_bit_identical_to_cpu() {
    for (file, variant) in [
        ("tiny-qwen4exp-public-f32.gguf", "f32"),
        ("tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf", "q8_0-split"),
    ] {
        let m = reference(&format!("tiny-qwen4exp/{file}")).to_str().unwrap().to_string();
        let r = read_json(&format!("tiny-qwen4exp/ref/{variant}/ref.json"));
        let csv =
            |s: &serde_json::Value| s.as_array().unwrap().iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",");
        let (seq3, seq1) = (csv(&r["sequences"][2]["token_ids"]), csv(&r["sequences"][0]["token_ids"]));
        assert_eq!(seq3.split(',').count(), 300, "{variant}: seq3");
        let logits = |device: &str| {
            let out_path = std::env::temp_dir()
                .join(format!("strata-cli-ordered-q4-{}-{variant}-{device}.npy", std::process::id()));
            let out = strata()
                .args(["logits", "-m", &m, "--tokens", &seq3, "--device", device, "--ordered", "--out"])
                .arg(&out_path)
                .output()
                .expect("running strata");
            assert!(
                out.status.success(),
                "{variant}: logits --device {device} --ordered: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let b = std::fs::read(&out_path).unwrap();
            let _ = std::fs::remove_file(&out_path);
            b
        };
        let (cpu, emu) = (logits("cpu"), logits("emu"));
        assert!(cpu.len() > 300 * 4, "{variant}: short file");
        assert!(cpu == emu, "{variant}: --ordered logits of --device emu and --device cpu differ");
        let generate = |device: &str| {
            let out = strata()
                .args([
                    "generate",
                    "-m",
                    &m,
                    "--tokens",
                    &seq1,
                    "-n",
                    "24",
                    "--temp",
                    "0",
                    "--show-ids",
                    "--device",
                    device,
                    "--ordered",
                ])
                .output()
                .expect("running strata");
            assert!(
                out.status.success(),
                "{variant}: generate --device {device} --ordered: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            let ids =
                err.lines().find(|l| l.starts_with("ids: ")).unwrap_or_else(|| panic!("no ids in {err}")).to_string();
            (String::from_utf8_lossy(&out.stdout).into_owned(), ids)
        };
        let (cpu, emu) = (generate("cpu"), generate("emu"));
        eprintln!("{variant}: logits identical; greedy {}", emu.1);
        assert_eq!(emu, cpu, "{variant}: --ordered generate on --device emu and --device cpu");
    }
}
