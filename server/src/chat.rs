//! A conversation as the chat template sees it — Hugging Face's message format, which both
//! APIs translate their messages into — and its rendering into prompt tokens.
//!
//! Conversations without tools go through `Tokenizer::apply_chat_template` (stored or built-in
//! template). Tools, tool calls and tool results need a stored template that renders them in
//! the `<tool_call>` format (`tools::template_supports_tools`); other models get a 400.

use crate::error::ApiError;
use crate::http::AppState;
use crate::tools::{CALL_OPEN, ToolCallParser, template_supports_tools};
use serde::Serialize;
use serde_json::Value;
use tokenizer::ChatMessage;

/// One message. Field order is the order templates see (HF dicts keep insertion order).
#[derive(Debug, Default, Serialize)]
pub struct Turn {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    pub content: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<TurnCall>,
    /// For `tool` turns: the call this is the result of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Turn {
    pub fn new(role: &str, content: String) -> Turn {
        Turn { role: role.into(), content, ..Turn::default() }
    }
}

/// A call the assistant made earlier in the conversation.
#[derive(Debug, Serialize)]
pub struct TurnCall {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: CallFunction,
}

#[derive(Debug, Serialize)]
pub struct CallFunction {
    pub name: String,
    /// An object, as HF templates expect (`arguments | tojson`).
    pub arguments: Value,
}

impl TurnCall {
    pub fn new(id: Option<String>, name: String, arguments: Value) -> TurnCall {
        TurnCall { id, kind: "function", function: CallFunction { name, arguments } }
    }
}

/// A tool offered to the model, in the `{"type": "function", "function": {...}}` form that
/// templates render.
#[derive(Debug, Serialize)]
pub struct ToolDef {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionDef,
}

#[derive(Debug, Serialize)]
pub struct FunctionDef {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the arguments.
    pub parameters: Value,
}

impl ToolDef {
    /// Checks the name (what a call names the tool by; also a JSON string in the prompt).
    pub fn new(name: String, description: Option<String>, parameters: Option<Value>) -> Result<ToolDef, ApiError> {
        if name.is_empty() || name.len() > 128 {
            return Err(ApiError::bad_request("a tool's name must have 1 to 128 characters"));
        }
        let parameters = match parameters {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p,
            Some(_) => {
                return Err(ApiError::bad_request(format!(
                    "tool {name:?}: its parameter schema must be a JSON object"
                )));
            }
        };
        Ok(ToolDef { kind: "function", function: FunctionDef { name, description, parameters } })
    }
}

/// Whether, and which, tool the model must call.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum ToolChoice {
    /// Tools are not offered (not rendered, calls not parsed).
    None,
    #[default]
    Auto,
    /// Some tool: the answer is made to start with a call (`<tool_call>` and `{"name": "`).
    Required,
    /// This tool: the answer is made to start with a call of it.
    Named(String),
}

#[derive(Debug, Default)]
pub struct Conversation {
    pub turns: Vec<Turn>,
    pub tools: Vec<ToolDef>,
    pub tool_choice: ToolChoice,
    /// Text the answer continues from (Anthropic's trailing assistant turn); not echoed.
    pub assistant_prefix: String,
}

/// A rendered conversation.
pub struct ChatPrompt {
    pub tokens: Vec<u32>,
    /// Present when tools are offered: splits the answer into text and calls.
    pub parser: Option<ToolCallParser>,
}

impl Conversation {
    pub fn render(&self, st: &AppState) -> Result<ChatPrompt, ApiError> {
        if self.turns.is_empty() {
            return Err(ApiError::bad_request("`messages` must not be empty"));
        }
        let offer_tools = !self.tools.is_empty() && self.tool_choice != ToolChoice::None;
        let tool_history = self.turns.iter().any(|t| t.role == "tool" || !t.tool_calls.is_empty());
        let template_error = template_error;
        let mut text = if offer_tools || tool_history {
            if !template_supports_tools(st.tokenizer.chat_template_source()) {
                return Err(ApiError::bad_request(
                    "this model's chat template does not support tools: `tools`, tool calls and \
                     tool results need a template that renders them in the <tool_call> format",
                ));
            }
            let tools = offer_tools.then_some(&self.tools);
            st.tokenizer.apply_chat_template_with_tools(&self.turns, tools, true).map_err(template_error)?
        } else {
            let messages: Vec<ChatMessage> = self.turns.iter().map(|t| ChatMessage::new(&t.role, &t.content)).collect();
            st.tokenizer.apply_chat_template(&messages, true).map_err(template_error)?
        };
        text.push_str(&self.assistant_prefix);
        let forced = match &self.tool_choice {
            _ if !offer_tools => String::new(),
            // Up to the name: after a bare `<tool_call>` small models tend to end the turn.
            ToolChoice::Required => format!("{CALL_OPEN}\n{{\"name\": \""),
            ToolChoice::Named(name) => {
                if !self.tools.iter().any(|t| &t.function.name == name) {
                    return Err(ApiError::bad_request(format!(
                        "tool_choice names {name:?}, which is not among `tools`"
                    )));
                }
                // The call's opening, exactly as the template writes calls (Python's json.dumps).
                format!("{CALL_OPEN}\n{{\"name\": {}, \"arguments\": ", Value::from(name.as_str()))
            }
            ToolChoice::None | ToolChoice::Auto => String::new(),
        };
        text.push_str(&forced);
        Ok(ChatPrompt {
            tokens: st.tokenize(&text),
            parser: offer_tools.then(|| {
                let names = self.tools.iter().map(|t| t.function.name.clone()).collect();
                ToolCallParser::new(&forced, names)
            }),
        })
    }
}

/// A template that fails to render is the model's fault (500), one that refuses the
/// conversation with `raise_exception` the request's (400); a model without any template
/// cannot serve chat requests at all (400: `/v1/completions` still works).
fn template_error(e: tokenizer::TokenizerError) -> ApiError {
    use tokenizer::TokenizerError as T;
    match e {
        T::ChatTemplateRaised(why) => {
            ApiError::bad_request(format!("the model's chat template refuses this conversation: {why}"))
        }
        // The first line: minijinja's debug dump of the template source follows it.
        T::ChatTemplate(why) => ApiError::server(format!(
            "the model's chat template is broken (a server-side fault, not the request's): {}",
            why.lines().next().unwrap_or_default()
        )),
        other => ApiError::bad_request(other.to_string()),
    }
}
