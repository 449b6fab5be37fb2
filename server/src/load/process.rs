//! `strata server` as a child process, and signals for the fault tests.

use std::io::{self, BufRead};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `strata server` (or `examples/serve`), stopped (SIGINT, then SIGKILL) on drop.
pub struct ServerProcess {
    pub child: Child,
    pub addr: SocketAddr,
    /// Everything it wrote to stderr so far.
    pub log: Arc<Mutex<String>>,
}

impl ServerProcess {
    /// Run `exe args...` (which must include `--port 0` or a free port) and wait for its
    /// "listening on http://ADDR" line. Its stderr is drained into [`ServerProcess::log`] (and
    /// echoed when `echo`).
    pub fn spawn(exe: &Path, args: &[String], echo: bool) -> Result<ServerProcess, String> {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("running {}: {e}", exe.display()))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let l = log.clone();
        std::thread::spawn(move || {
            for line in io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if echo {
                    eprintln!("[server] {line}");
                }
                if let Some(a) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(a.trim().to_string());
                }
                let mut l = l.lock().unwrap_or_else(|p| p.into_inner());
                l.push_str(&line);
                l.push('\n');
            }
        });
        let mut p = ServerProcess { child, addr: "0.0.0.0:0".parse().unwrap(), log };
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(a) => {
                p.addr = a.parse().map_err(|e| format!("bad listening address {a:?}: {e}"))?;
                Ok(p)
            }
            Err(_) => Err(format!("{} did not print its listening line: {}", exe.display(), p.log_text())),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// SIGINT, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = signal(self.child.id(), "INT");
        let t0 = Instant::now();
        while t0.elapsed() < grace {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Send `SIG<name>` (`KILL`, `STOP`, `INT`, ...) to `pid` with kill(1).
pub fn signal(pid: u32, name: &str) -> Result<(), String> {
    let st =
        Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status().map_err(|e| format!("kill: {e}"))?;
    if st.success() { Ok(()) } else { Err(format!("kill -{name} {pid}: {st}")) }
}
