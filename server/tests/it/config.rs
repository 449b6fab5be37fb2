//! `--config FILE` with the C++ engine's keys (`exe`, `args`, `cwd`, `tokenizer`,
//! `model_name`, `env`, `lib_dirs`, `host`, `port`, `api_key`): the engine is started with
//! those arguments, directory and environment (the fake engine reports what it got), and
//! unknown or doubly given keys are errors naming them.

use crate::support::*;
use serde_json::json;
use server::ServerConfig;
use std::path::Path;

fn config_file(dir: &Path, v: serde_json::Value) -> ServerConfig {
    let path = dir.join("engine.json");
    std::fs::write(&path, v.to_string()).unwrap();
    ServerConfig { config: Some(path), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpp_keys_start_the_engine_with_its_args_dir_and_environment() {
    let dir = scratch_dir();
    std::fs::create_dir_all(dir.join("run")).unwrap();
    let cfg = config_file(
        &dir,
        json!({
            "exe": fake_engine(),
            "args": ["--name", "cpp-engine", "--report-env", "STRATA_CPP_VAR",
                     "--report-env", "LD_LIBRARY_PATH"],
            "cwd": "run",
            "tokenizer": model_path(),
            "model_name": "cpp-model",
            "env": {"STRATA_CPP_VAR": "from the config", "LD_LIBRARY_PATH": "/usr/lib/extra"},
            "lib_dirs": ["lib", "/opt/strata/lib"],
            "host": "127.0.0.1",
            "port": 0,
            "api_key": "cpp-key",
        }),
    );
    let resolved = cfg.resolve().expect("resolves");
    assert_eq!(resolved.executable, fake_engine());
    assert_eq!(resolved.port, 0);
    assert_eq!(resolved.model_name.as_deref(), Some("cpp-model"));
    let key = cfg.api_key_with_env(None).unwrap();
    assert!(key.as_ref().unwrap().matches(b"cpp-key"));
    let srv = serve_resolved(&resolved, None, key).await;
    let health = wait_healthy(&srv).await;
    let e = &health["engine"];
    assert_eq!(e["env"]["STRATA_CPP_VAR"], "from the config", "{e}");
    let lib = dir.join("lib").display().to_string();
    assert_eq!(
        e["env"]["LD_LIBRARY_PATH"],
        format!("{lib}:/opt/strata/lib:/usr/lib/extra"),
        "lib_dirs first, relative to the config file, then env's value"
    );
    let cwd = std::fs::canonicalize(dir.join("run")).unwrap();
    assert_eq!(e["cwd"], cwd.display().to_string());
    // `args` reached the engine; `model_name` and `api_key` apply to the server.
    let r = request_with(srv.addr, "GET", "/v1/status", None, &[("x-api-key", "cpp-key")]).await;
    let s = r.json();
    assert_eq!(s["engine"]["engine_model"], "cpp-engine");
    assert_eq!(s["engine"]["model"], "cpp-model");
    assert_eq!(request(srv.addr, "GET", "/v1/models", None).await.status, 401);
}

#[test]
fn unknown_and_doubled_keys_are_errors_naming_them() {
    let dir = scratch_dir();
    let err = |v| format!("{:#}", config_file(&dir, v).resolve().unwrap_err());
    let e = err(json!({"exe": "/bin/true", "lib_dir": ["x"]}));
    assert!(e.contains("unknown field `lib_dir`"), "{e}");
    let e = err(json!({"exe": "/bin/a", "engine": {"executable": "/bin/b"}}));
    assert!(e.contains("both `exe` and `engine.executable`"), "{e}");
    let e = err(json!({"args": ["-m", "x.gguf"], "engine": {"args": []}}));
    assert!(e.contains("both `args` and `engine.args`"), "{e}");
    let e = err(json!({"env": {"A": 1}}));
    assert!(e.contains("env"), "a non-string value names the key: {e}");
    // Flags still win over the file's C++ keys.
    let mut cfg =
        config_file(&dir, json!({"exe": "/bin/from-file", "args": ["--a"], "tokenizer": "t.gguf", "port": 1}));
    cfg.port = Some(2);
    cfg.engine.executable = Some("/bin/from-flag".into());
    let r = cfg.resolve().unwrap();
    assert_eq!(
        (r.executable.display().to_string(), r.args, r.port),
        ("/bin/from-flag".into(), vec!["--a".to_string()], 2)
    );
    assert_eq!(r.tokenizer, dir.join("t.gguf"));
}
