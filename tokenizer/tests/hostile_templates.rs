//! Stored chat templates come with the model file, so they are not trusted: one that never
//! ends must give an error, not hang the server. (Found while writing the fuzz targets, which
//! render stored templates of fuzzed GGUF files, fuzz/fuzz_targets/gguf_reader.rs, by trying
//! runaway templates by hand; docs/reliability.md.)

use std::path::Path;
use std::time::{Duration, Instant};

use gguf::{GgufFile, GgufWriter, Value};
use tokenizer::{ChatMessage, Tokenizer, TokenizerError};

const TINY: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/reference/tiny-qwen3moe/tiny-qwen3moe-v1024-f32.gguf");

/// The tiny test vocabulary with `template` stored as its chat template.
fn with_template(template: &str) -> Tokenizer {
    let g = GgufFile::open(Path::new(TINY)).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add_metadata(k.clone(), v.clone());
    }
    w.add_metadata("tokenizer.chat_template", Value::Str(template.into()));
    Tokenizer::from_gguf(&GgufFile::from_bytes("hostile.gguf", w.to_bytes().unwrap()).unwrap()).unwrap()
}

#[test]
fn runaway_template_is_an_error() {
    // 10^10 loop iterations: hours before the instruction bound.
    let t = with_template("{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}{% endfor %}{% endfor %}");
    let start = Instant::now();
    let r = t.apply_chat_template(&[ChatMessage::new("user", "Hi")], true);
    let took = start.elapsed();
    match r {
        Err(TokenizerError::ChatTemplate(m)) => assert!(m.contains("instructions"), "{m}"),
        other => panic!("expected a template error, got {other:?}"),
    }
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn long_conversation_stays_within_the_bound() {
    let t = with_template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    );
    let conv: Vec<ChatMessage> = (0..20_000)
        .map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, &format!("turn {i}")))
        .collect();
    let s = t.apply_chat_template(&conv, true).unwrap();
    assert!(s.ends_with("<|im_start|>assistant\n") && s.contains("turn 19999"));
}
