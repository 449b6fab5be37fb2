//! The load test: the request mix, the runner and its checks (no failed request, service in
//! arrival order, RSS flat after warm-up) and the report.

use super::client::*;
use super::request::*;
use serde::Serialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHAT_PROMPTS: &[&str] = &[
    "Write a haiku about the sea.",
    "What is a linked list? One sentence.",
    "Name three prime numbers.",
    "Explain recursion to a child in one sentence.",
    "Give me a short name for a cat.",
    "What does HTTP stand for?",
    "Say hello in French and in Spanish.",
    "Write one line of Python that prints the numbers 1 to 5.",
];
const CODE_PROMPTS: &[&str] = &[
    "def fibonacci(n):",
    "// A function that reverses a string in C\nchar *reverse(char *s) {",
    "fn main() {\n    let v = vec![3, 1, 2];",
    "SELECT name FROM users WHERE",
    "import numpy as np\n\ndef normalize(x):",
    "#include <stdio.h>\nint main(void) {",
];

/// The `seq`-th request of client `client`: the APIs, streaming or not, and planned hang-ups
/// rotate so every client sends every kind and neighbours send different kinds at once.
pub fn spec_for(client: usize, seq: usize, max_tokens: u32, cancel_every: usize) -> Spec {
    let k = client * 7 + seq;
    let (api, stream) = match k % 6 {
        0 => (Api::Chat, true),
        1 => (Api::Completion, false),
        2 => (Api::Messages, true),
        3 => (Api::Chat, false),
        4 => (Api::Completion, true),
        _ => (Api::Messages, false),
    };
    // A client's requests alternate between streaming and not: seq / 2 counts its streams.
    let cancel = stream && cancel_every > 0 && (client + seq / 2) % cancel_every == cancel_every - 1;
    let prompt = match api {
        Api::Completion => CODE_PROMPTS[k % CODE_PROMPTS.len()],
        _ => CHAT_PROMPTS[k % CHAT_PROMPTS.len()],
    };
    let lo = (max_tokens / 2).max(1);
    Spec {
        api,
        stream,
        cancel,
        max_tokens: lo + (k as u32 % (max_tokens - lo + 1)),
        prompt: prompt.to_string(),
        seed: k as u64,
    }
}

#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub addr: SocketAddr,
    pub clients: usize,
    /// Clients start requests for this long, then finish the ones in flight.
    pub duration: Duration,
    /// RSS samples before this are warm-up (not in first/last/growth).
    pub warmup: Duration,
    /// Largest `max_tokens` (requests use max/2 ..= max).
    pub max_tokens: u32,
    /// Every n-th streaming request of a client hangs up after its first token (0: none).
    pub cancel_every: usize,
    /// The server's pid, for its RSS (the engine's comes from `/health`).
    pub server_pid: Option<u32>,
    /// One request's limit (queueing included).
    pub request_timeout: Duration,
    /// A request sent this long after another was answered has to be served after it.
    pub order_slack: Duration,
    /// Largest allowed RSS growth from the first sample after warm-up to the last, per process.
    pub rss_growth_limit_kb: u64,
    pub rss_interval: Duration,
}

