//! The web UI: a chat page at `/` and a Monitor page at `/monitor`, plain HTML, CSS and ES
//! modules from `server/web/`, embedded in the binary (no framework, no third-party code, no
//! CDN: they work offline). The assets hold no data, so they are served without the API key;
//! the pages send the key the user enters (kept in the browser's localStorage) as
//! `Authorization: Bearer` with their `/v1` calls.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// One embedded file: its route, content type and text.
pub struct Asset {
    pub route: &'static str,
    pub content_type: &'static str,
    pub body: &'static str,
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// Every route of the web UI (the API key middleware lets these through).
pub const ASSETS: &[Asset] = &[
    Asset { route: "/", content_type: HTML, body: include_str!("../web/index.html") },
    Asset { route: "/monitor", content_type: HTML, body: include_str!("../web/monitor.html") },
    Asset { route: "/web/style.css", content_type: CSS, body: include_str!("../web/style.css") },
    Asset { route: "/web/common.js", content_type: JS, body: include_str!("../web/common.js") },
    Asset { route: "/web/markdown.js", content_type: JS, body: include_str!("../web/markdown.js") },
    Asset { route: "/web/chat.js", content_type: JS, body: include_str!("../web/chat.js") },
    Asset { route: "/web/monitor.js", content_type: JS, body: include_str!("../web/monitor.js") },
];

/// Whether `path` is a web UI route (served without the API key).
pub fn is_asset(path: &str) -> bool {
    ASSETS.iter().any(|a| a.route == path)
}

/// Only same-origin resources; model text is never markup (the pages build DOM nodes), and
/// this forbids inline scripts and foreign origins if it ever were.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn serve(asset: &'static Asset) -> Response {
    let mut r = asset.body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    r
}

/// The web UI's routes.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    ASSETS.iter().fold(Router::new(), |r, a| r.route(a.route, get(move || async move { serve(a) })))
}
