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

use crate::protocol::{
    Done, EngineMessage, GenerateRequest, HostMessage, ModelInfo, PROTOCOL_VERSION, to_line,
};
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
    Down {
        error: String,
        startup_failure: bool,
    },
}

/// One running engine process.
#[derive(Debug)]
pub struct Instance {
    pub info: ModelInfo,
    pub pid: Option<u32>,
    stdin: mpsc::UnboundedSender<String>,
    routes: Mutex<Routes>,
    /// Last engine output line or request sent, for `engine_timeout`.
    last_activity: Mutex<Instant>,
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
    fn fail_all(&self, error: &str) {
        let mut r = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        r.closed = true;
        for (_, route) in r.map.drain() {
            let _ = route.tx.send(EngineEvent::Failed(error.to_string()));
        }
    }

    fn touch(&self) {
        *self.last_activity.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn silent_for(&self) -> Duration {
        self.last_activity
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }

    fn in_flight(&self) -> usize {
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map
            .len()
    }
}

struct Shared {
    executable: PathBuf,
    args: Vec<String>,
    startup_timeout: Duration,
    engine_timeout: Option<Duration>,
    status: watch::Sender<EngineStatus>,
    permits: Arc<Semaphore>,
    /// Extra permits beyond the first are added once, from the first hello.
    permits_sized: Mutex<bool>,
    next_id: AtomicU64,
    restarts: AtomicU64,
    waiting: AtomicU64,
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
    instance: Arc<Instance>,
    rx: mpsc::UnboundedReceiver<EngineEvent>,
    finished: bool,
}

impl Generation {
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// Next event; after `Done` or `Failed` the generation is over.
    pub async fn next(&mut self) -> EngineEvent {
        let ev = self
            .rx
            .recv()
            .await
            .unwrap_or_else(|| EngineEvent::Failed("engine dropped the request".into()));
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
            let _ = self
                .instance
                .stdin
                .send(to_line(&HostMessage::Cancel { id: self.id }));
        }
    }
}

impl EngineHandle {
    /// Start supervising `executable args... --serve`. Must be called inside a tokio runtime.
    pub fn spawn(
        executable: PathBuf,
        args: Vec<String>,
        startup_timeout: Duration,
        engine_timeout: Option<Duration>,
    ) -> EngineHandle {
        let (status, _) = watch::channel(EngineStatus::Starting);
        let shared = Arc::new(Shared {
            executable,
            args,
            startup_timeout,
            engine_timeout,
            status,
            permits: Arc::new(Semaphore::new(1)),
            permits_sized: Mutex::new(false),
            next_id: AtomicU64::new(1),
            restarts: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
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

    /// Engine restarts so far, requests waiting for the engine, requests at the engine.
    pub fn counters(&self) -> (u64, u64, usize) {
        let in_flight = match &*self.shared.status.borrow() {
            EngineStatus::Ready(i) => i.in_flight(),
            _ => 0,
        };
        (
            self.shared.restarts.load(Ordering::Relaxed),
            self.shared.waiting.load(Ordering::Relaxed),
            in_flight,
        )
    }

    /// Wait until the engine is ready (or is known to fail to start).
    pub async fn ready(&self) -> Result<Arc<Instance>, EngineError> {
        let mut rx = self.shared.status.subscribe();
        let wait = rx.wait_for(|s| {
            matches!(
                s,
                EngineStatus::Ready(_)
                    | EngineStatus::Down {
                        startup_failure: true,
                        ..
                    }
            )
        });
        let res = tokio::time::timeout(self.shared.startup_timeout, wait).await;
        match res {
            Err(_) => Err(EngineError::Unavailable(
                "timed out waiting for the engine to start".into(),
            )),
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
        self.shared.waiting.fetch_add(1, Ordering::Relaxed);
        let permit = self.shared.permits.clone().acquire_owned().await;
        self.shared.waiting.fetch_sub(1, Ordering::Relaxed);
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
                    let p = permit
                        .take()
                        .expect("permit is taken once, right before returning");
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
            let _ = instance
                .stdin
                .send(to_line(&HostMessage::Generate(req.clone())));
            return Ok(Generation {
                id: req.id,
                prompt_len: req.tokens.len(),
                instance,
                rx,
                finished: false,
            });
        }
    }
}

async fn supervise(shared: Arc<Shared>) {
    const MIN_BACKOFF: Duration = Duration::from_millis(250);
    let mut backoff = MIN_BACKOFF;
    loop {
        shared.status.send_replace(EngineStatus::Starting);
        match start(&shared).await {
            Ok((instance, child, stdout)) => {
                set_permits(&shared, instance.info.parallel);
                let started = Instant::now();
                eprintln!(
                    "strata server: engine ready (pid {:?}, model {:?}, vocab {}, context {})",
                    instance.pid,
                    instance.info.name,
                    instance.info.vocab_size,
                    instance.info.context_length
                );
                shared
                    .status
                    .send_replace(EngineStatus::Ready(instance.clone()));
                let error = run_instance(&instance, child, stdout, shared.engine_timeout).await;
                eprintln!("strata server: {error}; restarting");
                // State first, then the failures: a client that got its error sees the restart.
                shared.restarts.fetch_add(1, Ordering::Relaxed);
                if started.elapsed() > Duration::from_secs(30) {
                    backoff = MIN_BACKOFF;
                }
                shared.status.send_replace(EngineStatus::Down {
                    error: error.clone(),
                    startup_failure: false,
                });
                instance.fail_all(&error);
            }
            Err(error) => {
                eprintln!("strata server: engine failed to start: {error}");
                shared.status.send_replace(EngineStatus::Down {
                    error,
                    startup_failure: true,
                });
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

fn set_permits(shared: &Shared, parallel: u32) {
    let mut sized = shared
        .permits_sized
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if !*sized {
        *sized = true;
        shared.permits.add_permits(parallel.max(1) as usize - 1);
    }
}

/// Spawn the process and wait for its hello line.
async fn start(shared: &Shared) -> Result<(Arc<Instance>, Child, BufReader<ChildStdout>), String> {
    let mut child = Command::new(&shared.executable)
        .args(&shared.args)
        .arg("--serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", shared.executable.display()))?;
    let pid = child.id();
    let stdout = child.stdout.take().ok_or("engine stdout not captured")?;
    let mut stdin = child.stdin.take().ok_or("engine stdin not captured")?;
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
                    return Err(format!(
                        "engine speaks protocol {protocol}, this server {PROTOCOL_VERSION}"
                    ));
                }
                // Tolerate stray output before the hello (e.g. a library printing a banner).
                _ => eprintln!(
                    "strata server: ignoring engine output before hello: {}",
                    line.trim_end()
                ),
            }
        }
    };
    let info = match tokio::time::timeout(shared.startup_timeout, hello).await {
        Ok(Ok(info)) => info,
        Ok(Err(e)) => return Err(with_exit_status(e, &mut child).await),
        Err(_) => return Err(format!("no hello line within {:?}", shared.startup_timeout)),
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
    });
    Ok((instance, child, stdout))
}

async fn with_exit_status(msg: String, child: &mut Child) -> String {
    match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
        Ok(Ok(status)) => format!("{msg} ({status})"),
        _ => msg,
    }
}