impl LoadOptions {
    pub fn new(addr: SocketAddr, clients: usize, duration: Duration) -> LoadOptions {
        LoadOptions {
            addr,
            clients,
            duration,
            warmup: (duration / 6).min(Duration::from_secs(30)),
            max_tokens: 16,
            cancel_every: 4,
            server_pid: None,
            request_timeout: Duration::from_secs(60) + Duration::from_secs(8) * clients as u32,
            order_slack: Duration::from_millis(100),
            rss_growth_limit_kb: 32 << 10,
            rss_interval: Duration::from_secs(1),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct RssSample {
    pub t_s: f64,
    /// VmRSS.
    pub server_kb: Option<u64>,
    pub engine_kb: Option<u64>,
    /// RssAnon: the heap and stacks, what a leak grows (VmRSS also counts the pages of the
    /// memory-mapped model that decoding has touched so far).
    pub server_anon_kb: Option<u64>,
    pub engine_anon_kb: Option<u64>,
    pub engine_pid: Option<u32>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RssSummary {
    pub first_kb: u64,
    pub last_kb: u64,
    pub peak_kb: u64,
    /// Least-squares slope over the samples after warm-up.
    pub slope_kb_per_min: f64,
    pub samples: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Percentiles {
    pub n: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    fn of(mut v: Vec<f64>) -> Percentiles {
        if v.is_empty() {
            return Percentiles::default();
        }
        v.sort_by(f64::total_cmp);
        // Nearest rank.
        let at = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Percentiles { n: v.len(), p50_ms: at(0.50), p99_ms: at(0.99), max_ms: v[v.len() - 1] }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct OrderCheck {
    /// Requests with queue headers.
    pub requests: usize,
    /// Served (protocol id order) before a request that entered the queue more than the slack
    /// earlier (server clock): must be 0.
    pub server_inversions: usize,
    /// Such inversions within the slack (threads racing to the queue): reported only.
    pub server_inversions_within_slack: usize,
    /// `x-strata-started-us` not increasing with the id: must be 0.
    pub start_inversions: usize,
    /// A request sent more than the slack after another one was served before it (client
    /// clock): must be 0.
    pub client_inversions: usize,
    pub slack_ms: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadReport {
    pub clients: usize,
    pub duration_s: f64,
    pub wall_s: f64,
    pub requests: usize,
    pub completed: usize,
    pub cancelled: usize,
    pub failed: usize,
    pub failures: Vec<String>,
    pub by_kind: Vec<(String, usize)>,
    /// Streaming requests: request sent → first text delta (queueing included).
    pub ttft: Percentiles,
    /// Queue wait at the server (`started - queued`).
    pub queue_wait: Percentiles,
    /// Request sent → last byte, completed requests.
    pub latency: Percentiles,
    pub tokens: u64,
    /// All requests' tokens over the wall time from the first request to the last answer.
    pub tokens_per_s: f64,
    /// Mean of the engine's own decode rate (`timings.predicted_per_second`).
    pub decode_tps_mean: f64,
    pub order: OrderCheck,
    pub server_rss: Option<RssSummary>,
    pub engine_rss: Option<RssSummary>,
    pub server_anon: Option<RssSummary>,
    pub engine_anon: Option<RssSummary>,
    pub engine_pids: Vec<u32>,
    pub rss_growth_limit_kb: u64,
    pub rss: Vec<RssSample>,
    pub passed: bool,
    pub verdict: Vec<String>,
}

/// VmRSS of a process in KiB (None if it is gone).
pub fn rss_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "VmRSS:")
}

/// RssAnon of a process in KiB.
pub fn rss_anon_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "RssAnon:")
}

fn status_kb(pid: u32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok())
}

fn summarize_rss(v: &[(f64, u64)]) -> Option<RssSummary> {
    let (first, last) = (v.first()?.1, v.last()?.1);
    let n = v.len() as f64;
    let (mt, mk) = (v.iter().map(|s| s.0).sum::<f64>() / n, v.iter().map(|s| s.1 as f64).sum::<f64>() / n);
    let (mut num, mut den) = (0.0, 0.0);
    for &(t, k) in v {
        num += (t - mt) * (k as f64 - mk);
        den += (t - mt) * (t - mt);
    }
    Some(RssSummary {
        first_kb: first,
        last_kb: last,
        peak_kb: v.iter().map(|s| s.1).max().unwrap_or(0),
        slope_kb_per_min: if den > 0.0 { num / den * 60.0 } else { 0.0 },
        samples: v.len(),
    })
}

/// Run the load test.
pub async fn run_load(opts: &LoadOptions) -> LoadReport {
    let t0 = Instant::now();
    let outcomes = Arc::new(Mutex::new(Vec::<Outcome>::new()));
    let stop_sampling = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (stop, addr, server_pid, every) = (stop_sampling.clone(), opts.addr, opts.server_pid, opts.rss_interval);
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let engine_pid = match health(addr).await {
                    Ok((_, v)) => v["engine_pid"].as_u64().map(|p| p as u32),
                    Err(_) => None,
                };
                samples.push(RssSample {
                    t_s: t0.elapsed().as_secs_f64(),
                    server_kb: server_pid.and_then(rss_kb),
                    engine_kb: engine_pid.and_then(rss_kb),
                    server_anon_kb: server_pid.and_then(rss_anon_kb),
                    engine_anon_kb: engine_pid.and_then(rss_anon_kb),
                    engine_pid,
                });
                tokio::time::sleep(every).await;
            }
            samples
        })
    };
    let mut tasks = Vec::new();
    for client in 0..opts.clients {
        let (outcomes, o) = (outcomes.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            // Spread the first requests over 100 ms so their arrival order is a real order.
            tokio::time::sleep(Duration::from_millis(client as u64 * 100 / o.clients as u64)).await;
            let mut seq = 0;
            while t0.elapsed() < o.duration {
                let spec = spec_for(client, seq, o.max_tokens, o.cancel_every);
                let sent = ms(t0);
                let mut out = match tokio::time::timeout(o.request_timeout, run_one(o.addr, &spec, t0)).await {
                    Ok(out) => out,
                    Err(_) => Outcome {
                        api: Some(spec.api),
                        stream: spec.stream,
                        cancel: spec.cancel,
                        sent_ms: sent,
                        end_ms: ms(t0),
                        error: Some(format!("no answer within {:?}", o.request_timeout)),
                        ..Default::default()
                    },
                };
                out.client = client;
                out.seq = seq;
                outcomes.lock().unwrap_or_else(|p| p.into_inner()).push(out);
                seq += 1;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let wall = t0.elapsed();
    stop_sampling.store(true, std::sync::atomic::Ordering::Relaxed);
    let samples = sampler.await.unwrap_or_default();
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap_or_else(|p| p.into_inner()));
    report(opts, outcomes, samples, wall)
}

fn order_check(outcomes: &[Outcome], slack: Duration) -> OrderCheck {
    let slack_us = slack.as_micros() as u64;
    let mut q: Vec<(u64, u64, u64, f64)> =
        outcomes.iter().filter_map(|o| o.queue.map(|(id, qu, st)| (id, qu, st, o.sent_ms))).collect();
    q.sort_by_key(|x| x.0);
    let mut c = OrderCheck { requests: q.len(), slack_ms: slack.as_secs_f64() * 1e3, ..Default::default() };
    let mut max_queued = 0u64;
    for (i, &(_, queued, started, _)) in q.iter().enumerate() {
        if i > 0 && started < q[i - 1].2 {
            c.start_inversions += 1;
        }
        if max_queued > queued {
            if max_queued > queued + slack_us {
                c.server_inversions += 1;
            } else {
                c.server_inversions_within_slack += 1;
            }
        }
        max_queued = max_queued.max(queued);
    }
    // Client clock: a request sent more than the slack (the server's work before the queue:
    // parsing, templating, tokenizing) after another reached the queue after it, so it must be
    // served after it.
    let slack_ms = c.slack_ms;
    let mut by_sent: Vec<(f64, u64)> = q.iter().map(|x| (x.3, x.0)).collect();
    by_sent.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut k, mut max_id) = (0, 0u64);
    for &(sent, id) in &by_sent {
        while k < by_sent.len() && by_sent[k].0 + slack_ms < sent {
            max_id = max_id.max(by_sent[k].1);
            k += 1;
        }
        if max_id > id {
            c.client_inversions += 1;
        }
    }
    c
}

