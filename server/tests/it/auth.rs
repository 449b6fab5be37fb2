//! The API key (`--api-key`, `--api-key-file`, `$STRATA_API_KEY`, `api_key` in the config):
//! with none every request passes; with one every `/v1` request needs it (`Authorization:
//! Bearer KEY` or `x-api-key: KEY`) and gets a 401 in its API's error shape without it;
//! `/health` stays open. The environment variable and the start-up warning are checked on a
//! real `run_server` in a child process (this test binary, re-run on one test).

use crate::support::*;
use serde_json::{Value, json};
use server::ServerConfig;
use server::config::ApiKey;
use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

const KEY: &str = "sk-strata-test-0123456789";

/// The endpoints with a request each passes with the right key (and its status then).
fn endpoints() -> Vec<(&'static str, &'static str, Option<Value>, u16)> {
    let msgs = json!([{"role": "user", "content": "Hello there"}]);
    vec![
        ("GET", "/v1/models", None, 200),
        ("GET", "/metrics", None, 200),
        ("GET", "/v1/status", None, 200),
        ("POST", "/v1/completions", Some(json!({"prompt": "Hello world", "max_tokens": 2})), 200),
        ("POST", "/v1/chat/completions", Some(json!({"messages": msgs, "max_tokens": 2})), 200),
        ("POST", "/v1/messages", Some(json!({"model": "m", "messages": msgs, "max_tokens": 2})), 200),
        ("POST", "/v1/messages/count_tokens", Some(json!({"model": "m", "messages": msgs})), 200),
        ("GET", "/v1/no-such-endpoint", None, 404),
    ]
}

async fn call(addr: SocketAddr, ep: &(&str, &str, Option<Value>, u16), headers: &[(&str, &str)]) -> Resp {
    let body = ep.2.as_ref().map(Value::to_string);
    request_with(addr, ep.0, ep.1, body.as_deref(), headers).await
}

