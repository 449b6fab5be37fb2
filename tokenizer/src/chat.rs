//! Chat templates. A GGUF's `tokenizer.chat_template` (Jinja, as on Hugging Face) is rendered
//! with minijinja and the globals HF/llama.cpp provide (`messages`, `add_generation_prompt`,
//! `bos_token`, `eos_token`, `raise_exception`, `strftime_now`), with HF's `trim_blocks` and
//! `lstrip_blocks` and Python string methods (`.strip()`, `.startswith()`, ...). Without one, a
//! built-in template is chosen from the architecture, written to match llama.cpp's built-in
//! formats (`llm_chat_apply_template`).

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value as JValue, context};

use crate::{ChatMessage, TokenizerError};

#[derive(Clone, Debug)]
pub(crate) enum ChatTemplate {
    /// `tokenizer.chat_template` from the file.
    Jinja(String),
    /// Gemma: `<start_of_turn>user\n...<end_of_turn>\n`, assistant → "model", system prompt
    /// merged into the first user turn, contents trimmed.
    Gemma,
    /// ChatML: `<|im_start|>role\ncontent<|im_end|>\n`.
    ChatMl,
    /// Llama 3: `<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>`.
    Llama3,
}

impl ChatTemplate {
    /// The stored template, else the built-in one for `arch` (or what the vocabulary suggests).
    pub(crate) fn select(stored: Option<&str>, arch: &str, has_token: impl Fn(&str) -> bool) -> Option<ChatTemplate> {
        if let Some(t) = stored {
            return Some(ChatTemplate::Jinja(t.to_string()));
        }
        match arch {
            "gemma" | "gemma2" | "gemma3" | "gemma3n" => return Some(ChatTemplate::Gemma),
            "qwen2" | "qwen2moe" | "qwen3" | "qwen3moe" | "qwen4exp" => {
                return Some(ChatTemplate::ChatMl);
            }
            _ => {}
        }
        if has_token("<|start_header_id|>") && has_token("<|eot_id|>") {
            Some(ChatTemplate::Llama3)
        } else if has_token("<|im_start|>") && has_token("<|im_end|>") {
            Some(ChatTemplate::ChatMl)
        } else if has_token("<start_of_turn>") {
            Some(ChatTemplate::Gemma)
        } else {
            None
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            ChatTemplate::Jinja(_) => "jinja",
            ChatTemplate::Gemma => "gemma",
            ChatTemplate::ChatMl => "chatml",
            ChatTemplate::Llama3 => "llama3",
        }
    }

    pub(crate) fn apply(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos: &str,
        eos: &str,
    ) -> Result<String, TokenizerError> {
        let mut s = String::new();
        match self {
            ChatTemplate::Jinja(src) => {
                return render_jinja(src, &JValue::from_serialize(messages), None, add_generation_prompt, bos, eos);
            }
            ChatTemplate::Gemma => {
                let mut system = String::new();
                for m in messages {
                    if m.role == "system" {
                        system += trim(&m.content);
                        continue;
                    }
                    let role = if m.role == "assistant" { "model" } else { m.role.as_str() };
                    s += &format!("<start_of_turn>{role}\n");
                    if !system.is_empty() && role != "model" {
                        s += &format!("{system}\n\n");
                        system.clear();
                    }
                    s += &format!("{}<end_of_turn>\n", trim(&m.content));
                }
                if add_generation_prompt {
                    s += "<start_of_turn>model\n";
                }
            }
            ChatTemplate::ChatMl => {
                for m in messages {
                    s += &format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
                }
                if add_generation_prompt {
                    s += "<|im_start|>assistant\n";
                }
            }
            ChatTemplate::Llama3 => {
                for m in messages {
                    s += &format!("<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>", m.role, trim(&m.content));
                }
                if add_generation_prompt {
                    s += "<|start_header_id|>assistant<|end_header_id|>\n\n";
                }
            }
        }
        Ok(s)
    }
}

/// C `isspace` trim, as llama.cpp's `trim`.
fn trim(s: &str) -> &str {
    s.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0B' | '\x0C'))
}

