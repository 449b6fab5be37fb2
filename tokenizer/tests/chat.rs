//! Chat templates: the built-in Gemma and ChatML formats (expected texts written from the
//! published turn formats), and Jinja templates stored in a GGUF.

use std::path::{Path, PathBuf};

use gguf::{GgufFile, GgufWriter, Value};
use tokenizer::{ChatMessage, Tokenizer, TokenizerError};

const REF: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/reference");
const TINY: &str = "tiny-qwen3moe/tiny-qwen3moe-v1024-f32.gguf";

fn gemma() -> Tokenizer {
    let dir = std::env::var_os("STRATA_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/strata/models"));
    let p = dir.join("gemma-3-270m-q4_k_m.gguf");
    assert!(p.exists(), "default model missing: {}", p.display());
    Tokenizer::from_gguf(&GgufFile::open(&p).unwrap()).unwrap()
}

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You are terse. "),
        ChatMessage::new("user", "Hi!"),
        ChatMessage::new("assistant", "Hello."),
        ChatMessage::new("user", "  What is 2+2?\n"),
    ]
}

#[test]
fn gemma_builtin_template() {
    let t = gemma();
    assert_eq!(t.chat_template_name(), Some("gemma"));
    let s = t.apply_chat_template(&conversation(), true).unwrap();
    assert_eq!(
        s,
        "<start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n\
         <start_of_turn>model\nHello.<end_of_turn>\n\
         <start_of_turn>user\nWhat is 2+2?<end_of_turn>\n\
         <start_of_turn>model\n"
    );
    let s = t.apply_chat_template(&[ChatMessage::new("user", "Hello!")], false).unwrap();
    assert_eq!(s, "<start_of_turn>user\nHello!<end_of_turn>\n");
    // Tokenized with specials parsed, this is llama.cpp's reference tokenization of that turn.
    assert_eq!(t.encode(&s, true, true), vec![2, 105, 2364, 107, 9259, 236888, 106, 107]);
}

/// Copies a model's metadata (no tensors) and adds/overrides keys.
fn with_metadata(src: &str, extra: &[(&str, Value)]) -> GgufFile {
    let g = GgufFile::open(&Path::new(REF).join(src)).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add_metadata(k.clone(), v.clone());
    }
    for (k, v) in extra {
        w.add_metadata(*k, v.clone());
    }
    GgufFile::from_bytes("synthetic.gguf", w.to_bytes().unwrap()).unwrap()
}

#[test]
fn chatml_builtin_for_qwen3moe() {
    let t = Tokenizer::from_gguf(&GgufFile::open(&Path::new(REF).join(TINY)).unwrap()).unwrap();
    assert_eq!(t.chat_template_name(), Some("chatml"));
    let s = t.apply_chat_template(&conversation(), true).unwrap();
    assert_eq!(
        s,
        "<|im_start|>system\nYou are terse. <|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n\
         <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n  What is 2+2?\n<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let ids = t.encode(&s, false, true);
    assert_eq!(ids[0], 1); // <|im_start|>
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 4); // four <|im_end|>
}

