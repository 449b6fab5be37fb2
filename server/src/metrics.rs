//! What the server counts: `GET /metrics` (Prometheus text format, through `prometheus-client`)
//! and the live and recent-request parts of `GET /v1/status`.
//!
//! Requests are counted by endpoint and status by a middleware around every route (the API
//! key's 401s included). Generations are recorded by [`Recording`], a guard `generate::drive`
//! holds: when it is dropped (the engine's done, an error, or the client gone) the request's
//! tokens, rates and times go into the counters and the recent-request list. Engine state
//! (queue, restarts) is read at scrape time; counters the engine reports in its `done` lines
//! (expert cache, drafts) appear only once some engine reported them.

use crate::engine_process::EngineHandle;
use crate::protocol::RequestStats;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The routes counted by name; anything else is counted as `other` (bounded label values).
pub const ENDPOINTS: &[&str] = &[
    "/health",
    "/metrics",
    "/v1/status",
    "/v1/models",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
];

/// How many finished requests `/v1/status` lists.
pub const RECENT: usize = 20;
/// The window of `/v1/status`'s `tokens_per_second`.
pub const WINDOW: Duration = Duration::from_secs(10);

tokio::task_local! {
    /// The endpoint of the request being handled, for the generation it starts.
    static ENDPOINT: &'static str;
}

fn endpoint_of(path: &str) -> &'static str {
    ENDPOINTS.iter().find(|&&e| e == path).copied().unwrap_or("other")
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: String,
    status: String,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    prompt_tokens: Counter,
    completion_tokens: Counter,
    prompt_rate: Histogram,
    decode_rate: Histogram,
    live: Arc<Live>,
}

/// State read at scrape time (a `Collector`): the engine's queue and restarts, the counters
/// the engine reported, and the requests at the engine now.
struct Live {
    engine: EngineHandle,
    state: Mutex<LiveState>,
}

#[derive(Default)]
struct LiveState {
    /// Sums of what engines reported (`None`: never reported).
    reported: RequestStats,
    /// Requests sent to the engine, by protocol id.
    active: HashMap<u64, Active>,
    /// Arrival times of generated tokens within [`WINDOW`].
    tokens: VecDeque<Instant>,
    /// Finished requests, newest last.
    recent: VecDeque<Value>,
}

#[derive(Clone)]
struct Active {
    endpoint: &'static str,
    prompt_tokens: usize,
    queue_ms: f64,
    sent: Instant,
    first: Option<Instant>,
    generated: u32,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Live(..)")
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn add(sum: &mut Option<u64>, v: Option<u64>) {
    if let Some(v) = v {
        *sum = Some(sum.unwrap_or(0) + v);
    }
}

impl prometheus_client::collector::Collector for Live {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (restarts, waiting, in_flight) = self.engine.counters();
        let counter = |enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64| {
            let m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(v).encode(m)
        };
        let gauge = |enc: &mut DescriptorEncoder, name: &str, help: &str, v: i64| {
            let m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(v).encode(m)
        };
        counter(&mut enc, "engine_restarts", "Engine process restarts (deaths and hung-engine kills)", restarts)?;
        gauge(&mut enc, "requests_waiting", "Requests waiting in the server's queue for the engine", waiting as i64)?;
        gauge(&mut enc, "requests_in_flight", "Requests sent to the engine and not finished", in_flight as i64)?;
        let r = lock(&self.state).reported.clone();
        for (name, help, v) in [
            (
                "expert_cache_hits",
                "Expert-cache lookups that found the expert resident (as reported by the engine)",
                r.expert_cache_hits,
            ),
            ("expert_cache_lookups", "Expert-cache lookups (as reported by the engine)", r.expert_cache_lookups),
            (
                "expert_bytes_to_vram",
                "Bytes copied into VRAM for the expert cache: admissions, swaps, staged misses (as reported by the engine)",
                r.expert_bytes_to_vram,
            ),
            (
                "expert_bytes_read_over_pcie",
                "Bytes of missed experts the device read in place from RAM over PCIe (as reported by the engine)",
                r.expert_bytes_read_over_pcie,
            ),
            (
                "expert_cpu_microseconds",
                "Time the expert cache's CPU pool spent on experts without a VRAM slot (as reported by the engine)",
                r.expert_cpu_us,
            ),
            (
                "expert_handoff_wait_microseconds",
                "Time the per-layer handoff's host thread waited for the device (as reported by the engine)",
                r.expert_handoff_wait_us,
            ),
            (
                "draft_tokens_accepted",
                "Speculative draft tokens accepted (as reported by the engine)",
                r.draft_accepted,
            ),
            ("draft_tokens_offered", "Speculative draft tokens offered (as reported by the engine)", r.draft_offered),
            (
                "prompt_tokens_cached",
                "Prompt tokens reused from the engine's previous request instead of computed (as reported by the engine)",
                r.prompt_cached_tokens,
            ),
        ] {
            if let Some(v) = v {
                counter(&mut enc, name, help, v)?;
            }
        }
        Ok(())
    }
}

