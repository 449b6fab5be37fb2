//! OpenAI API request types (what we accept) and error bodies.
//!
//! Unknown fields are ignored, as OpenAI-compatible servers commonly do, so clients that send
//! e.g. `user` or `logit_bias: {}` keep working. Fields we cannot honour and that change the
//! meaning of the answer (`n > 1`) are rejected with 400.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

/// Parameters shared by `/v1/completions` and `/v1/chat/completions`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<u32>,
    /// Chat API's newer name for `max_tokens`.
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Extensions (llama.cpp server names).
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<u32>,
    /// Negative = random (llama.cpp uses -1).
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct StreamOptions {
    pub include_usage: bool,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    #[serde(flatten)]
    pub params: CommonParams,
}

/// `prompt`: a string, one-element list of strings, or token ids (as OpenAI allows).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessageIn>,
    #[serde(flatten)]
    pub params: CommonParams,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

/// Message content: a string or a list of parts, of which only `text` parts are supported.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl Content {
    pub fn into_text(self) -> Result<String, ApiError> {
        match self {
            Content::Text(s) => Ok(s),
            Content::Parts(parts) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => out.push_str(&t),
                        (k, _) => {
                            return Err(ApiError::bad_request(format!(
                                "unsupported content part type {k:?}"
                            )));
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

/// An error answered in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
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
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            code: None,
        }
    }
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {
            "message": self.message, "type": self.kind, "param": null, "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// Parse a JSON body ourselves so malformed input gets an OpenAI-style 400 (axum's `Json`
/// extractor answers in plain text and insists on a content type).
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}
