//! `GET /metrics`: after known requests, the counters (parsed with a Prometheus text parser)
//! hold exactly those requests with their status codes, and token counts equal to the usage
//! fields of the responses; queue depth while requests wait; restarts; the engine's reported
//! counters only once reported; the API key rule.

use crate::support::*;
use serde_json::json;
use server::config::ApiKey;
use std::time::Duration;

fn requests(s: &prometheus_parse::Scrape, endpoint: &str, status: &str) -> f64 {
    sample(s, "strata_http_requests_total", &[("endpoint", endpoint), ("status", status)]).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_requests_statuses_and_tokens_as_the_responses_report_them() {
    let srv = start_server(&[]).await;
    wait_healthy(&srv).await;
    let before = scrape(srv.addr, &[]).await;
    assert_eq!(sample(&before, "strata_prompt_tokens_total", &[]), Some(0.0));
    assert_eq!(requests(&before, "/v1/completions", "200"), 0.0);

    let (mut prompt, mut completion, mut with_decode) = (0u64, 0u64, 0u64);
    let mut add = |p: u64, c: u64| {
        prompt += p;
        completion += c;
        with_decode += (c >= 2) as u64;
    };
    for (text, max) in [("Hello world", 3), ("one two three four", 5), ("x", 1)] {
        let r = post(&srv, "/v1/completions", json!({"prompt": text, "max_tokens": max})).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let u = &r.json()["usage"];
        add(u["prompt_tokens"].as_u64().unwrap(), u["completion_tokens"].as_u64().unwrap());
    }
    // A stream with its usage chunk, and Anthropic's usage.
    let r = post(
        &srv,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi there you"}], "max_tokens": 4,
               "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await;
    let (_, chunks) = chunk_texts(&r, true);
    let u = &chunks.last().unwrap()["usage"];
    add(u["prompt_tokens"].as_u64().unwrap(), u["completion_tokens"].as_u64().unwrap());
    let r =
        post(&srv, "/v1/messages", json!({"max_tokens": 6, "messages": [{"role": "user", "content": "a b c"}]})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let u = &r.json()["usage"];
    add(u["input_tokens"].as_u64().unwrap(), u["output_tokens"].as_u64().unwrap());
    // Refused before the engine: counted as requests, no tokens.
    let r = post(&srv, "/v1/completions", json!({"prompt": 5})).await;
    assert_eq!(r.status, 400);
    let r = post(&srv, "/v1/messages", json!({"messages": [{"role": "user", "content": "x"}]})).await;
    assert_eq!(r.status, 400);
    assert_eq!(request(srv.addr, "GET", "/nope", None).await.status, 404);

    let s = scrape(srv.addr, &[]).await;
    assert_eq!(requests(&s, "/v1/completions", "200"), 3.0);
    assert_eq!(requests(&s, "/v1/completions", "400"), 1.0);
    assert_eq!(requests(&s, "/v1/chat/completions", "200"), 1.0);
    assert_eq!(requests(&s, "/v1/messages", "200"), 1.0);
    assert_eq!(requests(&s, "/v1/messages", "400"), 1.0);
    assert_eq!(requests(&s, "other", "404"), 1.0);
    // The scrape before this one was answered, and counted, too.
    assert_eq!(requests(&s, "/metrics", "200"), 1.0);
    assert_eq!(sample(&s, "strata_prompt_tokens_total", &[]), Some(prompt as f64));
    assert_eq!(sample(&s, "strata_completion_tokens_total", &[]), Some(completion as f64));
    // One rate per generated request; a decode rate for those with two tokens or more.
    assert_eq!(sample(&s, "strata_prompt_tokens_per_second", &[]), Some(5.0));
    assert_eq!(sample(&s, "strata_decode_tokens_per_second", &[]), Some(with_decode as f64));
    assert_eq!(sample(&s, "strata_decode_tokens_per_second_count", &[]), Some(with_decode as f64));
    assert_eq!(sample(&s, "strata_requests_waiting", &[]), Some(0.0));
    assert_eq!(sample(&s, "strata_requests_in_flight", &[]), Some(0.0));
    assert_eq!(sample(&s, "strata_engine_restarts_total", &[]), Some(0.0));
    // The fake engine reports no counters by default: the metrics are absent, not 0.
    for name in
        ["strata_expert_cache_hits_total", "strata_expert_cache_lookups_total", "strata_draft_tokens_accepted_total"]
    {
        assert_eq!(sample(&s, name, &[]), None, "{name}");
    }
    assert!(s.docs.contains_key("strata_http_requests_total"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_reported_counters_are_summed() {
    let srv = start_server(&["--stats", "3,4,1,2,4096,250,40,1024,2"]).await;
    wait_healthy(&srv).await;
    // Prompt reuse (2 cached tokens a request) reaches both APIs' usage.
    let r = post(&srv, "/v1/completions", json!({"prompt": "Hello world", "max_tokens": 2})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let usage = &serde_json::from_str::<serde_json::Value>(&r.body).unwrap()["usage"];
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 2, "{usage}");
    let msg = json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hello world"}]});
    let r = post(&srv, "/v1/messages", msg.clone()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let usage = &serde_json::from_str::<serde_json::Value>(&r.body).unwrap()["usage"];
    assert_eq!(usage["cache_read_input_tokens"], 2, "{usage}");
    let counted = post(&srv, "/v1/messages/count_tokens", msg).await;
    let prompt = serde_json::from_str::<serde_json::Value>(&counted.body).unwrap()["input_tokens"].as_u64().unwrap();
    assert_eq!(usage["input_tokens"].as_u64(), Some(prompt - 2), "input_tokens leaves the cached ones out: {usage}");
    let s = scrape(srv.addr, &[]).await;
    assert_eq!(sample(&s, "strata_expert_cache_hits_total", &[]), Some(6.0));
    assert_eq!(sample(&s, "strata_expert_cache_lookups_total", &[]), Some(8.0));
    assert_eq!(sample(&s, "strata_draft_tokens_accepted_total", &[]), Some(2.0));
    for (name, want) in [
        ("strata_expert_bytes_to_vram_total", 8192.0),
        ("strata_expert_bytes_read_over_pcie_total", 2048.0),
        ("strata_expert_cpu_microseconds_total", 500.0),
        ("strata_expert_handoff_wait_microseconds_total", 80.0),
    ] {
        assert_eq!(sample(&s, name, &[]), Some(want), "{name}");
    }
    assert_eq!(sample(&s, "strata_draft_tokens_offered_total", &[]), Some(4.0));
    assert_eq!(sample(&s, "strata_prompt_tokens_cached_total", &[]), Some(4.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_depth_while_requests_wait_and_restarts() {
    let dir = scratch_dir();
    let marker = dir.join("crashed").display().to_string();
    // Each request takes ~1 s (20 tokens of 50 ms); the fourth token crashes the first engine.
    let srv = start_server(&["--delay-ms", "50", "--crash-after", "4", "--crash-marker", &marker]).await;
    wait_healthy(&srv).await;
    let body = json!({"prompt": "Hello world", "max_tokens": 20});
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (addr, b) = (srv.addr, body.to_string());
        tasks.push(tokio::spawn(async move { request(addr, "POST", "/v1/completions", Some(&b)).await }));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // While the first runs (before its crash at ~200 ms): one at the engine, two waiting.
    let s = scrape(srv.addr, &[]).await;
    assert_eq!(sample(&s, "strata_requests_in_flight", &[]), Some(1.0));
    assert_eq!(sample(&s, "strata_requests_waiting", &[]), Some(2.0));
    let mut statuses: Vec<u16> = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap().status);
    }
    statuses.sort();
    assert_eq!(statuses, vec![200, 200, 500], "the first dies with its engine");
    let s = scrape(srv.addr, &[]).await;
    assert_eq!(sample(&s, "strata_engine_restarts_total", &[]), Some(1.0));
    assert_eq!(requests(&s, "/v1/completions", "500"), 1.0);
    assert_eq!(requests(&s, "/v1/completions", "200"), 2.0);
    // The failed request's 4 tokens were generated, and are counted.
    assert_eq!(sample(&s, "strata_completion_tokens_total", &[]), Some(44.0));
    assert_eq!(sample(&s, "strata_requests_waiting", &[]), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_the_api_key_rule() {
    let key = "sk-metrics-test";
    let srv = start_server_keyed(model_path(), &[], None, None, Some(ApiKey::new(key, "test").unwrap())).await;
    wait_healthy(&srv).await;
    for path in ["/metrics", "/v1/status"] {
        let r = request(srv.addr, "GET", path, None).await;
        assert_eq!(r.status, 401, "{path}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    }
    let bearer = format!("Bearer {key}");
    let s = scrape(srv.addr, &[("Authorization", &bearer)]).await;
    assert_eq!(requests(&s, "/metrics", "401"), 1.0, "401s are counted");
    assert_eq!(requests(&s, "/v1/status", "401"), 1.0);
    assert!(requests(&s, "/health", "200") >= 1.0, "/health stays open");
    let r = request_with(srv.addr, "GET", "/v1/status", None, &[("x-api-key", key)]).await;
    assert_eq!(r.status, 200, "{}", r.body);
}