fn report(opts: &LoadOptions, outcomes: Vec<Outcome>, samples: Vec<RssSample>, wall: Duration) -> LoadReport {
    let mut r = LoadReport {
        clients: opts.clients,
        duration_s: opts.duration.as_secs_f64(),
        wall_s: wall.as_secs_f64(),
        requests: outcomes.len(),
        rss_growth_limit_kb: opts.rss_growth_limit_kb,
        ..Default::default()
    };
    let mut kinds: HashMap<String, usize> = HashMap::new();
    let (mut ttft, mut wait, mut lat, mut tps) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for o in &outcomes {
        let kind = format!(
            "{:?}{}{}",
            o.api.unwrap_or(Api::Chat),
            if o.stream { "+stream" } else { "" },
            if o.cancel { "+cancel" } else { "" }
        )
        .to_lowercase();
        *kinds.entry(kind).or_default() += 1;
        if !o.ok {
            r.failed += 1;
            if r.failures.len() < 20 {
                r.failures.push(format!(
                    "client {} #{} {:?} stream={}: {}",
                    o.client,
                    o.seq,
                    o.api,
                    o.stream,
                    o.error.as_deref().unwrap_or("?")
                ));
            }
            continue;
        }
        if o.cancelled {
            r.cancelled += 1;
        } else {
            r.completed += 1;
            lat.push(o.end_ms - o.sent_ms);
        }
        r.tokens += o.tokens as u64;
        if o.stream
            && let Some(f) = o.first_token_ms
        {
            ttft.push(f - o.sent_ms);
        }
        if let Some((_, q, s)) = o.queue {
            wait.push(s.saturating_sub(q) as f64 / 1e3);
        }
        if let Some(t) = o.decode_tps.filter(|t| *t > 0.0) {
            tps.push(t);
        }
    }
    let mut by_kind: Vec<_> = kinds.into_iter().collect();
    by_kind.sort();
    r.by_kind = by_kind;
    r.ttft = Percentiles::of(ttft);
    r.queue_wait = Percentiles::of(wait);
    r.latency = Percentiles::of(lat);
    let first = outcomes.iter().map(|o| o.sent_ms).fold(f64::MAX, f64::min);
    let last = outcomes.iter().map(|o| o.end_ms).fold(0.0, f64::max);
    if last > first {
        r.tokens_per_s = r.tokens as f64 / ((last - first) / 1e3);
    }
    if !tps.is_empty() {
        r.decode_tps_mean = tps.iter().sum::<f64>() / tps.len() as f64;
    }
    r.order = order_check(&outcomes, opts.order_slack);
    let warm = opts.warmup.as_secs_f64();
    let after: Vec<&RssSample> = samples.iter().filter(|s| s.t_s >= warm).collect();
    let series = |f: &dyn Fn(&RssSample) -> Option<u64>| -> Vec<(f64, u64)> {
        after.iter().filter_map(|s| Some((s.t_s, f(s)?))).collect()
    };
    // The engine's series restarts with a new process; use the last one's samples.
    let last_pid = after.iter().rev().find_map(|s| s.engine_pid);
    r.server_rss = summarize_rss(&series(&|s| s.server_kb));
    r.engine_rss = summarize_rss(&series(&|s| s.engine_kb.filter(|_| s.engine_pid == last_pid)));
    r.server_anon = summarize_rss(&series(&|s| s.server_anon_kb));
    r.engine_anon = summarize_rss(&series(&|s| s.engine_anon_kb.filter(|_| s.engine_pid == last_pid)));
    let mut pids: Vec<u32> = samples.iter().filter_map(|s| s.engine_pid).collect();
    pids.dedup();
    r.engine_pids = pids;
    r.rss = samples;

    let mut verdict = Vec::new();
    if r.failed > 0 {
        verdict.push(format!("{} failed requests", r.failed));
    }
    if r.completed == 0 {
        verdict.push("no request completed".into());
    }
    let o = &r.order;
    if o.server_inversions + o.start_inversions + o.client_inversions > 0 {
        verdict.push(format!(
            "out of arrival order: {} server, {} start, {} client inversions",
            o.server_inversions, o.start_inversions, o.client_inversions
        ));
    }
    if o.requests == 0 {
        verdict.push("no queue headers (x-strata-request-id): cannot check the order".into());
    }
    for (name, s) in [
        ("server RSS", &r.server_rss),
        ("engine RSS", &r.engine_rss),
        ("server RssAnon", &r.server_anon),
        ("engine RssAnon", &r.engine_anon),
    ] {
        if let Some(s) = s
            && s.last_kb > s.first_kb + opts.rss_growth_limit_kb
        {
            verdict.push(format!(
                "{name} grew {} KiB after warm-up (limit {})",
                s.last_kb - s.first_kb,
                opts.rss_growth_limit_kb
            ));
        }
    }
    r.passed = verdict.is_empty();
    r.verdict = verdict;
    r
}