#[test]
fn stored_jinja_template_is_rendered() {
    // An HF-style template using the usual globals, Python string methods and loop state.
    let tmpl = "{{ bos_token }}{%- if messages[0]['role'] == 'system' %}\
                {%- set sys = messages[0]['content'].strip() %}{%- set msgs = messages[1:] %}\
                {%- else %}{%- set sys = '' %}{%- set msgs = messages %}{%- endif %}\
                {%- for m in msgs %}\
                {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}\
                {{- raise_exception('roles must alternate') }}{%- endif %}\
                {{- '<|im_start|>' + m['role'] + '\\n' }}\
                {%- if loop.first and sys %}{{- sys + ' | ' }}{%- endif %}\
                {{- m['content'] | trim }}{{ '<|im_end|>\\n' }}\
                {%- endfor %}\
                {%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    let g = with_metadata(TINY, &[("tokenizer.chat_template", Value::Str(tmpl.into()))]);
    let t = Tokenizer::from_gguf(&g).unwrap();
    assert_eq!(t.chat_template_name(), Some("jinja"));
    let s = t.apply_chat_template(&conversation(), true).unwrap();
    assert_eq!(
        s,
        "<|im_start|><|im_start|>user\nYou are terse. | Hi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    let bad = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
    match t.apply_chat_template(&bad, false) {
        Err(TokenizerError::ChatTemplateRaised(m)) => {
            assert!(m.contains("roles must alternate"), "{m}")
        }
        other => panic!("expected a template error, got {other:?}"),
    }
    // A syntax error is a typed error, not a panic.
    let g = with_metadata(TINY, &[("tokenizer.chat_template", Value::Str("{% for %}".into()))]);
    let t = Tokenizer::from_gguf(&g).unwrap();
    assert!(matches!(t.apply_chat_template(&conversation(), true), Err(TokenizerError::ChatTemplate(_))));
}

#[test]
fn no_template_is_an_error() {
    let g = with_metadata(TINY, &[("general.architecture", Value::Str("mystery".into()))]);
    // The vocabulary has <|im_start|>/<|im_end|>, so ChatML is still inferred ...
    assert_eq!(Tokenizer::from_gguf(&g).unwrap().chat_template_name(), Some("chatml"));
    // ... but not when those tokens are renamed away.
    let src = GgufFile::open(&Path::new(REF).join(TINY)).unwrap();
    let mut toks: Vec<Value> = src.get_array("tokenizer.ggml.tokens").unwrap().to_vec();
    toks[1] = Value::Str("<|start|>x".into());
    let g = with_metadata(
        TINY,
        &[("general.architecture", Value::Str("mystery".into())), ("tokenizer.ggml.tokens", Value::Array(toks))],
    );
    let t = Tokenizer::from_gguf(&g).unwrap();
    assert!(matches!(t.apply_chat_template(&conversation(), true), Err(TokenizerError::NoChatTemplate { .. })));
}

#[test]
fn tools_render_like_hugging_face() {
    // The tool parts of Qwen2.5's template: `tools | tojson` and the call arguments.
    let tmpl = "{%- if tools %}{%- for tool in tools %}{{ tool | tojson }}\n{% endfor %}{%- endif %}\
                {%- for m in messages %}{{ m.role }}:{{ m.content }}\
                {%- for c in m.tool_calls %}[{{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}\
                {%- if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}|{% endfor %}\
                {{ {'b': [1, 2], 'a': none} | tojson(indent=2) }}";
    let g = with_metadata(TINY, &[("tokenizer.chat_template", Value::Str(tmpl.into()))]);
    let t = Tokenizer::from_gguf(&g).unwrap();
    assert!(t.chat_template_source().unwrap().contains("tools"));
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather <now> & 'later'", "parameters": {"type": "object"}}}]);
    let messages = serde_json::json!([
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]);
    let s = t.apply_chat_template_with_tools(&messages, Some(&tools), true).unwrap();
    // serde_json's maps are sorted here; struct fields would keep their order.
    assert_eq!(
        s,
        "{\"function\": {\"description\": \"Weather <now> & 'later'\", \"name\": \"get_weather\", \
         \"parameters\": {\"type\": \"object\"}}, \"type\": \"function\"}\n\
         user:Paris?|assistant:[get_weather {\"city\": \"Paris\", \"days\": [1, 2]}]|tool:sunny(call_1)|\
         {\n  \"b\": [\n    1,\n    2\n  ],\n  \"a\": null\n}"
    );
    // Without tools the template's plain branch renders; built-in formats refuse tools.
    let plain = t.apply_chat_template_with_tools(&messages, None::<&serde_json::Value>, true).unwrap();
    assert!(plain.starts_with("user:Paris?|"), "{plain}");
    let builtin = Tokenizer::from_gguf(&GgufFile::open(&Path::new(REF).join(TINY)).unwrap()).unwrap();
    assert!(builtin.chat_template_source().is_none());
    assert!(matches!(
        builtin.apply_chat_template_with_tools(&messages, Some(&tools), true),
        Err(TokenizerError::ChatTemplate(_))
    ));
}