/// Instructions a stored template may execute for one rendering. The template comes with the
/// model file, so it is not trusted: `{% for a in range(100000) %}{% for b in range(100000) %}`
/// would run for hours. Real templates take a few dozen per message (Qwen2.5-Coder's, with a
/// tool, renders 500 000 messages within it, in under a second); a runaway one stops after
/// about a second.
pub(crate) const TEMPLATE_FUEL: u64 = 20_000_000;

/// Renders a stored template. `messages` and `tools` are in Hugging Face's chat format (what
/// `apply_chat_template(messages, tools=...)` gets); `tools` is `none` when absent, so
/// `{% if tools %}` templates render their plain branch.
pub(crate) fn render_jinja(
    src: &str,
    messages: &JValue,
    tools: Option<&JValue>,
    add_gen: bool,
    bos: &str,
    eos: &str,
) -> Result<String, TokenizerError> {
    // What `raise_exception` was called with, if it was: that error is the template's verdict.
    let raised = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let err = |e: Error| match e.kind() {
        ErrorKind::OutOfFuel => TokenizerError::ChatTemplate(format!(
            "the template ran more than {TEMPLATE_FUEL} instructions for this conversation (a loop that does not end?)"
        )),
        _ => match raised.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(msg) => TokenizerError::ChatTemplateRaised(msg),
            None => TokenizerError::ChatTemplate(format!("{e:#}")),
        },
    };
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    let raise = raised.clone();
    env.add_function("raise_exception", move |msg: String| -> Result<JValue, Error> {
        *raise.lock().unwrap_or_else(|p| p.into_inner()) = Some(msg.clone());
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
    env.add_filter("tojson", tojson);
    env.add_template("chat", src).map_err(err)?;
    let tmpl = env.get_template("chat").map_err(err)?;
    tmpl.render(context! {
        messages => messages,
        tools => tools,
        add_generation_prompt => add_gen,
        bos_token => bos,
        eos_token => eos,
    })
    .map_err(err)
}

/// Hugging Face's `tojson` (Python's `json.dumps(x, ensure_ascii=False, indent=indent)`):
/// `", "` and `": "` separators, nothing HTML-escaped, unlike minijinja's built-in, so tool
/// definitions and call arguments reach the model exactly as the template's authors trained it.
fn tojson(value: &JValue, indent: Option<JValue>, kwargs: Kwargs) -> Result<String, Error> {
    let indent = match indent {
        Some(i) => Some(i),
        None => kwargs.get::<Option<JValue>>("indent")?,
    };
    // Python's other json.dumps options (sort_keys, separators, ...) are accepted and ignored.
    for key in kwargs.args() {
        let _ = kwargs.get::<JValue>(key);
    }
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let pad = " ".repeat(n);
            let f = serde_json::ser::PrettyFormatter::with_indent(pad.as_bytes());
            serde::Serialize::serialize(value, &mut serde_json::Serializer::with_formatter(&mut out, f))
        }
        None => {
            serde::Serialize::serialize(value, &mut serde_json::Serializer::with_formatter(&mut out, PythonSpacing))
        }
    };
    written.map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    String::from_utf8(out).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))
}

/// serde_json's compact output with Python's default `", "` / `": "` separators.
struct PythonSpacing;

impl serde_json::ser::Formatter for PythonSpacing {
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// Today's UTC date in a strftime subset (%Y %m %d %e %B %b %H %M %S %%), enough for the
/// "Today Date: 26 Jul 2024" headers of Llama 3.x templates.
fn strftime_now(fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out += &y.to_string(),
            Some('m') => out += &format!("{m:02}"),
            Some('d') => out += &format!("{d:02}"),
            Some('e') => out += &format!("{d:2}"),
            Some('B') => out += MONTHS[(m - 1) as usize],
            Some('b') => out += &MONTHS[(m - 1) as usize][..3],
            Some('H') => out += &format!("{:02}", rem / 3600),
            Some('M') => out += &format!("{:02}", rem / 60 % 60),
            Some('S') => out += &format!("{:02}", rem % 60),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}
