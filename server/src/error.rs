//! Errors of both APIs: one value, answered in the shape of the API that was called (OpenAI's
//! `{"error": {...}}` or Anthropic's `{"type": "error", "error": {...}}`).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An error with its HTTP status; [`IntoResponse`] answers in OpenAI's shape, [`Anthropic`] in
/// Anthropic's.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type` (`invalid_request_error`, `server_error`).
    pub kind: &'static str,
    /// OpenAI's `code` (e.g. `context_length_exceeded`).
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), kind: "invalid_request_error", code: None }
    }
    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            code: None,
        }
    }
    /// The engine hung (`engine_timeout`): 504, `code: "engine_timeout"`.
    pub fn timeout(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::GATEWAY_TIMEOUT,
            message: message.into(),
            kind: "server_error",
            code: Some("engine_timeout"),
        }
    }
    /// A missing or wrong API key: 401, `code: "invalid_api_key"` (Anthropic's
    /// `authentication_error`).
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: message.into(),
            kind: "invalid_request_error",
            code: Some("invalid_api_key"),
        }
    }
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: message.into(), kind: "server_error", code: None }
    }

    /// OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message, "type": self.kind, "param": null, "code": self.code,
        }})
    }

    /// Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`, the type named
    /// after the status as in Anthropic's error table.
    pub fn anthropic_body(&self) -> Value {
        let kind = match self.status.as_u16() {
            400 | 408 | 422 | 431 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            504 => "timeout_error",
            529 => "overloaded_error",
            _ => "api_error",
        };
        json!({"type": "error", "error": {"type": kind, "message": self.message}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// An [`ApiError`] answered in Anthropic's shape.
pub struct Anthropic(pub ApiError);

impl IntoResponse for Anthropic {
    fn into_response(self) -> Response {
        (self.0.status, axum::Json(self.0.anthropic_body())).into_response()
    }
}

/// The request body, or the reason it could not be read (over axum's body limit: 413) as an
/// [`ApiError`], so each API answers it in its own shape rather than axum's plain text.
pub fn read_body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        // Too slow (serve.rs's body deadline): 408; hyper closes the connection, whose body
        // was not read to its end.
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&rejection);
        while let Some(e) = cause {
            if let Some(t) = e.downcast_ref::<crate::serve::BodyTimedOut>() {
                return ApiError {
                    status: StatusCode::REQUEST_TIMEOUT,
                    message: t.to_string(),
                    kind: "invalid_request_error",
                    code: Some("body_timeout"),
                };
            }
            cause = e.source();
        }
        ApiError {
            status: rejection.status(),
            message: format!("request body: {}", rejection.body_text()),
            kind: "invalid_request_error",
            code: None,
        }
    })
}

/// Parse a JSON body ourselves so malformed input gets a 400 in the API's shape (axum's `Json`
/// extractor answers in plain text and insists on a content type). A value of the wrong type
/// names its field (`field `max_tokens`: invalid value: integer `-1`, expected u32 at line 1
/// column 61`).
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let bad = |why: String| ApiError::bad_request(format!("invalid request body: {why}"));
    let v = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let mut path = e.path().to_string();
        let inner = e.into_inner();
        // Fields of a `#[serde(flatten)]` struct (the sampling parameters) come without a
        // path: a type error there is located by its position instead.
        let typed =
            ["invalid type", "invalid value", "invalid length"].iter().any(|p| inner.to_string().starts_with(p));
        if path == "."
            && typed
            && let Some(key) = top_level_key_at(body, byte_offset(body, inner.line(), inner.column()))
        {
            path = key;
        }
        let msg = inner.to_string();
        // A message that names its field itself (`prompt[1]: ...`) is not prefixed again.
        bad(if path == "." || msg.starts_with(&path) { msg } else { format!("field `{path}`: {msg}") })
    })?;
    de.end().map_err(|e| bad(e.to_string()))?;
    Ok(v)
}

/// The byte offset of serde_json's (line, column), both 1-based (column 0: the line's start).
fn byte_offset(body: &[u8], line: usize, column: usize) -> usize {
    let start: usize = body.split(|&b| b == b'\n').take(line.saturating_sub(1)).map(|l| l.len() + 1).sum();
    (start + column).saturating_sub(1).min(body.len())
}

/// The key of the top-level object member whose value spans byte `at` (its terminating `,` or
/// `}` included, where serde_json reports an error after a value).
fn top_level_key_at(body: &[u8], at: usize) -> Option<String> {
    let (mut depth, mut in_str, mut esc, mut expect_key) = (0usize, false, false, false);
    let (mut key_start, mut key, mut value_start): (Option<usize>, Option<String>, Option<usize>) = (None, None, None);
    for (i, &c) in body.iter().enumerate() {
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
                if let Some(s) = key_start.take() {
                    key = Some(String::from_utf8_lossy(&body[s..i]).into_owned());
                }
            }
            continue;
        }
        let ends_member = (depth == 1 && c == b',') || (depth == 1 && c == b'}');
        if ends_member
            && let Some(s) = value_start.take()
            && (s..=i).contains(&at)
        {
            return key;
        }
        match c {
            b'"' => {
                in_str = true;
                if depth == 1 && expect_key {
                    key_start = Some(i + 1);
                    expect_key = false;
                }
            }
            b'{' | b'[' => {
                depth += 1;
                expect_key = depth == 1 && c == b'{';
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b':' if depth == 1 => value_start = Some(i + 1),
            b',' if depth == 1 => expect_key = true,
            _ => {}
        }
    }
    None
}
