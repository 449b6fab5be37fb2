//! Host side of the token protocol: runs the engine process, restarts it when it dies, and
//! multiplexes concurrent requests onto it.
//!
//! Scheduling: the host assigns each request a protocol id and routes the engine's lines back by
//! id. At most `parallel` (from the hello line; 1 for today's single-sequence engine) requests
//! are sent to the engine at once; the others wait, in arrival order, on a fair semaphore in the
//! host. So when the engine dies only the requests it was running fail; queued ones run on the
//! restarted engine.
//!
//! Lifecycle: Starting (spawned, waiting for hello) → Ready → (stdout EOF) Down → backoff →
//! Starting ... Backoff doubles from 250 ms to 10 s and resets once an engine ran for 30 s.
//! An engine that fails to start the same way [`GIVE_UP_AFTER`] times in a row (a bad flag, a
//! model that does not fit) is not started again: that will not fix itself, and each try may
//! cost a model load. Requests then get the start error at once (503).
//!
//! The engine's stderr is read by [`StderrTail`] (engine_stderr.rs), whose error lines are the
//! reason a failed start or a death is reported with.

use crate::engine_stderr::StderrTail;
use crate::protocol::{Done, EngineMessage, GenerateRequest, HostMessage, ModelInfo, PROTOCOL_VERSION, to_line};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

/// What a request sees from the engine.
#[derive(Debug)]
pub enum EngineEvent {
    Token(u32),
    Done(Done),
    /// The engine process died (or could not be written to) while the request was in flight.
    Failed(String),
    /// The engine was silent for `engine_timeout` with requests in flight: killed as hung.
    TimedOut(String),
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("engine unavailable: {0}")]
    Unavailable(String),
}

/// Public view of the engine state, for `/health`.
#[derive(Clone, Debug)]
pub enum EngineStatus {
    Starting,
    Ready(Arc<Instance>),
    /// Dead, a restart is scheduled. `startup_failure`: it died before saying hello.
    /// `gave_up`: it failed to start the same way [`GIVE_UP_AFTER`] times; no restart follows.
    Down {
        error: String,
        startup_failure: bool,
        gave_up: bool,
    },
}

/// Identical start failures in a row after which the engine is not started again.
pub const GIVE_UP_AFTER: u32 = 5;

/// One running engine process.
#[derive(Debug)]
pub struct Instance {
    pub info: ModelInfo,
    pub pid: Option<u32>,
    stdin: mpsc::UnboundedSender<String>,
    routes: Mutex<Routes>,
    /// Last engine output line or request sent, for `engine_timeout`.
    last_activity: Mutex<Instant>,
    /// The engine's last stderr lines.
    stderr: Arc<StderrTail>,
}

#[derive(Debug, Default)]
struct Routes {
    /// Set when the process is gone: no new request may be registered.
    closed: bool,
    map: HashMap<u64, Route>,
}

#[derive(Debug)]
struct Route {
    tx: mpsc::UnboundedSender<EngineEvent>,
    /// Released when the engine finishes the request (done line or death), not when the HTTP
    /// side gives up: the engine is busy until it says so.
    _permit: OwnedSemaphorePermit,
}

impl Instance {
    fn fail_all(&self, error: &str, timed_out: bool) {
        let mut r = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        r.closed = true;
        for (_, route) in r.map.drain() {
            let e = error.to_string();
            let _ = route.tx.send(if timed_out { EngineEvent::TimedOut(e) } else { EngineEvent::Failed(e) });
        }
    }

    fn touch(&self) {
        *self.last_activity.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn silent_for(&self) -> Duration {
        self.last_activity.lock().unwrap_or_else(|p| p.into_inner()).elapsed()
    }

    fn in_flight(&self) -> usize {
        self.routes.lock().unwrap_or_else(|p| p.into_inner()).map.len()
    }
}

/// How the engine process is started besides its command line (the C++ engine's config keys
/// `cwd`, `env` and `lib_dirs`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessEnv {
    /// Working directory of the engine (default: the server's).
    pub cwd: Option<PathBuf>,
    /// Extra environment variables of the engine, set over the server's own.
    pub env: Vec<(String, String)>,
    /// Directories put in front of the engine's `LD_LIBRARY_PATH`.
    pub lib_dirs: Vec<PathBuf>,
}

