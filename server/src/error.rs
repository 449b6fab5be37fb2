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
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            code: None,
        }
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
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            code: None,
        }
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
            400 | 422 => "invalid_request_error",
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
    body.map_err(|rejection| ApiError {
        status: rejection.status(),
        message: format!("request body: {}", rejection.body_text()),
        kind: "invalid_request_error",
        code: None,
    })
}

/// Parse a JSON body ourselves so malformed input gets a 400 in the API's shape (axum's `Json`
/// extractor answers in plain text and insists on a content type).
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}
