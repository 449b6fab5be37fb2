//! A fake engine speaking the `--serve` token protocol, for testing the HTTP server without a
//! model (a bin target, not an example, so integration tests always get it built). It
//! "generates" by echoing the prompt: tokens `prompt[1..]` (the first token is taken to be
//! BOS), cyclically, so a test can predict the output text from the prompt alone.
//!
//! Flags (all optional; `--serve` is accepted and ignored):
//!   --name S            model name in the hello line (default "fake")
//!   --vocab N           vocab_size (default 262144, Gemma 3's)
//!   --context N         context_length (default 4096)
//!   --eog a,b,c         eog_tokens (default 1,106,212)
//!   --delay-ms N        sleep before each token (default 0)
//!   --hello-delay-ms N  sleep before the hello line, like loading a model (default 0)
//!   --crash-after N     exit(3) abruptly once N tokens were emitted by this process ...
//!   --crash-marker F    ... but only if file F does not exist yet (it is created), so the
//!                       restarted engine keeps running
//!   --hang-after N      stop (sleep for ever, silent but alive) once N tokens were emitted by
//!                       this process ...
//!   --hang-marker F     ... but only if file F does not exist yet (it is created)
//!   --log F             append every request as a JSON line to F
//!   --reply-tokens a,b  answer every request with these tokens, then the first EOG token
//!                       (instead of the echo): scripts an answer, e.g. a tool call
//!   --fail-on-start     exit(2) before the hello line
//!   --fail-with MSG     exit(1) before the hello line, printing `error: MSG` and then
//!                       backtrace frames to stderr (as `strata` with RUST_BACKTRACE set)
//!   --report-env NAME   put the environment variable NAME (null if unset) in the hello's
//!                       `engine.env` object (repeatable); `engine.cwd` is always the working
//!                       directory
//!   --stats h,l,a,o[,b,c,w[,p[,k]]]  report these counters in every done line (`stats`:
//!                       expert cache hits, lookups, drafts accepted, offered; bytes to VRAM,
//!                       CPU-pool µs, handoff wait µs; bytes read over PCIe; prompt tokens cached)

use server::protocol::{FinishReason, GenerateRequest, ModelInfo, RequestStats, TokenEngine, serve_loop};
use std::io::{BufReader, Write};
use std::path::PathBuf;
use std::time::Duration;

struct Fake {
    info: ModelInfo,
    delay: Duration,
    crash_after: Option<u64>,
    crash_marker: Option<PathBuf>,
    hang_after: Option<u64>,
    hang_marker: Option<PathBuf>,
    log: Option<PathBuf>,
    reply: Option<Vec<u32>>,
    stats: Option<RequestStats>,
    emitted: u64,
}

/// Whether a fault armed after `after` tokens fires now (`marker`: at most once per file).
fn fires(after: Option<u64>, marker: &Option<PathBuf>, emitted: u64) -> bool {
    match (after, marker) {
        (Some(n), _) if emitted < n => false,
        (Some(_), None) => true,
        // create_new is atomic: exactly one process fires per marker.
        (Some(_), Some(m)) => std::fs::OpenOptions::new().write(true).create_new(true).open(m).is_ok(),
        (None, _) => false,
    }
}

impl Fake {
    fn should_crash(&self) -> bool {
        fires(self.crash_after, &self.crash_marker, self.emitted)
    }

    fn hang_if_asked(&mut self) {
        if fires(self.hang_after, &self.hang_marker, self.emitted) {
            eprintln!("fake_engine: hanging after {} tokens as asked", self.emitted);
            self.hang_after = None;
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }
}

impl TokenEngine for Fake {
    fn info(&self) -> ModelInfo {
        self.info.clone()
    }

    fn request_stats(&mut self) -> Option<RequestStats> {
        self.stats.clone()
    }

    fn generate(&mut self, req: &GenerateRequest, emit: &mut dyn FnMut(u32) -> bool) -> Result<FinishReason, String> {
        if let Some(path) = &self.log {
            let line = serde_json::to_string(req).map_err(|e| e.to_string())?;
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| e.to_string())?;
            writeln!(f, "{line}").map_err(|e| e.to_string())?;
        }
        if let Some(reply) = &self.reply {
            for &t in reply.iter().chain(self.info.eog_tokens.first()) {
                std::thread::sleep(self.delay);
                self.emitted += 1;
                if !emit(t) {
                    break;
                }
            }
            return Ok(FinishReason::Stop);
        }
        let echo: &[u32] = if req.tokens.len() > 1 { &req.tokens[1..] } else { &req.tokens };
        let room = self.info.context_length as usize - req.tokens.len();
        for i in 0..room {
            if self.should_crash() {
                eprintln!("fake_engine: crashing after {} tokens as asked", self.emitted);
                std::process::exit(3);
            }
            self.hang_if_asked();
            std::thread::sleep(self.delay);
            self.emitted += 1;
            if !emit(echo[i % echo.len()]) {
                return Ok(FinishReason::Stop);
            }
        }
        Ok(FinishReason::Length)
    }
}

