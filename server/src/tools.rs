//! Tool calls: what the chat template needs to render `tools` (a template that knows them), and
//! the model's calls parsed back out of its text.
//!
//! The format parsed is the one of Qwen2.5/Qwen3 and Hermes templates: each call a JSON object
//! `{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`. Text around the
//! calls stays text. Streaming works on any split of the text: a suffix that could begin
//! `<tool_call>` is held back until it is known, as stop strings are. Small models often drop
//! the tags (Qwen2.5-Coder-0.5B answers a bare `{"name": ...}`, or one in a ```json fence), so
//! an answer that starts with `{` or ```json is held back to its end and is a call if all of
//! it is calls of offered tools (as llama.cpp's Hermes parser accepts).

use serde_json::{Map, Value};

pub const CALL_OPEN: &str = "<tool_call>";
pub const CALL_CLOSE: &str = "</tool_call>";
/// How models fence JSON in markdown; an answer that starts with it may be an untagged call.
const JSON_FENCE: &str = "```json";

/// Whether a stored chat template renders `tools` in the format [`ToolCallParser`] reads.
pub fn template_supports_tools(source: Option<&str>) -> bool {
    source.is_some_and(|s| s.contains("tools") && s.contains(CALL_OPEN))
}

/// One call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// Always a JSON object.
    pub arguments: Map<String, Value>,
}

/// A piece of the model's answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Text(String),
    Call(ParsedCall),
}

/// Splits streamed text into [`Piece`]s.
#[derive(Debug, Default)]
pub struct ToolCallParser {
    /// Text not yet classified: inside a call, or a possible start of one.
    buf: String,
    in_call: bool,
    /// Whitespace held back: between or around calls it is dropped, before text it is kept.
    blank: String,
    /// Right after a call: leading whitespace of the next text is dropped.
    after_call: bool,
    calls: usize,
    /// The answer has begun (something other than whitespace arrived).
    started: bool,
    /// The answer began with `{`: held back whole, maybe untagged calls.
    bare: bool,
    /// Names of the offered tools (an untagged call must name one).
    known: Vec<String>,
}

impl ToolCallParser {
    /// A parser that has already seen `prefix` (text the prompt put in the model's mouth, e.g.
    /// `<tool_call>\n` to make it call a tool).
    pub fn new(prefix: &str, known: Vec<String>) -> ToolCallParser {
        let mut p = ToolCallParser { known, ..ToolCallParser::default() };
        let early = p.push(prefix);
        debug_assert!(early.is_empty(), "a prefix opens a call, it emits nothing");
        p
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        if !self.started && !self.in_call {
            let head = self.buf.trim_start();
            if head.is_empty() || (JSON_FENCE.starts_with(head) && !self.known.is_empty()) {
                return out; // undecided: only whitespace, or maybe a ```json fence, so far
            }
            self.started = true;
            self.bare = !self.known.is_empty() && (head.starts_with('{') || head.starts_with(JSON_FENCE));
        }
        if self.bare {
            return out;
        }
        loop {
            if self.in_call {
                let Some(end) = self.buf.find(CALL_CLOSE) else {
                    break;
                };
                let inner: String = self.buf.drain(..end + CALL_CLOSE.len()).collect();
                self.in_call = false;
                let inner = &inner[..end];
                match parse_call(inner) {
                    Some(call) => self.call(call, &mut out),
                    None => self.text(format!("{CALL_OPEN}{inner}{CALL_CLOSE}"), &mut out),
                }
            } else if let Some(start) = self.buf.find(CALL_OPEN) {
                let before: String = self.buf.drain(..start + CALL_OPEN.len()).collect();
                self.text(before[..start].to_string(), &mut out);
                self.in_call = true;
            } else {
                // Keep the longest suffix that could still grow into `<tool_call>`.
                let keep = (1..CALL_OPEN.len().min(self.buf.len() + 1))
                    .rev()
                    .find(|&k| {
                        self.buf.is_char_boundary(self.buf.len() - k)
                            && CALL_OPEN.starts_with(&self.buf[self.buf.len() - k..])
                    })
                    .unwrap_or(0);
                let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.text(text, &mut out);
                break;
            }
        }
        out
    }

    /// End of the answer: an unfinished call is parsed if it is complete JSON (generation was
    /// stopped at `</tool_call>`), else it is text, as is anything held back.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        if std::mem::take(&mut self.bare) {
            match parse_untagged(&rest, &self.known) {
                Some(calls) => calls.into_iter().for_each(|c| self.call(c, &mut out)),
                None => self.text(rest, &mut out),
            }
        } else if self.in_call {
            self.in_call = false;
            match parse_call(&rest) {
                Some(call) => self.call(call, &mut out),
                None => self.text(format!("{CALL_OPEN}{rest}"), &mut out),
            }
        } else {
            self.text(rest, &mut out);
        }
        if self.calls == 0 && !self.blank.is_empty() {
            out.push(Piece::Text(std::mem::take(&mut self.blank)));
        }
        out
    }

    /// Text outside calls. Whitespace at its edges is held back: dropped where it only
    /// separates calls from each other or from the text, kept inside text and in answers
    /// without calls, so those come out exactly as generated.
    fn text(&mut self, text: String, out: &mut Vec<Piece>) {
        let (body, tail) = text.split_at(text.trim_end().len());
        if !body.is_empty() {
            let mut piece = std::mem::take(&mut self.blank);
            let body = if self.after_call {
                piece.clear();
                body.trim_start()
            } else {
                body
            };
            self.after_call = false;
            piece.push_str(body);
            out.push(Piece::Text(piece));
        }
        self.blank.push_str(tail);
    }

    fn call(&mut self, call: ParsedCall, out: &mut Vec<Piece>) {
        self.calls += 1;
        self.blank.clear();
        self.after_call = true;
        out.push(Piece::Call(call));
    }
}

