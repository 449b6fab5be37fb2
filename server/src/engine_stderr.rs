//! The engine's stderr: forwarded to the server's own stderr by a thread (best effort: a full
//! disk behind the log does not reach the engine), its last lines kept for the error a failed
//! start or a death is reported with.
//!
//! The reason is what the engine said, not its backtrace: `error:` lines (the `strata`
//! binary's "error: <cause chain>") and a panic's message are kept apart from the other lines,
//! so the frames of a `RUST_BACKTRACE` dump printed after them cannot push them out; when
//! there is no such line, the last lines that are no backtrace frames are reported.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The last lines an engine wrote to stderr, forwarded to the server's stderr by a thread.
#[derive(Debug, Default)]
pub struct StderrTail {
    state: Mutex<TailState>,
}

#[derive(Debug, Default)]
struct TailState {
    /// The last lines that are no backtrace noise.
    lines: VecDeque<String>,
    /// The last `error:` lines and panic messages.
    errors: VecDeque<String>,
    /// The previous line announced a panic: this one is its message.
    panic_next: bool,
    /// Bytes after the last line break.
    partial: Vec<u8>,
    eof: bool,
}

impl StderrTail {
    const LINES: usize = 4;
    const LINE_CHARS: usize = 400;

    /// Start forwarding `stderr` (None: nothing to forward).
    pub fn forward(stderr: Option<tokio::process::ChildStderr>) -> Arc<StderrTail> {
        let tail = Arc::new(StderrTail::default());
        let fd = stderr.and_then(|s| s.into_owned_fd().ok());
        let Some(fd) = fd else {
            tail.state.lock().unwrap_or_else(|p| p.into_inner()).eof = true;
            return tail;
        };
        let t = tail.clone();
        let spawned = std::thread::Builder::new().name("engine-stderr".into()).spawn(move || {
            let mut f = std::fs::File::from(fd);
            let mut buf = [0u8; 8192];
            loop {
                let n = match f.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                // Best effort: an unwritable log must not stop the engine.
                let _ = std::io::stderr().write_all(&buf[..n]);
                t.push(&buf[..n]);
            }
            t.close();
        });
        if spawned.is_err() {
            tail.close();
        }
        tail
    }

    pub fn push(&self, bytes: &[u8]) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for &b in bytes {
            if b == b'\n' || b == b'\r' {
                let line = std::mem::take(&mut s.partial);
                s.add_line(&line);
            } else if s.partial.len() < 4 * Self::LINE_CHARS {
                s.partial.push(b);
            }
        }
    }

    pub fn close(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let line = std::mem::take(&mut s.partial);
        s.add_line(&line);
        s.eof = true;
    }

    /// What the engine said last (oldest first): its error lines if it wrote any, else its
    /// last lines without backtrace frames; once it closed its stderr or after at most 1 s.
    pub async fn last_lines(&self) -> Vec<String> {
        let t0 = Instant::now();
        loop {
            {
                let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
                if s.eof || t0.elapsed() > Duration::from_secs(1) {
                    let pick = if s.errors.is_empty() { &s.lines } else { &s.errors };
                    return pick.iter().cloned().collect();
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `msg` with what the engine last said on stderr appended, if it said anything.
    pub async fn annotate(&self, msg: String) -> String {
        let lines = self.last_lines().await;
        if lines.is_empty() { msg } else { format!("{msg}; engine stderr: {}", lines.join(" | ")) }
    }
}

/// A line of a Rust backtrace dump, or the hint that offers one.
fn is_backtrace_noise(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    // Frames: "  12: std::rt::lang_start" and their locations "at src/main.rs:5:1".
    let frame =
        line.split_once(':').is_some_and(|(n, _)| !n.is_empty() && n.trim().bytes().all(|b| b.is_ascii_digit()));
    frame
        || line.starts_with("at ")
        || lower.starts_with("stack backtrace")
        || lower.starts_with("note: run with `rust_backtrace")
        || lower.starts_with("note: some details are omitted")
}

impl TailState {
    fn add_line(&mut self, raw: &[u8]) {
        let text = String::from_utf8_lossy(raw);
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        let text: String = text.chars().take(StderrTail::LINE_CHARS).collect();
        let panic_message = std::mem::take(&mut self.panic_next);
        if text.starts_with("thread '") && text.contains("panicked at") {
            // Since Rust 1.73 the message is on the next line; before, after `panicked at`.
            self.panic_next = text.ends_with(':');
            push_bounded(&mut self.errors, text.clone());
        } else if panic_message || text.to_ascii_lowercase().starts_with("error:") || text.starts_with("error[") {
            push_bounded(&mut self.errors, text.clone());
        }
        if !is_backtrace_noise(&text) {
            push_bounded(&mut self.lines, text);
        }
    }
}

fn push_bounded(q: &mut VecDeque<String>, line: String) {
    if q.len() == StderrTail::LINES {
        q.pop_front();
    }
    q.push_back(line);
}

#[cfg(test)]
mod tests {
    use super::StderrTail;

    async fn said(stderr: &str) -> Vec<String> {
        let t = StderrTail::default();
        t.push(stderr.as_bytes());
        t.close();
        t.last_lines().await
    }

    #[tokio::test]
    async fn the_error_line_survives_a_backtrace() {
        let dump = "loading model\nerror: --max-context 99999999 exceeds the model's 32768\n\n\
                    Stack backtrace:\n   0: anyhow::error::<impl anyhow::Error>::msg\n   \
                    1: strata::cli::run\n             at engine/src/cli/mod.rs:10:5\n   \
                    2: strata::main\n   3: std::rt::lang_start\n";
        assert_eq!(said(dump).await, vec!["error: --max-context 99999999 exceeds the model's 32768"]);
        let panic = "thread 'main' panicked at engine/src/x.rs:3:5:\nboom\nnote: run with \
                     `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        assert_eq!(said(panic).await, vec!["thread 'main' panicked at engine/src/x.rs:3:5:", "boom"]);
        // No error line: the last plain lines, frames left out.
        assert_eq!(said("a\nb\n   0: frame\nc\n").await, vec!["a", "b", "c"]);
    }
}