fn main() {
    let mut fake = Fake {
        info: ModelInfo {
            name: "fake".into(),
            vocab_size: 262_144,
            context_length: 4096,
            eog_tokens: vec![1, 106, 212],
            parallel: 1,
            engine: Some(serde_json::json!({"backend": "fake"})),
        },
        delay: Duration::ZERO,
        crash_after: None,
        crash_marker: None,
        hang_after: None,
        hang_marker: None,
        log: None,
        reply: None,
        stats: None,
        emitted: 0,
    };
    let mut report_env = serde_json::Map::new();
    let mut hello_delay = Duration::ZERO;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| panic!("fake_engine: {a} needs a value"));
        let num = |s: String| s.parse::<u64>().unwrap_or_else(|_| panic!("fake_engine: bad number {s}"));
        match a.as_str() {
            "--serve" => {}
            "--name" => fake.info.name = val(),
            "--vocab" => fake.info.vocab_size = num(val()) as u32,
            "--context" => fake.info.context_length = num(val()) as u32,
            "--eog" => fake.info.eog_tokens = val().split(',').map(|s| num(s.to_string()) as u32).collect(),
            "--delay-ms" => fake.delay = Duration::from_millis(num(val())),
            "--hello-delay-ms" => hello_delay = Duration::from_millis(num(val())),
            "--crash-after" => fake.crash_after = Some(num(val())),
            "--crash-marker" => fake.crash_marker = Some(PathBuf::from(val())),
            "--hang-after" => fake.hang_after = Some(num(val())),
            "--hang-marker" => fake.hang_marker = Some(PathBuf::from(val())),
            "--log" => fake.log = Some(PathBuf::from(val())),
            "--reply-tokens" => {
                fake.reply =
                    Some(val().split(',').filter(|s| !s.is_empty()).map(|s| num(s.to_string()) as u32).collect())
            }
            "--report-env" => {
                let name = val();
                let v = std::env::var(&name).ok();
                report_env.insert(name, v.into());
            }
            "--stats" => {
                let n: Vec<u64> = val().split(',').map(|s| num(s.to_string())).collect();
                assert!(
                    [4, 7, 8, 9].contains(&n.len()),
                    "fake_engine: --stats takes hits,lookups,accepted,offered[,bytes_to_vram,cpu_us,handoff_wait_us[,bytes_read_over_pcie[,prompt_cached]]]"
                );
                fake.stats = Some(RequestStats {
                    expert_cache_hits: Some(n[0]),
                    expert_cache_lookups: Some(n[1]),
                    draft_accepted: Some(n[2]),
                    draft_offered: Some(n[3]),
                    expert_bytes_to_vram: n.get(4).copied(),
                    expert_cpu_us: n.get(5).copied(),
                    expert_handoff_wait_us: n.get(6).copied(),
                    expert_bytes_read_over_pcie: n.get(7).copied(),
                    prompt_cached_tokens: n.get(8).copied(),
                });
            }
            "--fail-on-start" => {
                eprintln!("fake_engine: failing on start as asked");
                std::process::exit(2);
            }
            "--fail-with" => {
                // As `strata` fails with RUST_BACKTRACE set: the error line, then the frames.
                eprintln!("fake_engine: loading");
                eprintln!("error: {}", val());
                eprintln!("\nStack backtrace:");
                for (i, f) in ["anyhow::error::msg", "strata::cli::run", "strata::main"].iter().enumerate() {
                    eprintln!("   {i}: {f}\n             at src/main.rs:{}:5", 10 + i);
                }
                std::process::exit(1);
            }
            other => panic!("fake_engine: unknown flag {other}"),
        }
    }
    if let Some(serde_json::Value::Object(e)) = &mut fake.info.engine {
        let cwd = std::env::current_dir().ok();
        e.insert("cwd".into(), serde_json::json!(cwd));
        if !report_env.is_empty() {
            e.insert("env".into(), report_env.into());
        }
    }
    std::thread::sleep(hello_delay);
    let stdout = std::io::stdout();
    if let Err(e) = serve_loop(&mut fake, BufReader::new(std::io::stdin()), stdout.lock()) {
        eprintln!("fake_engine: {e}");
        std::process::exit(1);
    }
}