impl Metrics {
    pub fn new(engine: EngineHandle) -> Metrics {
        let mut registry = Registry::with_prefix("strata");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by endpoint and status code (a stream counts with the status of its headers)",
            requests.clone(),
        );
        let prompt_tokens = Counter::default();
        registry.register(
            "prompt_tokens",
            "Prompt tokens of the requests sent to the engine (usage.prompt_tokens / input_tokens)",
            prompt_tokens.clone(),
        );
        let completion_tokens = Counter::default();
        registry.register(
            "completion_tokens",
            "Tokens the engine generated (usage.completion_tokens / output_tokens)",
            completion_tokens.clone(),
        );
        let buckets = || Histogram::new(exponential_buckets(1.0, 2.0, 17));
        let prompt_rate = buckets();
        registry.register(
            "prompt_tokens_per_second",
            "Prompt processing rate of each request: prompt tokens over the time to its first token",
            prompt_rate.clone(),
        );
        let decode_rate = buckets();
        registry.register(
            "decode_tokens_per_second",
            "Decode rate of each request with 2+ tokens: tokens after the first over the time after the first",
            decode_rate.clone(),
        );
        let live = Arc::new(Live { engine, state: Mutex::default() });
        registry.register_collector(Box::new(live.clone()));
        Metrics { registry, requests, prompt_tokens, completion_tokens, prompt_rate, decode_rate, live }
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }

    fn count_request(&self, endpoint: &str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels { endpoint: endpoint.to_string(), status: status.to_string() })
            .inc();
    }

    /// A request was sent to the engine (called in its handler's task, which knows the
    /// endpoint); the guard records it when dropped.
    pub fn sent(self: &Arc<Self>, id: u64, prompt_tokens: usize, queue_ms: f64) -> Recording {
        let endpoint = ENDPOINT.try_with(|e| *e).unwrap_or("other");
        lock(&self.live.state)
            .active
            .insert(id, Active { endpoint, prompt_tokens, queue_ms, sent: Instant::now(), first: None, generated: 0 });
        self.recording(id)
    }

    /// The guard that records generation `id` when dropped.
    pub fn recording(self: &Arc<Self>, id: u64) -> Recording {
        Recording { metrics: self.clone(), id, outcome: Outcome::Cancelled, stats: None }
    }

    /// `/v1/status`'s `live` part.
    pub fn live_json(&self) -> Value {
        let (restarts, waiting, in_flight) = self.live.engine.counters();
        let mut s = lock(&self.live.state);
        let now = Instant::now();
        trim(&mut s.tokens, now);
        let mut running: Vec<(u64, Active)> = s.active.iter().map(|(&id, a)| (id, a.clone())).collect();
        running.sort_by_key(|(id, _)| *id);
        let running: Vec<Value> = running
            .into_iter()
            .map(|(id, a)| {
                json!({"id": id, "endpoint": a.endpoint, "phase": if a.first.is_some() { "decode" } else { "prompt" },
                       "prompt_tokens": a.prompt_tokens, "generated_tokens": a.generated,
                       "elapsed_ms": ms(now - a.sent), "queue_ms": a.queue_ms,
                       // The engine does not report progress inside a prompt.
                       "prompt_progress": null})
            })
            .collect();
        json!({"requests_waiting": waiting, "requests_in_flight": in_flight, "engine_restarts": restarts,
               "tokens_per_second": s.tokens.len() as f64 / WINDOW.as_secs_f64(),
               "window_seconds": WINDOW.as_secs_f64(), "running": running,
               "reported": reported_json(&s.reported)})
    }

    /// The last [`RECENT`] finished requests, oldest first.
    pub fn recent_json(&self) -> Value {
        Value::Array(lock(&self.live.state).recent.iter().cloned().collect())
    }
}

fn reported_json(r: &RequestStats) -> Value {
    json!({"expert_cache_hits": r.expert_cache_hits, "expert_cache_lookups": r.expert_cache_lookups,
           "expert_bytes_to_vram": r.expert_bytes_to_vram, "expert_bytes_read_over_pcie": r.expert_bytes_read_over_pcie,
           "expert_cpu_us": r.expert_cpu_us, "expert_handoff_wait_us": r.expert_handoff_wait_us,
           "draft_accepted": r.draft_accepted, "draft_offered": r.draft_offered,
           "prompt_cached_tokens": r.prompt_cached_tokens})
}

