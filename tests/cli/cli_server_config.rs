//! One configuration from the command line to the engine process: `strata server` hands its
//! engine options to the `--serve` child, which reports what it runs with in its hello line
//! (shown by `/health`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::models::models_util::reference;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// GET `path` on loopback; the JSON body, or None while the server is not up.
fn get_json(port: u16, path: &str) -> Option<serde_json::Value> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let body = text.split_once("\r\n\r\n")?.1;
    serde_json::from_str(body).ok()
}

struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn cli_server_passes_its_engine_options_to_the_engine_process() {
    let model = reference("tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf");
    let port = free_port();
    let mut args = vec![
        "server",
        "-m",
        model.to_str().unwrap(),
        "--kv",
        "int8",
        "--max-context",
        "192",
        "--prefill",
        "64",
        "--threads",
        "1",
    ];
    // The software device when this build has it: the child must run there too, not on the CPU.
    let gpu = cfg!(feature = "gpu");
    if gpu {
        args.extend(["--device", "emu", "--gpu-attn", "fast", "--gpu-graphs", "off"]);
    }
    let port_s = port.to_string();
    args.extend(["--port", &port_s]);
    let _server = Server(
        Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    let engine = loop {
        if let Some(h) = get_json(port, "/health")
            && h["status"] == "ok"
        {
            break h["engine"].clone();
        }
        assert!(start.elapsed() < Duration::from_secs(120), "server not healthy within 120 s");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(engine["kv"], "int8", "{engine}");
    assert_eq!(engine["max_context"], 192, "{engine}");
    assert_eq!(engine["prefill"], 64, "{engine}");
    assert_eq!(engine["threads"], 1, "{engine}");
    assert_eq!(engine["model_path"], model.to_str().unwrap(), "{engine}");
    if gpu {
        assert_eq!(engine["device"], "emu", "{engine}");
        assert!(engine["backend"].as_str().unwrap().starts_with("emu"), "{engine}");
        assert_eq!(engine["gpu"]["attn"], "fast", "{engine}");
        assert_eq!(engine["gpu"]["graphs"], false, "{engine}");
        assert_eq!(engine["gpu"]["prefill"], "auto", "{engine}");
    }
    // The context the server enforces is the engine's (192), not the model's 4096.
    let models = get_json(port, "/v1/models").unwrap();
    assert_eq!(models["data"][0]["meta"]["context_length"], 192, "{models}");
}

#[test]
fn cli_engine_config_is_the_flags_in_json_and_not_both() {
    let model = reference("tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf");
    let json = serde_json::json!({"model": model, "kv": "int8", "max_context": 64}).to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["--engine-config", &json, "tokenize", "-p", "hello"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["--engine-config", &json, "--max-context", "32", "tokenize", "-p", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("replaces the other engine options"));
    let bad = serde_json::json!({"model": model, "kv_type": "int8"}).to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["--engine-config", &bad, "tokenize", "-p", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kv_type") && err.contains("--engine-config"), "{err}");
}

/// The `STRATA_GPU_*` variables are the GPU flags' documented overrides, parsed by the same
/// definition: a bad value names the variable and the values it takes.
#[test]
fn cli_gpu_env_overrides_are_checked_with_the_flags() {
    let model = reference("tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .env("STRATA_GPU_ATTN", "bogus")
        .args(["tokenize", "-m", model.to_str().unwrap(), "-p", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bogus") && err.contains("--gpu-attn") && err.contains("ordered") && err.contains("fast"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .env("STRATA_GPU_GRAPHS", "off")
        .env("STRATA_GPU_PREFILL", "MMQ")
        .args(["tokenize", "-m", model.to_str().unwrap(), "-p", "x"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