impl ProcessEnv {
    fn apply(&self, cmd: &mut Command) {
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if !self.lib_dirs.is_empty() {
            // After `env`, so a LD_LIBRARY_PATH given there is extended too.
            let current = self
                .env
                .iter()
                .rev()
                .find(|(k, _)| k == "LD_LIBRARY_PATH")
                .map(|(_, v)| std::ffi::OsString::from(v))
                .or_else(|| std::env::var_os("LD_LIBRARY_PATH"))
                .filter(|v| !v.is_empty());
            let paths = self
                .lib_dirs
                .iter()
                .cloned()
                .chain(current.iter().flat_map(|c| std::env::split_paths(c).collect::<Vec<_>>()));
            if let Ok(joined) = std::env::join_paths(paths) {
                cmd.env("LD_LIBRARY_PATH", joined);
            }
        }
    }
}

struct Shared {
    executable: PathBuf,
    args: Vec<String>,
    process: ProcessEnv,
    startup_timeout: Duration,
    engine_timeout: Option<Duration>,
    status: watch::Sender<EngineStatus>,
    permits: Arc<Semaphore>,
    /// Extra permits beyond the first are added once, from the first hello.
    permits_sized: Mutex<bool>,
    next_id: AtomicU64,
    restarts: AtomicU64,
    /// Starts that failed before the hello line, in all.
    start_failures: AtomicU64,
    waiting: AtomicU64,
    /// Origin of the queue timestamps ([`Generation::queued_us`]).
    epoch: Instant,
}

/// Cheap to clone; all clones drive the same engine process.
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
}

/// A request in flight. Dropping it before the end cancels it at the engine.
pub struct Generation {
    id: u64,
    prompt_len: usize,
    queued_us: u64,
    started_us: u64,
    instance: Arc<Instance>,
    rx: mpsc::UnboundedReceiver<EngineEvent>,
    finished: bool,
    /// Records the request for `/metrics` when dropped, if the generation is never driven.
    recording: Option<crate::metrics::Recording>,
}

impl Generation {
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// The protocol id. Ids are assigned when a request leaves the queue for the engine, so
    /// with one engine slot (`parallel` 1) their order is the order of service.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// When the request entered the queue, in µs since the engine supervisor started.
    pub fn queued_us(&self) -> u64 {
        self.queued_us
    }

    /// When it was sent to the engine (same clock as [`Generation::queued_us`]).
    pub fn started_us(&self) -> u64 {
        self.started_us
    }

    /// Attach the request's metrics record (dropped with the generation unless taken).
    pub fn set_recording(&mut self, r: crate::metrics::Recording) {
        self.recording = Some(r);
    }

    pub fn take_recording(&mut self) -> Option<crate::metrics::Recording> {
        self.recording.take()
    }

    /// Next event; after `Done` or `Failed` the generation is over.
    pub async fn next(&mut self) -> EngineEvent {
        let ev = self.rx.recv().await.unwrap_or_else(|| EngineEvent::Failed("engine dropped the request".into()));
        if !matches!(ev, EngineEvent::Token(_)) {
            self.finished = true;
        }
        ev
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.finished {
            // The route stays until the engine's `done` (or death) so the permit is held while the
            // engine is still busy with this request.
            let _ = self.instance.stdin.send(to_line(&HostMessage::Cancel { id: self.id }));
        }
    }
}

impl EngineHandle {
    /// Start supervising `executable args... --serve` (in `process`'s directory and
    /// environment). Must be called inside a tokio runtime.
    pub fn spawn(
        executable: PathBuf,
        args: Vec<String>,
        process: ProcessEnv,
        startup_timeout: Duration,
        engine_timeout: Option<Duration>,
    ) -> EngineHandle {
        let (status, _) = watch::channel(EngineStatus::Starting);
        let shared = Arc::new(Shared {
            executable,
            args,
            process,
            startup_timeout,
            engine_timeout,
            status,
            permits: Arc::new(Semaphore::new(1)),
            permits_sized: Mutex::new(false),
            next_id: AtomicU64::new(1),
            restarts: AtomicU64::new(0),
            start_failures: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            epoch: Instant::now(),
        });
        tokio::spawn(supervise(shared.clone()));
        EngineHandle { shared }
    }

