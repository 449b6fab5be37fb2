//! Oversized input: a body over the limit is a 413 in the shape of the API called (all four
//! POST endpoints); 64 KiB of headers (one huge header, or many small ones) is refused and the
//! server keeps serving.

use crate::support::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_get_413_in_each_apis_shape() {
    let srv = start_server(&[]).await;
    wait_healthy(&srv).await;
    let big = "a".repeat(3 << 20);
    let msgs = json!([{"role": "user", "content": big}]);
    for (path, body) in [
        ("/v1/completions", json!({"prompt": big})),
        ("/v1/chat/completions", json!({"messages": msgs})),
        ("/v1/messages", json!({"max_tokens": 1, "messages": msgs})),
        ("/v1/messages/count_tokens", json!({"messages": msgs})),
    ] {
        let r = post(&srv, path, body).await;
        assert_eq!(r.status, 413, "{path}: {}", r.body);
        let v = r.json();
        if path.starts_with("/v1/messages") {
            assert_eq!(v["type"], "error", "{path}: {v}");
            assert_eq!(v["error"]["type"], "request_too_large", "{path}: {v}");
        } else {
            assert_eq!(v["error"]["type"], "invalid_request_error", "{path}: {v}");
        }
        assert!(v["error"]["message"].as_str().unwrap().contains("length limit"), "{path}: {v}");
    }
    let s = scrape(srv.addr, &[]).await;
    assert_eq!(sample(&s, "strata_http_requests_total", &[("endpoint", "/v1/messages"), ("status", "413")]), Some(1.0));
    let r = post(&srv, "/v1/completions", json!({"prompt": "x y", "max_tokens": 2})).await;
    assert_eq!(r.status, 200, "still serving: {}", r.body);
}

/// Send `head` (a request head without its final blank line) and read what comes back until
/// the server closes the connection (or 10 s pass).
async fn raw(addr: std::net::SocketAddr, head: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before reading all of it: ignore write errors.
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(b"\r\n").await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_kib_of_headers_are_refused_and_the_server_keeps_serving() {
    let srv = start_server(&[]).await;
    wait_healthy(&srv).await;
    let one_big =
        format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nConnection: close\r\n", "a".repeat(64 << 10));
    let many: String = (0..1024).map(|i| format!("X-H{i:04}: {}\r\n", "b".repeat(56))).collect();
    let many = format!("GET /v1/models HTTP/1.1\r\nHost: x\r\n{many}Connection: close\r\n");
    let anthropic_big = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nX-Big: {}\r\nConnection: close\r\n",
        "a".repeat(64 << 10)
    );
    let answer = raw(srv.addr, &anthropic_big).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{:?}", answer.lines().next());
    let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    let v: serde_json::Value = serde_json::from_str(body).expect("JSON error body");
    assert_eq!(v["type"], "error", "Anthropic's shape: {v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    for (what, head) in [("one 64 KiB header", one_big), ("1024 headers", many)] {
        assert!(head.len() >= 64 << 10);
        let answer = raw(srv.addr, &head).await;
        let status: u16 = answer.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        assert_eq!(status, 431, "{what}: {:?}", answer.lines().next());
        if what.starts_with("one") {
            // Ours, in OpenAI's shape (hyper refuses the 101st header itself, with no body).
            assert!(answer.contains("exceed the limit"), "{answer}");
        }
        let r = request(srv.addr, "GET", "/v1/models", None).await;
        assert_eq!(r.status, 200, "still serving after {what}");
    }
}
