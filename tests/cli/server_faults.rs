//! Fault injection on the real engine (docs/reliability.md, "Fault injection"):
//! `strata server` on the default model with its engine killed (SIGKILL) or stopped (SIGSTOP)
//! mid-stream under load, an unreadable model and a full disk at start, and the PLE table of a
//! Flash-Next model truncated or deleted while `strata --serve` (direct and mmap reads) or
//! `strata server` (mmap) runs. The same server faults against the fake engine:
//! server/tests/it/faults.rs.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use server::load::{self, Api, Outcome, ServerProcess, Spec};

use crate::models::models_util::{ids, read_json, reference};

fn strata() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_strata"))
}

/// The default chat model (Qwen2.5-Coder-0.5B), fetched by `./setup.sh` / `strata fetch`.
fn qwen() -> PathBuf {
    let p = strata::fetch::QWEN25_CODER_05B.cached_path();
    assert!(p.is_file(), "default model missing: {} (strata fetch)", p.display());
    p
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

pub(crate) fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-server-faults-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn spec(api: Api, stream: bool, max_tokens: u32, prompt: &str) -> Spec {
    Spec { api, stream, cancel: false, max_tokens, prompt: prompt.into(), seed: 7 }
}

fn server_on(args: &[&str]) -> ServerProcess {
    let mut a: Vec<String> = vec!["server".into(), "--port".into(), "0".into()];
    a.extend(args.iter().map(|s| s.to_string()));
    ServerProcess::spawn(&strata(), &a, false).unwrap_or_else(|e| panic!("{e}"))
}

async fn health(addr: SocketAddr) -> Value {
    load::health(addr).await.map(|h| h.1).unwrap_or(Value::Null)
}

/// Until one request runs and `waiting` more are queued.
async fn wait_queue(addr: SocketAddr, waiting: u64) -> Value {
    let t0 = Instant::now();
    loop {
        let h = health(addr).await;
        if h["requests_in_flight"] == 1 && h["requests_waiting"].as_u64() >= Some(waiting) {
            return h;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "queue never filled: {h}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Until an engine other than `old` is up; the time since `t0`.
async fn wait_new_engine(addr: SocketAddr, old: u64, t0: Instant) -> Duration {
    loop {
        let h = health(addr).await;
        if h["status"] == "ok" && h["engine_pid"].as_u64().is_some_and(|p| p != old) {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no new engine: {h}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn error_message(o: &Outcome) -> String {
    o.error_body.as_ref().and_then(|b| b["error"]["message"].as_str()).unwrap_or("").to_string()
}

/// The engine on the default model is killed (SIGKILL) while it streams, with requests of
/// every API queued behind it, once with an OpenAI stream and once with an Anthropic stream in
/// flight: the stream ends with an error in its API's shape, every queued request is answered
/// by the restarted engine, and the restart (kill → healthy) takes under 5 s.
#[test]
fn server_engine_killed_mid_stream_under_load() {
    let model = qwen();
    let srv = server_on(&["-m", model.to_str().unwrap()]);
    let addr = srv.addr;
    rt().block_on(async move {
        load::wait_healthy(addr, Duration::from_secs(300)).await.unwrap();
        let rounds = [(Api::Chat, "server_error"), (Api::Messages, "api_error")];
        let mut figures = Vec::new();
        for (round, (api, kind)) in rounds.into_iter().enumerate() {
            let t0 = Instant::now();
            let (tx, first) = tokio::sync::oneshot::channel();
            let victim = spec(api, true, 200, "Write a long story about a lighthouse keeper.");
            let inflight = tokio::spawn(async move { load::run_one_notify(addr, &victim, t0, Some(tx)).await });
            wait_queue(addr, 0).await;
            let queued: Vec<_> = [
                spec(Api::Messages, true, 6, "Say hi."),
                spec(Api::Completion, false, 6, "def add(a, b):"),
                spec(Api::Chat, true, 6, "Name a colour."),
                spec(Api::Messages, false, 6, "Name a fruit."),
            ]
            .into_iter()
            .map(|s| tokio::spawn(async move { load::run_one(addr, &s, t0).await }))
            .collect();
            let h = wait_queue(addr, queued.len() as u64).await;
            tokio::time::timeout(Duration::from_secs(60), first).await.expect("first token").unwrap();
            let pid = h["engine_pid"].as_u64().expect("engine_pid");
            let t_kill = Instant::now();
            load::signal(pid as u32, "KILL").unwrap();
            let o = inflight.await.unwrap();
            assert!(!o.ok && o.text_deltas > 0, "{o:?}");
            assert_eq!(o.status, 200, "the stream had started: {o:?}");
            let body = o.error_body.clone().unwrap_or_else(|| panic!("no error event: {o:?}"));
            match api {
                Api::Messages => {
                    assert_eq!((&body["type"], &body["error"]["type"]), (&json!("error"), &json!(kind)), "{body}")
                }
                _ => assert_eq!(body["error"]["type"], kind, "{body}"),
            }
            assert!(error_message(&o).contains("SIGKILL"), "{body}");
            let restart = wait_new_engine(addr, pid, t_kill).await;
            let mut first_after = None;
            for q in queued {
                let q = q.await.unwrap();
                assert!(q.ok, "round {round}: a queued request failed: {q:?}\n{}", srv.log_text());
                if let (Some(f), None) = (q.first_token_ms, first_after) {
                    first_after = Some(Duration::from_secs_f64(f / 1e3) - t_kill.duration_since(t0));
                }
            }
            assert!(restart < Duration::from_secs(5), "round {round}: restart took {restart:?}");
            figures.push((restart, first_after));
        }
        assert_eq!(health(addr).await["engine_restarts"], 2);
        println!("default model, kill -9 → healthy / → first token of the next queued request: {figures:?}");
    });
}

/// The engine is stopped (SIGSTOP: alive, silent) mid-stream: after `--engine-timeout 3` the
/// server kills it and starts another; the stream ends with a timeout error
/// (`code: "engine_timeout"`), the queued request is answered by the new engine.
#[test]
fn server_engine_stopped_mid_stream_is_killed_after_engine_timeout() {
    let model = qwen();
    let srv = server_on(&["-m", model.to_str().unwrap(), "--engine-timeout", "3"]);
    let addr = srv.addr;
    rt().block_on(async move {
        load::wait_healthy(addr, Duration::from_secs(300)).await.unwrap();
        let t0 = Instant::now();
        let (tx, first) = tokio::sync::oneshot::channel();
        let victim = spec(Api::Completion, true, 200, "fn main() {");
        let inflight = tokio::spawn(async move { load::run_one_notify(addr, &victim, t0, Some(tx)).await });
        wait_queue(addr, 0).await;
        let queued =
            tokio::spawn(async move { load::run_one(addr, &spec(Api::Messages, false, 5, "Say hi."), t0).await });
        let h = wait_queue(addr, 1).await;
        tokio::time::timeout(Duration::from_secs(60), first).await.expect("first token").unwrap();
        let pid = h["engine_pid"].as_u64().unwrap();
        let t_stop = Instant::now();
        load::signal(pid as u32, "STOP").unwrap();
        let o = inflight.await.unwrap();
        let detected = t_stop.elapsed();
        let body = o.error_body.clone().unwrap_or_else(|| panic!("no error chunk: {o:?}"));
        assert_eq!(body["error"]["code"], "engine_timeout", "{body}");
        assert!(detected >= Duration::from_millis(2900) && detected < Duration::from_secs(6), "{detected:?}");
        let restart = wait_new_engine(addr, pid, t_stop).await;
        let q = queued.await.unwrap();
        assert!(q.ok, "{q:?}");
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the stopped engine was not reaped");
        println!("SIGSTOP → timeout error after {detected:?}, new engine healthy after {restart:?}");
    });
}

fn run_to_exit(cmd: &mut Command, limit: Duration) -> (Option<i32>, String) {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn");
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("still running after {limit:?}: {:?}", cmd);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), reader.join().unwrap())
}

/// `cmd` must fail cleanly: exit status 1 (not a panic's 101 or a signal), an error line naming
/// `needle`, no panic message.
fn assert_clean_failure(what: &str, cmd: &mut Command, needle: &str) {
    let (code, err) = run_to_exit(cmd, Duration::from_secs(120));
    assert_eq!(code, Some(1), "{what}: exit {code:?}: {err}");
    assert!(err.contains("error:") && err.contains(needle), "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
}

/// An unreadable model at start — no permission, a directory, a truncated file, not a GGUF —
/// is a clear error and exit status 1 from `strata server` and `strata --serve`, never a panic.
/// A server whose tokenizer loads but whose engine cannot start stays up and answers 503 with
/// the engine's own error.
#[test]
fn unreadable_model_at_start_is_a_clear_error() {
    let d = tmp_dir("unreadable");
    let model = qwen();
    let noperm = d.join("noperm.gguf");
    std::fs::copy(&model, &noperm).unwrap();
    let truncated = d.join("truncated.gguf");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&truncated, &bytes[..1 << 20]).unwrap();
    let text = d.join("text.gguf");
    std::fs::write(&text, "this is not a model\n").unwrap();
    let dir = d.join("dir.gguf");
    std::fs::create_dir(&dir).unwrap();
    let mut cases = vec![(truncated.clone(), "truncated"), (text, "text.gguf"), (dir, "dir.gguf")];
    // root reads any file: drop to nobody with setpriv for the permission case.
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    let as_nobody = root && Command::new("setpriv").arg("--version").output().is_ok_and(|o| o.status.success());
    if !root || as_nobody {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&noperm, std::fs::Permissions::from_mode(0o000)).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        cases.push((noperm.clone(), "Permission denied"));
    } else {
        eprintln!("unreadable_model_at_start: running as root without setpriv: permission case skipped");
    }
    for (path, needle) in &cases {
        let p = path.to_str().unwrap();
        for args in [vec!["server", "--port", "0", "-m", p], vec!["-m", p, "--serve"]] {
            let mut cmd = if as_nobody && *needle == "Permission denied" {
                let mut c = Command::new("setpriv");
                c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(strata());
                c
            } else {
                Command::new(strata())
            };
            cmd.args(&args);
            assert_clean_failure(&format!("strata {args:?}"), &mut cmd, needle);
        }
    }

    // Tokenizer fine, engine model truncated: the server stays up, requests get 503 with the
    // engine's error (its stderr) in them.
    let srv = server_on(&[
        "--tokenizer",
        model.to_str().unwrap(),
        "--engine-arg=-m",
        &format!("--engine-arg={}", truncated.display()),
    ]);
    let addr = srv.addr;
    rt().block_on(async move {
        let o = load::run_one(addr, &spec(Api::Chat, false, 4, "Hi"), Instant::now()).await;
        assert_eq!(o.status, 503, "{o:?}");
        let msg = error_message(&o);
        assert!(msg.contains("truncated.gguf") && msg.contains("exit status: 1"), "{msg}");
        // Not ready: waiting out the restart backoff, or already loading the next attempt
        // (which of the two depends on timing on a busy machine).
        let h = health(addr).await;
        assert!(h["status"] == "restarting" || h["status"] == "loading", "{h}");
    });
    let _ = std::fs::remove_dir_all(&d);
}

/// A full disk at start. (1) The model cache on a full file system (a 64 KiB tmpfs; root
/// only): `strata server` cannot write the model's verification stamp: a clear error, exit 1.
/// (2) `strata server 2>/dev/full`: log lines cannot be written, the server (and its engine,
/// whose stderr goes through the server) serves anyway. (3) `strata --serve >/dev/full`: the
/// protocol cannot be written: exit 1 with the error on stderr.
#[test]
fn full_disk_at_start() {
    let d = tmp_dir("full");
    let model = qwen();
    let mnt = d.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if mounted {
        std::os::unix::fs::symlink(&model, mnt.join(strata::fetch::QWEN25_CODER_05B.file)).unwrap();
        if let Ok(mut f) = std::fs::File::create(mnt.join("fill")) {
            while f.write_all(&[0u8; 4096]).is_ok() {}
        }
        let mut cmd = Command::new(strata());
        cmd.args(["server", "--port", "0"]).env("STRATA_MODEL_DIR", &mnt).env_remove("STRATA_MODEL");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert_clean_failure("strata server, full cache", &mut cmd, "No space left on device")
        }));
        let _ = Command::new("umount").arg(&mnt).status();
        if let Err(e) = r {
            std::panic::resume_unwind(e);
        }
    } else {
        eprintln!("full_disk_at_start: cannot mount a tmpfs (not root?): the full model cache case is skipped");
    }

    // Logs on a full device.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let devfull = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let mut child = Command::new(strata())
        .args(["server", "--port", &port.to_string(), "-m", model.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(devfull)
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let served = rt().block_on(async move {
        load::wait_healthy(addr, Duration::from_secs(300)).await?;
        let o = load::run_one(addr, &spec(Api::Chat, true, 4, "Hi"), Instant::now()).await;
        if o.ok { Ok(()) } else { Err(format!("{o:?}")) }
    });
    let still_running = child.try_wait().unwrap().is_none();
    let _ = load::signal(child.id(), "INT");
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let status = child.wait().unwrap();
    assert!(still_running, "strata server 2>/dev/full exited: {status}");
    served.unwrap_or_else(|e| panic!("strata server 2>/dev/full did not serve: {e}"));

    // The protocol on a full device.
    let devfull = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let mut child = Command::new(strata())
        .args(["-m", model.to_str().unwrap(), "--serve"])
        .stdin(Stdio::null())
        .stdout(devfull)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("No space left on device") && !err.contains("panicked"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

// --- The PLE table of a Flash-Next model disappearing under a running engine ---------------

const Q8: &str = "tiny-qwen4exp/tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf";

/// The q8_0 tiny model as a trunk plus a file holding only the PLE table (as in
/// tests/cli/cli_qwen4exp.rs).
pub(crate) fn trunk_and_table(d: &Path) -> (PathBuf, PathBuf) {
    let g = gguf::GgufFile::open(&reference(Q8)).unwrap();
    let (trunk, table) = (d.join("trunk.gguf"), d.join("ple-table.gguf"));
    let mut wt = gguf::GgufWriter::new();
    let mut wp = gguf::GgufWriter::new();
    for (k, v) in g.metadata() {
        if !k.starts_with("split.") {
            wt.add_metadata(k.clone(), v.clone());
        }
    }
    wp.add_metadata("general.architecture", gguf::Value::Str("qwen4exp".into()));
    for t in g.tensors() {
        let w = if t.name == "per_layer_token_embd.weight" { &mut wp } else { &mut wt };
        w.add_tensor(t.name.clone(), &t.dims, t.ty, g.tensor_data(t).to_vec());
    }
    wt.write(&trunk).unwrap();
    wp.write(&table).unwrap();
    (trunk, table)
}

/// `strata --serve` as a child speaking the protocol line by line.
pub(crate) struct Serve {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Serve {
    pub(crate) fn start(args: &[&str]) -> Serve {
        let mut child = Command::new(strata())
            .args(args)
            .arg("--serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let (stdin, stdout) = (child.stdin.take().unwrap(), BufReader::new(child.stdout.take().unwrap()));
        let mut s = Serve { child, stdin, stdout };
        let hello = s.line().expect("hello line");
        assert_eq!(hello["type"], "hello", "{hello}");
        s
    }

    fn line(&mut self) -> Option<Value> {
        let mut l = String::new();
        match self.stdout.read_line(&mut l) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(serde_json::from_str(&l).unwrap_or_else(|e| panic!("bad engine line {l:?}: {e}"))),
        }
    }

    /// A greedy request: (tokens, done line), or None if the engine died (stdout closed).
    pub(crate) fn generate(&mut self, id: u64, tokens: &[u32], n: u32) -> Option<(Vec<u32>, Value)> {
        let req = json!({"type": "generate", "id": id, "tokens": tokens, "max_tokens": n,
                         "sampling": {"temperature": 0.0}, "stop_tokens": []});
        writeln!(self.stdin, "{req}").ok()?;
        let mut out = Vec::new();
        loop {
            let v = self.line()?;
            match v["type"].as_str() {
                Some("token") => out.push(v["token"].as_u64().unwrap() as u32),
                Some("done") => return Some((out, v)),
                _ => panic!("unexpected line {v}"),
            }
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The table read with `--ple-io direct` and with the default `--ple-io mmap`, no row cache,
/// so every token reads the file. Deleted mid-run: the engine's open descriptor (and mapping)
/// keeps the data, answers stay exact. Truncated mid-run: the request ends with `done` reason
/// `error` naming the table file, the engine keeps serving (and errs the same way until the
/// file is whole again), no crash, no garbage. With mmap a read through the mapping past the
/// new end would be a SIGBUS; the engine checks the file's length first.
#[test]
fn ple_table_deleted_or_truncated_mid_run_direct_and_mmap() {
    for io in ["direct", "mmap"] {
        let d = tmp_dir(&format!("ple-{io}"));
        let (trunk, table) = trunk_and_table(&d);
        let r = read_json("tiny-qwen4exp/ref/q8_0-split/ref.json");
        let (toks, greedy) = (ids(&r["sequences"][0]["token_ids"]), ids(&r["sequences"][0]["greedy_ids"]));
        let args = [
            "-m",
            trunk.to_str().unwrap(),
            "--ple-gguf",
            table.to_str().unwrap(),
            "--ple-io",
            io,
            "--ple-cache-mb",
            "0",
            "-t",
            "2",
        ];

        // Deleted.
        let mut e = Serve::start(&args);
        let (got, done) = e.generate(1, &toks, 6).unwrap();
        assert_eq!((got.as_slice(), &done["reason"]), (&greedy[..6], &json!("length")), "{io}: {done}");
        let saved = std::fs::read(&table).unwrap();
        std::fs::remove_file(&table).unwrap();
        let (got, done) = e.generate(2, &toks, 6).expect("engine alive after the table was deleted");
        assert_eq!((got.as_slice(), &done["reason"]), (&greedy[..6], &json!("length")), "{io}: deleted table: {done}");
        drop(e);

        // Truncated (the same inode, so the engine sees it).
        std::fs::write(&table, &saved).unwrap();
        let mut e = Serve::start(&args);
        let (got, _) = e.generate(1, &toks, 6).unwrap();
        assert_eq!(got, greedy[..6], "{io}");
        let f = std::fs::OpenOptions::new().write(true).open(&table).unwrap();
        f.set_len(4096).unwrap();
        let (got, done) = e.generate(2, &toks, 6).expect("engine alive after the table was truncated");
        assert_eq!(done["reason"], "error", "{io}: truncated table: {done} after {got:?}");
        let msg = done["error"].as_str().unwrap_or("");
        assert!(msg.contains("ple-table.gguf") && msg.contains("PLE"), "{io}: {msg}");
        if io == "mmap" {
            assert!(msg.contains("PLE row ") && msg.contains("(4096 bytes now)"), "{msg}");
        }
        println!("truncated table ({io}): {msg}");
        assert!(got.iter().zip(&greedy).all(|(a, b)| a == b), "{io}: tokens before the error are exact: {got:?}");
        // Still serving; whole again, exact again.
        let (_, done) = e.generate(3, &toks, 6).expect("engine alive");
        assert_eq!(done["reason"], "error", "{io}: {done}");
        f.set_len(0).unwrap();
        drop(f);
        std::fs::OpenOptions::new().write(true).open(&table).unwrap().write_all(&saved).unwrap();
        let (got, done) = e.generate(4, &toks, 6).expect("engine alive");
        assert_eq!((got.as_slice(), &done["reason"]), (&greedy[..6], &json!("length")), "{io}: restored: {done}");
        drop(e);
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// The same through `strata server` with the default `--ple-io mmap`: truncating the mapped
/// table makes the request in flight fail with a 500 in OpenAI's shape whose message is the
/// engine's error naming the file (`engine error: ...`), while the engine keeps running (same
/// `engine_pid`, no restart) and serving: another request errs the same way, and once the file
/// is whole again the answer is the one before the truncation. The server stays up throughout.
#[test]
fn ple_table_truncated_mid_run_mmap_through_the_server() {
    let d = tmp_dir("ple-mmap-server");
    let (trunk, table) = trunk_and_table(&d);
    let r = read_json("tiny-qwen4exp/ref/q8_0-split/ref.json");
    let toks = ids(&r["sequences"][0]["token_ids"]);
    let srv = server_on(&[
        "-m",
        trunk.to_str().unwrap(),
        "--ple-gguf",
        table.to_str().unwrap(),
        "--ple-cache-mb",
        "0",
        "-t",
        "2",
    ]);
    let addr = srv.addr;
    let body = json!({"prompt": toks, "max_tokens": 6, "temperature": 0.0}).to_string();
    let (table2, log) = (table.clone(), srv.log.clone());
    rt().block_on(async move {
        load::wait_healthy(addr, Duration::from_secs(120)).await.unwrap();
        let pid = health(addr).await["engine_pid"].as_u64().expect("engine_pid");
        let (h, b) = load::request(addr, "POST", "/v1/completions", Some(&body)).await.unwrap();
        assert_eq!(h.status, 200, "{b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 6, "{v}");
        let text = v["choices"][0]["text"].clone();
        let saved = std::fs::read(&table2).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&table2).unwrap();
        f.set_len(4096).unwrap();
        for round in 0..2 {
            let (h, b) = load::request(addr, "POST", "/v1/completions", Some(&body)).await.unwrap();
            let v: Value = serde_json::from_str(&b).unwrap_or(Value::Null);
            let msg = v["error"]["message"].as_str().unwrap_or("").to_string();
            assert_eq!(h.status, 500, "truncated table (round {round}): {b}\n{}", log.lock().unwrap());
            assert_eq!(v["error"]["type"], "server_error", "{b}");
            assert!(
                msg.starts_with("engine error: ") && msg.contains("ple-table.gguf") && msg.contains("PLE row "),
                "the engine's error names the table: {b}"
            );
            if round == 0 {
                println!("mmap table truncated: {msg}");
            }
            let hl = health(addr).await;
            assert_eq!(
                (&hl["status"], hl["engine_pid"].as_u64(), &hl["engine_restarts"]),
                (&json!("ok"), Some(pid), &json!(0)),
                "the engine kept running: {hl}"
            );
        }
        f.set_len(0).unwrap();
        f.write_all_at(&saved, 0).unwrap();
        drop(f);
        let (h, b) = load::request(addr, "POST", "/v1/completions", Some(&body)).await.unwrap();
        assert_eq!(h.status, 200, "restored: {b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!((&v["choices"][0]["text"], &v["usage"]["completion_tokens"]), (&text, &json!(6)), "restored: {v}");
        assert_eq!(health(addr).await["engine_pid"].as_u64(), Some(pid));
    });
    assert!(srv.child.id() > 0);
    let _ = std::fs::remove_dir_all(&d);
}
