use gguf::{GgufFile, GgufWriter, Value};
fn main() {
    let g = GgufFile::open(std::path::Path::new("../testdata/reference/tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf")).unwrap();
    for tmpl in [
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        "{{ 'x' * 100000000 }}",
        "{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}",
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    ] {
        let mut w = GgufWriter::new();
        for (k, v) in g.metadata() { w.add_metadata(k.clone(), v.clone()); }
        w.add_metadata("tokenizer.chat_template", Value::Str(tmpl.into()));
        let t = tokenizer::Tokenizer::from_gguf(&GgufFile::from_bytes("x", w.to_bytes().unwrap()).unwrap()).unwrap();
        let t0 = std::time::Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || { let r = t.apply_chat_template(&[tokenizer::ChatMessage::new("user", "hi")], true); let _ = tx.send(r.map(|s| s.len()).map_err(|e| e.to_string())); });
        match rx.recv_timeout(std::time::Duration::from_secs(20)) {
            Ok(r) => println!("{tmpl:.40}: {:?} in {:?}", r.map_err(|e| e.chars().take(120).collect::<String>()), t0.elapsed()),
            Err(_) => println!("{tmpl:.40}: still running after 20 s"),
        }
    }
    std::process::exit(0);
}
