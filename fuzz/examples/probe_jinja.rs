use gguf::GgufFile;
fn main() {
    let g = GgufFile::open(&strata_fuzz::model_dir().join(strata_fuzz::QWEN)).unwrap();
    let t = tokenizer::Tokenizer::from_gguf(&g).unwrap();
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let mut n = 16;
    loop {
        let msgs: Vec<serde_json::Value> = (0..n).map(|i| serde_json::json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": format!("message number {i} with some words")})).collect();
        let t0 = std::time::Instant::now();
        let r = t.apply_chat_template_with_tools(&msgs, Some(&tools), true);
        println!("{n} messages: {} in {:?}", r.as_ref().map(|s| format!("ok {} bytes", s.len())).unwrap_or_else(|e| e.to_string()), t0.elapsed());
        if r.is_err() || n > 1 << 20 { break; }
        n *= 2;
    }
    let src = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
    let _ = src;
}