/// A 401 in the endpoint's API shape, with `message` in it.
fn assert_401(r: &Resp, path: &str, message: &str) {
    assert_eq!(r.status, 401, "{path}: {}", r.body);
    let v = r.json();
    if path.starts_with("/v1/messages") {
        assert_eq!(v["type"], "error", "{path}: {v}");
        assert_eq!(v["error"]["type"], "authentication_error", "{path}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(message), "{path}: {v}");
    } else {
        assert_eq!(v["error"]["type"], "invalid_request_error", "{path}: {v}");
        assert_eq!(v["error"]["code"], "invalid_api_key", "{path}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(message), "{path}: {v}");
    }
}

async fn keyed_server(key: Option<ApiKey>) -> TestServer {
    let srv = start_server_keyed(model_path(), &[], None, None, key).await;
    wait_healthy(&srv).await;
    srv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_every_request_passes() {
    let srv = keyed_server(None).await;
    for ep in endpoints() {
        for headers in [&[][..], &[("Authorization", "Bearer whatever")][..], &[("x-api-key", "x")][..]] {
            let r = call(srv.addr, &ep, headers).await;
            assert_eq!(r.status, ep.3, "{} {headers:?}: {}", ep.1, r.body);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_key_every_v1_request_needs_it_and_health_stays_open() {
    let srv = keyed_server(Some(ApiKey::new(KEY, "test").unwrap())).await;
    let h = request(srv.addr, "GET", "/health", None).await;
    assert_eq!((h.status, h.json()["status"].clone()), (200, json!("ok")), "{}", h.body);

    let bearer = format!("Bearer {KEY}");
    let lower = format!("bearer {KEY}");
    let wrong_bearer = format!("Bearer {KEY}x");
    let prefix = &KEY[..KEY.len() - 1];
    for ep in endpoints() {
        let path = ep.1;
        assert_401(&call(srv.addr, &ep, &[]).await, path, "missing API key");
        // (headers, the message's reason)
        for (wrong, why) in [
            (&[("Authorization", wrong_bearer.as_str())][..], "invalid API key"),
            (&[("Authorization", "Bearer ")][..], "missing API key"), // sent as "Bearer"
            (&[("Authorization", KEY)][..], "missing API key"),       // no scheme
            (&[("Authorization", "Basic c2stc3RyYXRh")][..], "missing API key"),
            (&[("x-api-key", prefix)][..], "invalid API key"),
            (&[("x-api-key", "")][..], "invalid API key"),
            (&[("x-api-key", "sk-strata-test-0123456780")][..], "invalid API key"),
        ] {
            assert_401(&call(srv.addr, &ep, wrong).await, path, why);
        }
        for right in [
            &[("Authorization", bearer.as_str())][..],
            &[("authorization", lower.as_str())][..],
            &[("x-api-key", KEY)][..],
            &[("X-Api-Key", KEY)][..],
            // One right credential suffices.
            &[("x-api-key", "wrong"), ("Authorization", bearer.as_str())][..],
        ] {
            let r = call(srv.addr, &ep, right).await;
            assert_eq!(r.status, ep.3, "{path} {right:?}: {}", r.body);
        }
    }
    // A streaming request is refused before any event.
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": true});
    let r = request_with(srv.addr, "POST", "/v1/chat/completions", Some(&body.to_string()), &[]).await;
    assert_401(&r, "/v1/chat/completions", "missing API key");
}

#[test]
fn key_constant_time_compare() {
    let k = ApiKey::new(KEY, "test").unwrap();
    assert!(k.matches(KEY.as_bytes()));
    for wrong in ["", "s", &KEY[1..], &format!("{KEY}{KEY}"), &KEY.to_uppercase()] {
        assert!(!k.matches(wrong.as_bytes()), "{wrong:?}");
    }
    assert_eq!(format!("{k:?}"), "ApiKey(..)", "the key is never printed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_file_first_line_trimmed_and_config_json() {
    let dir = scratch_dir();
    let file = dir.join("key.txt");
    std::fs::write(&file, "  file-key-1  \nsecond line\n").unwrap();
    let cfg = ServerConfig { api_key_file: Some(file.clone()), ..Default::default() };
    let key = cfg.api_key_with_env(None).unwrap().expect("a key");
    assert!(key.matches(b"file-key-1"));
    // The flags beat the environment variable; the environment variable beats the config file.
    assert!(cfg.api_key_with_env(Some("env".into())).unwrap().unwrap().matches(b"file-key-1"));
    let flag = ServerConfig { api_key: Some("flag-key".into()), ..Default::default() };
    assert!(flag.api_key_with_env(Some("env".into())).unwrap().unwrap().matches(b"flag-key"));

    let srv = keyed_server(Some(key)).await;
    let ep = &endpoints()[0];
    assert_eq!(call(srv.addr, ep, &[("x-api-key", "file-key-1")]).await.status, 200);
    assert_401(&call(srv.addr, ep, &[("x-api-key", "second line")]).await, ep.1, "invalid");

    // In the config: `api_key`, or `api_key_file` relative to the config's directory.
    let conf = dir.join("strata.json");
    std::fs::write(&conf, r#"{"api_key": "json-key"}"#).unwrap();
    let from_json = ServerConfig { config: Some(conf.clone()), ..Default::default() };
    assert!(from_json.api_key_with_env(None).unwrap().unwrap().matches(b"json-key"));
    assert!(from_json.api_key_with_env(Some("env".into())).unwrap().unwrap().matches(b"env"));
    std::fs::write(&conf, r#"{"api_key_file": "key.txt"}"#).unwrap();
    assert!(from_json.api_key_with_env(None).unwrap().unwrap().matches(b"file-key-1"));
    std::fs::write(&conf, r#"{"port": 1}"#).unwrap();
    assert_eq!(from_json.api_key_with_env(None).unwrap(), None, "no key anywhere: none");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_key_is_a_startup_error() {
    let dir = scratch_dir();
    for (name, text) in [("empty", ""), ("blank", "  \n\nkey-on-line-3\n")] {
        let file = dir.join(name);
        std::fs::write(&file, text).unwrap();
        let cfg = ServerConfig {
            api_key_file: Some(file.clone()),
            engine: server::EngineCommand { executable: Some(fake_engine()), args: None },
            tokenizer: Some(model_path()),
            port: Some(0),
            ..Default::default()
        };
        let e = cfg.api_key().unwrap_err().to_string();
        assert!(e.contains("empty") && e.contains(name), "{e}");
        // `run_server` refuses to start (before listening), rather than serving without a key.
        let e = tokio::time::timeout(Duration::from_secs(10), server::run_server(cfg))
            .await
            .expect("run_server returns")
            .unwrap_err();
        assert!(format!("{e:#}").contains("empty"), "{e:#}");
    }
    let missing = ServerConfig { api_key_file: Some(dir.join("nope")), ..Default::default() };
    assert!(missing.api_key().unwrap_err().to_string().contains("reading API key file"));
    for k in ["", "   "] {
        let e = ServerConfig { api_key: Some(k.into()), ..Default::default() }.api_key_with_env(None).unwrap_err();
        assert!(e.to_string().contains("--api-key"), "{e}");
        let e = ServerConfig::default().api_key_with_env(Some(k.into())).unwrap_err();
        assert!(e.to_string().contains("STRATA_API_KEY"), "{e}");
    }
}

#[test]
fn warning_only_off_loopback_without_key() {
    use server::config::exposure_warning;
    let w = exposure_warning("0.0.0.0", false).expect("a warning");
    assert!(w.contains("--api-key") && w.contains("STRATA_API_KEY"), "{w}");
    assert!(exposure_warning("::", false).is_some());
    assert!(exposure_warning("192.168.1.5", false).is_some());
    for host in ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"] {
        assert_eq!(exposure_warning(host, false), None, "{host}");
    }
    assert_eq!(exposure_warning("0.0.0.0", true), None);
}

/// Child side of [`run_server_on_all_interfaces`]: `run_server` on 0.0.0.0, port 0, with the
/// environment's `STRATA_API_KEY` if any. Does nothing unless started by that test.
#[test]
fn child_run_server() {
    if std::env::var_os("STRATA_AUTH_TEST_CHILD").is_none() {
        return;
    }
    let cfg = ServerConfig {
        engine: server::EngineCommand { executable: Some(fake_engine()), args: None },
        tokenizer: Some(model_path()),
        host: Some("0.0.0.0".into()),
        port: Some(0),
        ..Default::default()
    };
    server::run_server_blocking(cfg).unwrap();
}

/// `run_server` in a child process on 0.0.0.0: the lines it prints up to "listening on", and
/// the port. The child is killed when the returned guard drops.
fn spawn_child(env_key: Option<&str>) -> (Vec<String>, u16, ChildGuard) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "auth::child_run_server", "--nocapture", "--test-threads=1"])
        .env("STRATA_AUTH_TEST_CHILD", "1")
        .env_remove("STRATA_API_KEY")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(k) = env_key {
        cmd.env("STRATA_API_KEY", k);
    }
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let guard = ChildGuard(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    loop {
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("no listening line: {lines:?}"));
        lines.push(line.clone());
        if let Some(addr) = line.strip_prefix("strata server: listening on http://") {
            let port = addr.rsplit(':').next().unwrap().parse().unwrap();
            return (lines, port, guard);
        }
    }
}

struct ChildGuard(std::process::Child);
impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_server_on_all_interfaces() {
    // Without a key: the warning (how to set one) before the listening line; requests pass.
    let (lines, port, _child) = spawn_child(None);
    let warning = lines.iter().find(|l| l.contains("warning")).unwrap_or_else(|| panic!("no warning: {lines:?}"));
    assert!(warning.contains("0.0.0.0") && warning.contains("--api-key"), "{warning}");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    assert_eq!(request(addr, "GET", "/v1/models", None).await.status, 200);
    drop(_child);

    // With `STRATA_API_KEY`: no warning, and the key is required.
    let (lines, port, _child) = spawn_child(Some("env-key-42"));
    assert!(!lines.iter().any(|l| l.contains("warning")), "{lines:?}");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let ep = &endpoints()[0];
    assert_401(&request(addr, "GET", "/v1/models", None).await, ep.1, "missing API key");
    let r = request_with(addr, "GET", "/v1/models", None, &[("Authorization", "Bearer env-key-42")]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = request(addr, "GET", "/health", None).await;
    assert_ne!(r.status, 401, "{}", r.body);
}
