//! Load test of `strata server` (docs/reliability.md): N concurrent clients for T seconds,
//! a rotating mix of `/v1/chat/completions`, `/v1/completions` and `/v1/messages`, streaming
//! and not, with some streams hung up after their first token, `max_tokens` small so requests
//! cycle. Reports failed requests (must be 0), the order of service against the order of
//! arrival (must match), time to first token, tokens/s and the RSS of the server and the engine
//! over time (must be flat after warm-up). Exit status 0 = pass, 1 = fail, 2 = could not run.
//!
//! ```sh
//! loadtest --strata target/release/strata                 # 32 clients x 300 s, default model
//! loadtest --ci --strata target/release/strata -- -m M.gguf   # 8 x 30 s (server flags after --)
//! loadtest --url http://127.0.0.1:8080 --server-pid PID   # a running server
//! ```
//! Loopback only: the client is the minimal one in `server::load`.

use clap::Parser;
use server::load::{LoadOptions, ServerProcess, run_load, wait_healthy};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(about = "Load test of strata server (docs/reliability.md)")]
struct Cli {
    /// A running server (http://HOST:PORT on loopback).
    #[arg(long, conflicts_with = "strata")]
    url: Option<String>,
    /// Start `STRATA server --port 0 [SERVER_ARGS]` and test it (stopped at the end).
    #[arg(long, value_name = "STRATA")]
    strata: Option<PathBuf>,
    /// Concurrent clients (default 32; --ci: 8).
    #[arg(long)]
    clients: Option<usize>,
    /// Seconds during which clients start requests (default 300; --ci: 30).
    #[arg(long)]
    seconds: Option<u64>,
    /// The CI run: 8 clients x 30 s unless given.
    #[arg(long)]
    ci: bool,
    /// Largest max_tokens of a request (each uses max/2 ..= max).
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
    /// Every n-th streaming request of a client hangs up after its first token (0 = none).
    #[arg(long, default_value_t = 4)]
    cancel_every: usize,
    /// Seconds of warm-up excluded from the RSS figures (default: a sixth of the run, at most 30).
    #[arg(long)]
    warmup: Option<u64>,
    /// The server's pid, for its RSS (with --url; --strata knows it).
    #[arg(long)]
    server_pid: Option<u32>,
    /// Fail if a process's RSS grows more than this after warm-up (MiB).
    #[arg(long, default_value_t = 32)]
    rss_growth_limit_mb: u64,
    /// A request sent this long after another must be served after it (ms).
    #[arg(long, default_value_t = 100)]
    order_slack_ms: u64,
    /// Write the whole report (every RSS sample included) as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Echo the started server's log.
    #[arg(long)]
    verbose: bool,
    /// `strata server` flags (with --strata), after `--`.
    #[arg(last = true)]
    server_args: Vec<String>,
}

fn main() {
    let cli = Cli::parse();
    match run(cli) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("loadtest: {e}");
            std::process::exit(2);
        }
    }
}

fn run(cli: Cli) -> Result<bool, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut spawned = None;
    let (addr, server_pid): (SocketAddr, Option<u32>) = match (&cli.url, &cli.strata) {
        (Some(u), _) => {
            let hostport = u.trim_start_matches("http://").trim_end_matches('/').trim_end_matches("/v1");
            let a = hostport.parse().map_err(|e| format!("--url {u}: want http://IP:PORT ({e})"))?;
            (a, cli.server_pid)
        }
        (None, Some(exe)) => {
            let mut args = vec!["server".to_string(), "--port".into(), "0".into()];
            args.extend(cli.server_args.iter().cloned());
            let p = ServerProcess::spawn(exe, &args, cli.verbose)?;
            let a = (p.addr, Some(p.pid()));
            spawned = Some(p);
            a
        }
        (None, None) => return Err("give --url or --strata".into()),
    };
    let (clients, seconds) = match cli.ci {
        true => (cli.clients.unwrap_or(8), cli.seconds.unwrap_or(30)),
        false => (cli.clients.unwrap_or(32), cli.seconds.unwrap_or(300)),
    };
    let mut o = LoadOptions::new(addr, clients, Duration::from_secs(seconds));
    o.max_tokens = cli.max_tokens.max(1);
    o.cancel_every = cli.cancel_every;
    o.server_pid = server_pid;
    o.rss_growth_limit_kb = cli.rss_growth_limit_mb << 10;
    o.order_slack = Duration::from_millis(cli.order_slack_ms);
    if let Some(w) = cli.warmup {
        o.warmup = Duration::from_secs(w);
    }
    let report = rt.block_on(async {
        wait_healthy(addr, Duration::from_secs(600)).await?;
        eprintln!("loadtest: {clients} clients x {seconds} s against http://{addr} (server pid {server_pid:?})");
        Ok::<_, String>(run_load(&o).await)
    });
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            if let Some(p) = &spawned {
                eprintln!("loadtest: server log:\n{}", p.log_text());
            }
            return Err(e);
        }
    };
    println!("{}", report.summary());
    if let Some(path) = &cli.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if !report.passed
        && let Some(p) = &spawned
    {
        let log = p.log_text();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        eprintln!("loadtest: last server log lines:");
        for l in tail.iter().rev() {
            eprintln!("  {l}");
        }
    }
    drop(spawned);
    Ok(report.passed)
}