/// Route engine lines until stdout ends; returns why the engine is considered dead.
async fn run_instance(
    instance: &Instance,
    mut child: Child,
    mut stdout: BufReader<ChildStdout>,
    engine_timeout: Option<Duration>,
) -> String {
    let mut line = String::new();
    let why = loop {
        line.clear();
        match read_or_hang(instance, &mut stdout, &mut line, engine_timeout).await {
            Ok(0) => break "engine process closed its output".to_string(),
            Err(e) => break e,
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
                let route = instance
                    .routes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .map
                    .remove(&d.id);
                if let Some(r) = route {
                    let _ = r.tx.send(EngineEvent::Done(d));
                }
            }
            Ok(EngineMessage::Error { error }) => {
                eprintln!("strata server: engine reported: {error}")
            }
            Ok(EngineMessage::Hello { .. }) => {
                eprintln!("strata server: unexpected second hello from engine")
            }
            Err(e) => eprintln!(
                "strata server: unparsable engine line ({e}): {}",
                line.trim_end()
            ),
        }
    };
    // Stop routing first so nothing new is sent to a dying process, then reap it.
    if why.contains("no output") {
        let _ = child.start_kill();
    }
    instance
        .routes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .closed = true;
    let status = match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
        Ok(Ok(s)) => s.to_string(),
        _ => {
            let _ = child.kill().await;
            "killed after closing its output".to_string()
        }
    };
    format!("{why} ({status})")
}

/// One line from the engine; `Err` if reading fails or, with `engine_timeout`, if the engine
/// stays silent that long while requests are in flight (a hung engine).
async fn read_or_hang(
    instance: &Instance,
    stdout: &mut BufReader<ChildStdout>,
    line: &mut String,
    engine_timeout: Option<Duration>,
) -> Result<usize, String> {
    let Some(limit) = engine_timeout else {
        return stdout
            .read_line(line)
            .await
            .map_err(|e| format!("reading engine output: {e}"));
    };
    // The read future is kept across timer ticks (read_line is not cancel-safe).
    let read = stdout.read_line(line);
    tokio::pin!(read);
    let tick = limit.min(Duration::from_secs(1)) / 2;
    loop {
        tokio::select! {
            r = &mut read => return r.map_err(|e| format!("reading engine output: {e}")),
            _ = tokio::time::sleep(tick) => {
                if instance.in_flight() > 0 && instance.silent_for() > limit {
                    return Err(format!("engine produced no output for {limit:?} with requests in flight; killed"));
                }
            }
        }
    }
}