    pub fn status(&self) -> EngineStatus {
        self.shared.status.borrow().clone()
    }

    /// Model info of the running engine, if one is up.
    pub fn info(&self) -> Option<ModelInfo> {
        match &*self.shared.status.borrow() {
            EngineStatus::Ready(i) => Some(i.info.clone()),
            _ => None,
        }
    }

    /// Process id of the running engine, if one is up.
    pub fn engine_pid(&self) -> Option<u32> {
        match &*self.shared.status.borrow() {
            EngineStatus::Ready(i) => i.pid,
            _ => None,
        }
    }

    /// Engine restarts so far, requests waiting for the engine, requests at the engine.
    pub fn counters(&self) -> (u64, u64, usize) {
        let in_flight = match &*self.shared.status.borrow() {
            EngineStatus::Ready(i) => i.in_flight(),
            _ => 0,
        };
        (self.shared.restarts.load(Ordering::Relaxed), self.shared.waiting.load(Ordering::Relaxed), in_flight)
    }

    /// Engine starts that failed before the hello line, in all.
    pub fn start_failures(&self) -> u64 {
        self.shared.start_failures.load(Ordering::Relaxed)
    }

    /// Wait until the engine is ready (or is known to fail to start).
    pub async fn ready(&self) -> Result<Arc<Instance>, EngineError> {
        let mut rx = self.shared.status.subscribe();
        let wait =
            rx.wait_for(|s| matches!(s, EngineStatus::Ready(_) | EngineStatus::Down { startup_failure: true, .. }));
        let res = tokio::time::timeout(self.shared.startup_timeout, wait).await;
        match res {
            Err(_) => Err(EngineError::Unavailable("timed out waiting for the engine to start".into())),
            Ok(Err(_)) => Err(EngineError::Unavailable("engine supervisor stopped".into())),
            Ok(Ok(s)) => match &*s {
                EngineStatus::Ready(i) => Ok(i.clone()),
                EngineStatus::Down { error, .. } => Err(EngineError::Unavailable(error.clone())),
                EngineStatus::Starting => Err(EngineError::Unavailable("engine starting".into())),
            },
        }
    }