fn trim(tokens: &mut VecDeque<Instant>, now: Instant) {
    while tokens.front().is_some_and(|&t| now - t > WINDOW) {
        tokens.pop_front();
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// How a generation ended, for the recent-request list.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Finished: `stop`, `stop_sequence` or `length`.
    Finished(&'static str),
    /// Failed with this HTTP status (500 engine failure, 504 engine timeout).
    Failed(u16),
    /// The client went away (or the handler was dropped) first.
    Cancelled,
}

/// Records one generation when dropped; `generate::drive` holds it.
pub struct Recording {
    metrics: Arc<Metrics>,
    id: u64,
    pub outcome: Outcome,
    /// What the engine reported in its done line.
    pub stats: Option<RequestStats>,
}

impl Recording {
    /// A token arrived.
    pub fn token(&self) {
        let now = Instant::now();
        let mut s = lock(&self.metrics.live.state);
        s.tokens.push_back(now);
        trim(&mut s.tokens, now);
        if let Some(a) = s.active.get_mut(&self.id) {
            a.first.get_or_insert(now);
            a.generated += 1;
        }
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        let m = &self.metrics;
        let mut s = lock(&m.live.state);
        let Some(a) = s.active.remove(&self.id) else {
            return;
        };
        let end = Instant::now();
        let first = a.first.unwrap_or(end);
        let (prompt_ms, decode_ms) = (ms(first - a.sent), ms(end - first));
        m.prompt_tokens.inc_by(a.prompt_tokens as u64);
        m.completion_tokens.inc_by(a.generated as u64);
        let prompt_rate = (a.first.is_some() && prompt_ms > 0.0).then(|| a.prompt_tokens as f64 * 1e3 / prompt_ms);
        let decode_rate = (a.generated >= 2 && decode_ms > 0.0).then(|| (a.generated - 1) as f64 * 1e3 / decode_ms);
        if let Some(r) = prompt_rate {
            m.prompt_rate.observe(r);
        }
        if let Some(r) = decode_rate {
            m.decode_rate.observe(r);
        }
        let stats = self.stats.clone().unwrap_or_default();
        add(&mut s.reported.expert_cache_hits, stats.expert_cache_hits);
        add(&mut s.reported.expert_cache_lookups, stats.expert_cache_lookups);
        add(&mut s.reported.expert_bytes_to_vram, stats.expert_bytes_to_vram);
        add(&mut s.reported.expert_bytes_read_over_pcie, stats.expert_bytes_read_over_pcie);
        add(&mut s.reported.expert_cpu_us, stats.expert_cpu_us);
        add(&mut s.reported.expert_handoff_wait_us, stats.expert_handoff_wait_us);
        add(&mut s.reported.draft_accepted, stats.draft_accepted);
        add(&mut s.reported.draft_offered, stats.draft_offered);
        add(&mut s.reported.prompt_cached_tokens, stats.prompt_cached_tokens);
        let (status, finish) = match self.outcome {
            Outcome::Finished(f) => (Some(200), f),
            Outcome::Failed(code) => (Some(code), "error"),
            Outcome::Cancelled => (None, "cancelled"),
        };
        let record = json!({
            "id": self.id, "endpoint": a.endpoint, "status": status, "finish": finish,
            "prompt_tokens": a.prompt_tokens, "completion_tokens": a.generated,
            "queue_ms": a.queue_ms, "prompt_ms": prompt_ms, "decode_ms": decode_ms,
            "prompt_per_second": prompt_rate, "decode_per_second": decode_rate,
            "expert_cache_hits": stats.expert_cache_hits, "expert_cache_lookups": stats.expert_cache_lookups,
            "expert_bytes_to_vram": stats.expert_bytes_to_vram, "expert_bytes_read_over_pcie": stats.expert_bytes_read_over_pcie,
            "expert_cpu_us": stats.expert_cpu_us, "expert_handoff_wait_us": stats.expert_handoff_wait_us,
            "draft_accepted": stats.draft_accepted, "draft_offered": stats.draft_offered,
            "prompt_cached_tokens": stats.prompt_cached_tokens,
            "finished_at": crate::http::now(),
        });
        if s.recent.len() == RECENT {
            s.recent.pop_front();
        }
        s.recent.push_back(record);
    }
}

/// Middleware: count every answered request by endpoint and status, and let the handler's
/// generation know its endpoint.
pub async fn track(State(m): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let endpoint = endpoint_of(req.uri().path());
    let resp = ENDPOINT.scope(endpoint, next.run(req)).await;
    m.count_request(endpoint, resp.status().as_u16());
    resp
}