impl LoadReport {
    /// The figures, for a terminal.
    pub fn summary(&self) -> String {
        let mb = |k: u64| k as f64 / 1024.0;
        let rss = |s: &Option<RssSummary>| match s {
            Some(s) => format!(
                "first {:.1} MiB, last {:.1} MiB, peak {:.1} MiB, slope {:+.2} MiB/min ({} samples)",
                mb(s.first_kb),
                mb(s.last_kb),
                mb(s.peak_kb),
                s.slope_kb_per_min / 1024.0,
                s.samples
            ),
            None => "not sampled".into(),
        };
        let p = |p: &Percentiles| {
            format!("p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (n={})", p.p50_ms, p.p99_ms, p.max_ms, p.n)
        };
        let o = &self.order;
        let mut s = format!(
            "clients {} x {:.0} s (wall {:.1} s): {} requests, {} completed, {} cancelled mid-stream, {} failed\n",
            self.clients, self.duration_s, self.wall_s, self.requests, self.completed, self.cancelled, self.failed
        );
        s += &format!(
            "kinds: {}\n",
            self.by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ")
        );
        s += &format!("time to first token (streaming, queue included): {}\n", p(&self.ttft));
        s += &format!("queue wait at the server: {}\n", p(&self.queue_wait));
        s += &format!("latency (completed): {}\n", p(&self.latency));
        s += &format!(
            "tokens: {} at {:.2} tokens/s overall; engine decode {:.2} tokens/s (mean of timings)\n",
            self.tokens, self.tokens_per_s, self.decode_tps_mean
        );
        s += &format!(
            "order: {} requests; inversions: server {} (+{} within {:.0} ms), start {}, client {}\n",
            o.requests,
            o.server_inversions,
            o.server_inversions_within_slack,
            o.slack_ms,
            o.start_inversions,
            o.client_inversions
        );
        s += &format!("server RSS: {}\n", rss(&self.server_rss));
        s += &format!("  of which RssAnon: {}\n", rss(&self.server_anon));
        s += &format!("engine RSS: {}\n", rss(&self.engine_rss));
        s += &format!("  of which RssAnon: {}\n", rss(&self.engine_anon));
        s += &format!("engine pids: {:?}\n", self.engine_pids);
        for f in &self.failures {
            s += &format!("failure: {f}\n");
        }
        s += &if self.passed { "PASS".to_string() } else { format!("FAIL: {}", self.verdict.join("; ")) };
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_parser_splits_events_across_pieces() {
        let mut p = SseParser::default();
        assert!(p.push(b"event: a\ndata: {\"x\"").is_empty());
        let ev = p.push(b": 1}\n\n: keep-alive\n\ndata: [DONE]\n\n");
        assert_eq!(ev, vec![(Some("a".to_string()), "{\"x\": 1}".to_string()), (None, "[DONE]".to_string())]);
    }

    #[test]
    fn percentiles_nearest_rank() {
        let p = Percentiles::of((1..=100).map(f64::from).collect());
        assert_eq!((p.p50_ms, p.p99_ms, p.max_ms), (50.0, 99.0, 100.0));
    }

    #[test]
    fn order_check_counts_inversions() {
        let o = |id, queued, sent_ms, head_ms| Outcome {
            queue: Some((id, queued, queued + 10)),
            sent_ms,
            head_ms: Some(head_ms),
            ..Default::default()
        };
        // In order.
        let c = order_check(&[o(1, 100, 0.0, 10.0), o(2, 200, 1.0, 20.0)], Duration::ZERO);
        assert_eq!((c.server_inversions, c.start_inversions, c.client_inversions), (0, 0, 0));
        // Id 2 entered the queue 1 s before id 1 but was served after it.
        let c = order_check(&[o(1, 1_000_100, 0.0, 10.0), o(2, 100, 1.0, 20.0)], Duration::from_millis(5));
        assert_eq!(c.server_inversions, 1);
        // Sent 600 ms after id 2, id 1 was served before it.
        let c = order_check(&[o(1, 100, 600.0, 700.0), o(2, 100, 0.0, 50.0)], Duration::from_millis(100));
        assert_eq!(c.client_inversions, 1);
        // ... but 50 ms is within the slack.
        let c = order_check(&[o(1, 100, 50.0, 700.0), o(2, 100, 0.0, 50.0)], Duration::from_millis(100));
        assert_eq!(c.client_inversions, 0);
    }

    #[test]
    fn spec_mix_covers_every_kind() {
        let mut seen = std::collections::HashSet::new();
        for c in 0..8 {
            for s in 0..6 {
                let sp = spec_for(c, s, 16, 4);
                assert!((8..=16).contains(&sp.max_tokens));
                assert!(!sp.cancel || sp.stream);
                seen.insert((sp.api, sp.stream, sp.cancel));
            }
        }
        assert_eq!(seen.len(), 9, "{seen:?}"); // 3 APIs x {json, stream, stream+cancel}
    }
}