/// `{"name": "f", "arguments": {...}}` (also `"parameters"`, or arguments as a JSON string).
fn parse_call(inner: &str) -> Option<ParsedCall> {
    call_of(serde_json::from_str(inner.trim()).ok()?)
}

/// A whole answer of untagged calls (one or more JSON objects, maybe in a ```json fence), each
/// of an offered tool.
fn parse_untagged(text: &str, known: &[String]) -> Option<Vec<ParsedCall>> {
    let mut text = text.trim();
    if let Some(fenced) = text.strip_prefix(JSON_FENCE) {
        text = fenced.strip_suffix("```")?;
    }
    let mut calls = Vec::new();
    for v in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
        let call = call_of(v.ok()?)?;
        if !known.contains(&call.name) {
            return None;
        }
        calls.push(call);
    }
    (!calls.is_empty()).then_some(calls)
}

fn call_of(v: Value) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(Value::String(s)) => match serde_json::from_str(s).ok()? {
            Value::Object(m) => m,
            _ => return None,
        },
        Some(_) => return None,
    };
    Some(ParsedCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, args: Value) -> Piece {
        Piece::Call(ParsedCall { name: name.into(), arguments: args.as_object().unwrap().clone() })
    }

    fn feed(parts: &[&str]) -> Vec<Piece> {
        let mut p = ToolCallParser::new("", vec!["get_weather".into(), "now".into(), "f".into()]);
        let mut out: Vec<Piece> = parts.iter().flat_map(|t| p.push(t)).collect();
        out.extend(p.finish());
        // Adjacent text pieces are one text.
        let mut merged: Vec<Piece> = Vec::new();
        for piece in out {
            match (merged.last_mut(), piece) {
                (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
                (_, piece) => merged.push(piece),
            }
        }
        merged
    }

    #[test]
    fn calls_split_anywhere_are_found() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let expected = vec![
            Piece::Text("Let me look.".into()),
            call("get_weather", json!({"city": "Paris"})),
            call("now", json!({})),
        ];
        for split in 0..text.len() {
            if text.is_char_boundary(split) {
                assert_eq!(feed(&[&text[..split], &text[split..]]), expected, "{split}");
            }
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(feed(&refs), expected);
    }

    #[test]
    fn untagged_calls_of_offered_tools() {
        assert_eq!(
            feed(&["\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Paris\"}}\n{\"name\": \"now\"}"]),
            vec![call("get_weather", json!({"city": "Paris"})), call("now", json!({}))]
        );
        assert_eq!(
            feed(&["`", "``json\n{\n  \"name\": \"now\",\n  \"arguments\": {}\n}\n`", "``"]),
            vec![call("now", json!({}))]
        );
        assert_eq!(feed(&["``", "`rust\nfn x() {}\n```"]), vec![Piece::Text("```rust\nfn x() {}\n```".into())]);
        // Not a call: unknown tool, or JSON that is no call, or more than calls.
        for text in ["{\"name\": \"other\", \"arguments\": {}}", "{\"a\": 1}", "{\"name\": \"now\"} and more"] {
            assert_eq!(feed(&[text]), vec![Piece::Text(text.into())]);
        }
    }

    #[test]
    fn plain_text_is_untouched_and_bad_calls_stay_text() {
        assert_eq!(feed(&["a < b <tool", " and  \n"]), vec![Piece::Text("a < b <tool and  \n".into())]);
        let bad = "<tool_call>{not json}</tool_call> after";
        assert_eq!(feed(&[bad]), vec![Piece::Text(bad.into())]);
        assert_eq!(
            feed(&["<tool_call>{\"name\": \"f\"", ", \"arguments\": \"{\\\"x\\\": 1}\"}"]),
            vec![call("f", json!({"x": 1}))],
            "cut off at a stop string `</tool_call>`, and string arguments"
        );
        assert_eq!(
            feed(&["<tool_call>{\"name\": \"f\", \"argu"]),
            vec![Piece::Text("<tool_call>{\"name\": \"f\", \"argu".into())]
        );
        let mut forced = ToolCallParser::new("<tool_call>\n{\"name\": \"f\", \"arguments\": ", vec![]);
        let mut out = forced.push("{\"q\": \"é\"}}\n</tool_call>");
        out.extend(forced.finish());
        assert_eq!(out, vec![call("f", json!({"q": "é"}))]);
    }
}