    /// Queue `req` (its `id` is replaced) and send it once the engine has room.
    pub async fn submit(&self, mut req: GenerateRequest) -> Result<Generation, EngineError> {
        let queued = self.shared.epoch.elapsed();
        let permit = {
            // Counted until the permit comes or the request is dropped (its client left).
            let _waiting = Waiting::enter(&self.shared.waiting);
            self.shared.permits.clone().acquire_owned().await
        };
        let permit = permit.map_err(|_| EngineError::Unavailable("server shutting down".into()))?;
        let mut permit = Some(permit);
        loop {
            let instance = self.ready().await?;
            req.id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = mpsc::unbounded_channel();
            let registered = {
                let mut routes = instance.routes.lock().unwrap_or_else(|p| p.into_inner());
                if routes.closed {
                    false
                } else {
                    let p = permit.take().expect("permit is taken once, right before returning");
                    routes.map.insert(req.id, Route { tx, _permit: p });
                    // A request that just arrived has not been waiting on a silent engine.
                    instance.touch();
                    true
                }
            };
            if !registered {
                // Died between `ready` and here: wait for the next instance.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            // The writer task keeps lines in order; if it is gone the reader fails the route.
            let _ = instance.stdin.send(to_line(&HostMessage::Generate(req.clone())));
            return Ok(Generation {
                id: req.id,
                prompt_len: req.tokens.len(),
                queued_us: queued.as_micros() as u64,
                started_us: self.shared.epoch.elapsed().as_micros() as u64,
                instance,
                rx,
                finished: false,
                recording: None,
            });
        }
    }
}

/// One request in the queue for [`Shared::waiting`], for as long as this lives: dropping the
/// request future mid-wait (the client hung up) uncounts it too.
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn enter(count: &'a AtomicU64) -> Waiting<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn supervise(shared: Arc<Shared>) {
    const MIN_BACKOFF: Duration = Duration::from_millis(250);
    let mut backoff = MIN_BACKOFF;
    // The last start error and how often in a row it happened.
    let mut same_failure: Option<(String, u32)> = None;
    loop {
        shared.status.send_replace(EngineStatus::Starting);
        match start(&shared).await {
            Ok((instance, child, stdout)) => {
                same_failure = None;
                set_permits(&shared, instance.info.parallel);
                let started = Instant::now();
                log_line!(
                    "strata server: engine ready (pid {:?}, model {:?}, vocab {}, context {})",
                    instance.pid,
                    instance.info.name,
                    instance.info.vocab_size,
                    instance.info.context_length
                );
                shared.status.send_replace(EngineStatus::Ready(instance.clone()));
                let (error, timed_out) = run_instance(&instance, child, stdout, shared.engine_timeout).await;
                log_line!("strata server: {error}; restarting");
                // State first, then the failures: a client that got its error sees the restart.
                shared.restarts.fetch_add(1, Ordering::Relaxed);
                if started.elapsed() > Duration::from_secs(30) {
                    backoff = MIN_BACKOFF;
                }
                shared.status.send_replace(EngineStatus::Down {
                    error: error.clone(),
                    startup_failure: false,
                    gave_up: false,
                });
                instance.fail_all(&error, timed_out);
            }
            Err(error) => {
                shared.start_failures.fetch_add(1, Ordering::Relaxed);
                let n = match &mut same_failure {
                    Some((e, n)) if *e == error => {
                        *n += 1;
                        *n
                    }
                    _ => {
                        same_failure = Some((error.clone(), 1));
                        1
                    }
                };
                if n >= GIVE_UP_AFTER {
                    log_line!(
                        "strata server: engine failed to start {n} times in a row with the same \
                         error; not starting it again (fix its configuration and restart the \
                         server): {error}"
                    );
                    shared.status.send_replace(EngineStatus::Down {
                        error: format!(
                            "{error} (the engine failed to start {n} times in a row this way; \
                             the server does not start it again)"
                        ),
                        startup_failure: true,
                        gave_up: true,
                    });
                    return;
                }
                log_line!("strata server: engine failed to start: {error}");
                shared.status.send_replace(EngineStatus::Down { error, startup_failure: true, gave_up: false });
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

fn set_permits(shared: &Shared, parallel: u32) {
    let mut sized = shared.permits_sized.lock().unwrap_or_else(|p| p.into_inner());
    if !*sized {
        *sized = true;
        shared.permits.add_permits(parallel.max(1) as usize - 1);
    }
}

/// Spawn the process and wait for its hello line.
async fn start(shared: &Shared) -> Result<(Arc<Instance>, Child, BufReader<ChildStdout>), String> {
    let mut cmd = Command::new(&shared.executable);
    shared.process.apply(&mut cmd);
    let mut child = cmd
        .args(&shared.args)
        .arg("--serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", shared.executable.display()))?;
    let pid = child.id();
    let stdout = child.stdout.take().ok_or("engine stdout not captured")?;
    let mut stdin = child.stdin.take().ok_or("engine stdin not captured")?;
    let stderr = StderrTail::forward(child.stderr.take());
    let mut stdout = BufReader::new(stdout);

    let hello = async {
        let mut line = String::new();
        loop {
            line.clear();
            match stdout.read_line(&mut line).await {
                Ok(0) => return Err("engine exited before its hello line".to_string()),
                Err(e) => return Err(format!("reading engine hello: {e}")),
                Ok(_) => {}
            }
            match serde_json::from_str::<EngineMessage>(&line) {
                Ok(EngineMessage::Hello { protocol, model }) if protocol == PROTOCOL_VERSION => {
                    return Ok(model);
                }
                Ok(EngineMessage::Hello { protocol, .. }) => {
                    return Err(format!("engine speaks protocol {protocol}, this server {PROTOCOL_VERSION}"));
                }
                // Tolerate stray output before the hello (e.g. a library printing a banner).
                _ => log_line!("strata server: ignoring engine output before hello: {}", line.trim_end()),
            }
        }
    };
    let info = match tokio::time::timeout(shared.startup_timeout, hello).await {
        Ok(Ok(info)) => info,
        Ok(Err(e)) => {
            let e = with_exit_status(e, &mut child).await;
            return Err(stderr.annotate(e).await);
        }
        Err(_) => {
            let e = format!("no hello line within {:?}", shared.startup_timeout);
            return Err(stderr.annotate(e).await);
        }
    };

    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            let ok = stdin.write_all(line.as_bytes()).await.is_ok()
                && stdin.write_all(b"\n").await.is_ok()
                && stdin.flush().await.is_ok();
            if !ok {
                return; // The reader sees EOF and reports the death.
            }
        }
    });
    let instance = Arc::new(Instance {
        info,
        pid,
        stdin: tx,
        routes: Mutex::new(Routes::default()),
        last_activity: Mutex::new(Instant::now()),
        stderr,
    });
    Ok((instance, child, stdout))
}

async fn with_exit_status(msg: String, child: &mut Child) -> String {
    match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
        Ok(Ok(status)) => format!("{msg} ({status})"),
        _ => msg,
    }
}

