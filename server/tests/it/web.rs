//! The web UI (`/`, `/monitor`, `/web/*`): every asset answers 200 with its content type and
//! `Cache-Control: no-cache`, the pages reference only same-origin assets that exist (no
//! `http://`/`https://` URL anywhere, no `innerHTML`), and with an API key the assets stay
//! open while the data they fetch does not. The pages in a real browser:
//! `server/tests/browser_e2e.py`.

use crate::support::*;
use server::config::ApiKey;
use server::web::ASSETS;
use std::net::SocketAddr;

/// GET `path`: (status, lower-cased head, body).
async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    let r = request_with(addr, "GET", path, None, headers).await;
    (r.status, r.head, r.body)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim)
}

/// Same-origin references of an asset: `src="…"`/`href="…"` in HTML, `from "./x.js"` in JS.
fn references(route: &str, body: &str) -> Vec<String> {
    let mut out = Vec::new();
    for pat in ["src=\"", "href=\"", "from \""] {
        for piece in body.split(pat).skip(1) {
            let target = piece.split('"').next().unwrap();
            out.push(match target.strip_prefix("./") {
                Some(rel) => format!("{}/{rel}", &route[..route.rfind('/').unwrap()]),
                None => target.to_string(),
            });
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assets_answer_with_their_types() {
    let srv = start_server(&[]).await;
    let expect = |route: &str| match route.rsplit('.').next() {
        Some("css") => "text/css; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        _ => "text/html; charset=utf-8",
    };
    assert!(ASSETS.iter().any(|a| a.route == "/"));
    assert!(ASSETS.iter().any(|a| a.route == "/monitor"));
    for a in ASSETS {
        let (status, head, body) = get(srv.addr, a.route, &[]).await;
        assert_eq!(status, 200, "{}", a.route);
        assert_eq!(header(&head, "content-type"), Some(expect(a.route)), "{}", a.route);
        assert_eq!(a.content_type, expect(a.route));
        assert_eq!(header(&head, "cache-control"), Some("no-cache"), "{}", a.route);
        assert_eq!(header(&head, "x-content-type-options"), Some("nosniff"));
        let csp = header(&head, "content-security-policy").expect("CSP");
        assert!(csp.starts_with("default-src 'self'"), "{csp}");
        assert_eq!(body, a.body, "{}", a.route);
    }
    let (index, monitor) = (get(srv.addr, "/", &[]).await.2, get(srv.addr, "/monitor", &[]).await.2);
    assert!(index.contains("id=\"messages\"") && index.contains("id=\"stop\""));
    assert!(monitor.contains("id=\"engine-model\"") && monitor.contains("id=\"recent\""));
    assert_eq!(get(srv.addr, "/web/nope.js", &[]).await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_reference_only_same_origin_assets() {
    let srv = start_server(&[]).await;
    for a in ASSETS {
        let lower = a.body.to_lowercase();
        for bad in ["http://", "https://", "//cdn", "innerhtml", "outerhtml", "eval("] {
            assert!(!lower.contains(bad), "{} contains {bad:?}", a.route);
        }
        for r in references(a.route, a.body) {
            if r == "data:," || r == "/" || r == "/monitor" {
                continue;
            }
            assert!(r.starts_with('/'), "{}: {r} is not same-origin", a.route);
            assert!(ASSETS.iter().any(|x| x.route == r), "{}: {r} is not an asset", a.route);
            assert_eq!(get(srv.addr, &r, &[]).await.0, 200, "{r}");
        }
    }
    // Both pages load their module and the shared stylesheet.
    let refs = references("/", ASSETS[0].body);
    assert!(refs.contains(&"/web/chat.js".to_string()), "{refs:?}");
    assert!(refs.contains(&"/web/style.css".to_string()), "{refs:?}");
    let js = ASSETS.iter().find(|a| a.route == "/web/chat.js").unwrap();
    assert!(references(js.route, js.body).contains(&"/web/common.js".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assets_open_data_keyed() {
    const KEY: &str = "web-test-key";
    let srv = start_server_keyed(model_path(), &[], None, None, Some(ApiKey::new(KEY, "test").unwrap())).await;
    wait_healthy(&srv).await;
    for a in ASSETS {
        assert_eq!(get(srv.addr, a.route, &[]).await.0, 200, "{}", a.route);
    }
    let auth = format!("Bearer {KEY}");
    assert_eq!(get(srv.addr, "/v1/status", &[]).await.0, 401);
    assert_eq!(get(srv.addr, "/v1/models", &[]).await.0, 401);
    let (status, _, body) = get(srv.addr, "/v1/status", &[("Authorization", &auth)]).await;
    assert_eq!(status, 200, "{body}");
    // A path that merely looks like an asset is not let through.
    assert_eq!(get(srv.addr, "/web/../v1/status", &[]).await.0 / 100, 4);
    assert_eq!(get(srv.addr, "/monitor/x", &[]).await.0, 401);
}
