//! `GET /v1/status`: the engine's facts agree with `/health` and `/v1/models`, the recent
//! requests with the responses' usage, the live part shows a running request, and the machine
//! part is read from this machine's `/proc`.

use crate::support::*;
use serde_json::{Value, json};
use std::time::Duration;

async fn status(srv: &TestServer) -> Value {
    let r = request(srv.addr, "GET", "/v1/status", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_facts_match_health_and_models() {
    let srv = start_server(&["--name", "status-model", "--context", "2048"]).await;
    let health = wait_healthy(&srv).await;
    let models = request(srv.addr, "GET", "/v1/models", None).await.json();
    let s = status(&srv).await;
    let e = &s["engine"];
    assert_eq!(e["status"], "ok");
    assert_eq!(e["model"], models["data"][0]["id"]);
    assert_eq!(e["engine_model"], "status-model");
    assert_eq!(e["context_length"], 2048);
    assert_eq!(e["context_length"], models["data"][0]["meta"]["context_length"]);
    assert_eq!(e["vocab_size"], models["data"][0]["meta"]["vocab_size"]);
    assert_eq!(e["pid"], health["engine_pid"]);
    assert_eq!(e["settings"], health["engine"]);
    assert_eq!(e["backend"], "fake");
    // From the tokenizer GGUF (Gemma 3); the fake engine reports no KV type or expert cache.
    assert_eq!(e["arch"], "gemma3");
    assert_eq!(e["kv_type"], Value::Null);
    assert_eq!(e["expert_cache_slots"], Value::Null);
    assert_eq!(e["parallel"], 1);
    let live = &s["live"];
    assert_eq!(live["requests_waiting"], health["requests_waiting"]);
    assert_eq!(live["requests_in_flight"], health["requests_in_flight"]);
    assert_eq!(live["engine_restarts"], health["engine_restarts"]);
    assert_eq!(live["running"], json!([]));
    assert_eq!(s["recent"], json!([]));
    assert_eq!(s["server"]["version"], env!("CARGO_PKG_VERSION"));

    // The machine, from /proc (this test runs on Linux).
    let m = &s["machine"];
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    let cpus = cpuinfo.lines().filter(|l| l.starts_with("processor")).count();
    assert_eq!(m["cpu"]["logical_cpus"], cpus);
    assert!(m["cpu"]["usable_cpus"].as_u64().unwrap() >= 1);
    let total = m["memory"]["total_bytes"].as_u64().unwrap();
    let avail = m["memory"]["available_bytes"].as_u64().unwrap();
    assert!(total > 0 && avail > 0 && avail <= total, "{m}");
    assert!(m["gpus"].is_array());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recent_requests_carry_the_usage_and_times_of_the_responses() {
    let srv = start_server(&["--stats", "7,9,0,0"]).await;
    wait_healthy(&srv).await;
    let r = post(&srv, "/v1/completions", json!({"prompt": "one two three", "max_tokens": 4})).await;
    let usage = r.json()["usage"].clone();
    let r = post(&srv, "/v1/messages", json!({"max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]})).await;
    let a_usage = r.json()["usage"].clone();
    let s = status(&srv).await;
    let recent = s["recent"].as_array().unwrap();
    assert_eq!(recent.len(), 2, "{recent:?}");
    let (c, m) = (&recent[0], &recent[1]);
    assert_eq!(c["endpoint"], "/v1/completions");
    assert_eq!(c["status"], 200);
    assert_eq!(c["finish"], "length");
    assert_eq!(c["prompt_tokens"], usage["prompt_tokens"]);
    assert_eq!(c["completion_tokens"], usage["completion_tokens"]);
    assert_eq!(c["expert_cache_hits"], 7);
    assert_eq!(c["expert_cache_lookups"], 9);
    for k in ["queue_ms", "prompt_ms", "decode_ms", "decode_per_second"] {
        assert!(c[k].as_f64().unwrap() >= 0.0, "{k}: {c}");
    }
    assert_eq!(m["endpoint"], "/v1/messages");
    assert_eq!(m["prompt_tokens"], a_usage["input_tokens"]);
    assert_eq!(m["completion_tokens"], a_usage["output_tokens"]);
    assert!(c["id"].as_u64() < m["id"].as_u64(), "oldest first: {recent:?}");
    assert_eq!(s["live"]["reported"]["expert_cache_hits"], 14);

    // Only the last 20 are kept.
    for _ in 0..21 {
        let r = post(&srv, "/v1/completions", json!({"prompt": "x", "max_tokens": 1})).await;
        assert_eq!(r.status, 200);
    }
    let s = status(&srv).await;
    let recent = s["recent"].as_array().unwrap();
    assert_eq!(recent.len(), 20);
    assert!(recent.iter().all(|r| r["endpoint"] == "/v1/completions" && r["completion_tokens"] == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_state_shows_the_running_request_and_the_recent_rate() {
    let srv = start_server(&["--delay-ms", "20"]).await;
    wait_healthy(&srv).await;
    let body = json!({"prompt": "Hello world", "max_tokens": 60}).to_string();
    let addr = srv.addr;
    let running = tokio::spawn(async move { request(addr, "POST", "/v1/completions", Some(&body)).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let s = status(&srv).await;
    let live = &s["live"];
    assert_eq!(live["requests_in_flight"], 1, "{live}");
    let run = &live["running"][0];
    assert_eq!(run["endpoint"], "/v1/completions");
    assert_eq!(run["phase"], "decode");
    let generated = run["generated_tokens"].as_u64().unwrap();
    assert!((1..60).contains(&generated), "{run}");
    assert_eq!(run["prompt_tokens"], prompt_ids("Hello world").len());
    // ~50 tokens/s for the last 0.4 s, over a 10 s window.
    let tps = live["tokens_per_second"].as_f64().unwrap();
    assert_eq!(tps, generated as f64 / 10.0, "{live}");
    let r = running.await.unwrap();
    assert_eq!(r.status, 200);
    let s = status(&srv).await;
    assert_eq!(s["live"]["running"], json!([]));
    assert_eq!(s["live"]["tokens_per_second"], 60.0 / 10.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_is_recorded_as_cancelled() {
    let srv = start_server(&["--delay-ms", "10"]).await;
    wait_healthy(&srv).await;
    for stream in [true, false] {
        let body = json!({"prompt": "Hello world", "max_tokens": 500, "stream": stream});
        hang_up(srv.addr, "/v1/completions", body, stream as usize, Duration::from_millis(200)).await;
    }
    let t0 = std::time::Instant::now();
    let s = loop {
        let s = status(&srv).await;
        if s["recent"].as_array().unwrap().len() == 2 {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(s["live"]["running"], json!([]));
    let mut generated = 0;
    for r in s["recent"].as_array().unwrap() {
        assert_eq!(r["finish"], "cancelled", "{r}");
        assert_eq!(r["status"], Value::Null, "{r}");
        let n = r["completion_tokens"].as_u64().unwrap();
        assert!((1..500).contains(&n), "{r}");
        generated += n;
    }
    let m = scrape(srv.addr, &[]).await;
    assert_eq!(sample(&m, "strata_completion_tokens_total", &[]), Some(generated as f64));
}