/// Route engine lines until stdout ends; returns why the engine is considered dead, and
/// whether it was killed as hung (`engine_timeout`).
async fn run_instance(
    instance: &Instance,
    mut child: Child,
    mut stdout: BufReader<ChildStdout>,
    engine_timeout: Option<Duration>,
) -> (String, bool) {
    let mut line = String::new();
    let mut hung = false;
    let why = loop {
        line.clear();
        match read_or_hang(instance, &mut stdout, &mut line, engine_timeout).await {
            Ok(0) => break "engine process closed its output".to_string(),
            Err(Silence::Hung(e)) => {
                hung = true;
                break e;
            }
            Err(Silence::Io(e)) => break e,
            Ok(_) => instance.touch(),
        }
        match serde_json::from_str::<EngineMessage>(&line) {
            Ok(EngineMessage::Token { id, token }) => {
                let routes = instance.routes.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(r) = routes.map.get(&id) {
                    let _ = r.tx.send(EngineEvent::Token(token));
                }
            }
            Ok(EngineMessage::Done(d)) => {
                let route = instance.routes.lock().unwrap_or_else(|p| p.into_inner()).map.remove(&d.id);
                if let Some(r) = route {
                    let _ = r.tx.send(EngineEvent::Done(d));
                }
            }
            Ok(EngineMessage::Error { error }) => {
                log_line!("strata server: engine reported: {error}")
            }
            Ok(EngineMessage::Hello { .. }) => {
                log_line!("strata server: unexpected second hello from engine")
            }
            Err(e) => log_line!("strata server: unparsable engine line ({e}): {}", line.trim_end()),
        }
    };
    // Stop routing first so nothing new is sent to a dying process, then reap it.
    if hung {
        let _ = child.start_kill();
    }
    instance.routes.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
    let status = match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
        Ok(Ok(s)) => s.to_string(),
        _ => {
            let _ = child.kill().await;
            "killed after closing its output".to_string()
        }
    };
    let why = format!("{why} ({status})");
    // A hung engine's last words are old news; a crash's (a panic message) are the reason.
    let why = if hung { why } else { instance.stderr.annotate(why).await };
    (why, hung)
}

enum Silence {
    /// Silent past `engine_timeout` with requests in flight.
    Hung(String),
    Io(String),
}

/// One line from the engine; `Err` if reading fails or, with `engine_timeout`, if the engine
/// stays silent that long while requests are in flight (a hung engine).
async fn read_or_hang(
    instance: &Instance,
    stdout: &mut BufReader<ChildStdout>,
    line: &mut String,
    engine_timeout: Option<Duration>,
) -> Result<usize, Silence> {
    let io = |e: std::io::Error| Silence::Io(format!("reading engine output: {e}"));
    let Some(limit) = engine_timeout else {
        return stdout.read_line(line).await.map_err(io);
    };
    // The read future is kept across timer ticks (read_line is not cancel-safe).
    let read = stdout.read_line(line);
    tokio::pin!(read);
    let tick = limit.min(Duration::from_secs(1)) / 2;
    loop {
        tokio::select! {
            r = &mut read => return r.map_err(io),
            _ = tokio::time::sleep(tick) => {
                if instance.in_flight() > 0 && instance.silent_for() > limit {
                    return Err(Silence::Hung(format!(
                        "engine produced no output for {limit:?} with requests in flight \
                         (engine_timeout); killed"
                    )));
                }
            }
        }
    }
}
