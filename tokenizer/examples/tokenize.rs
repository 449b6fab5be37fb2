//! Tokenizes a string with a model's vocabulary and prints the ids and pieces.
//! usage: cargo run -p tokenizer --release --example tokenize -- MODEL.gguf "text" [--bos] [--special]
use std::path::Path;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(model), Some(text)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: tokenize MODEL.gguf TEXT [--bos] [--special]");
        std::process::exit(2);
    };
    let flag = |f: &str| args.iter().any(|a| a == f);
    let t0 = Instant::now();
    let g = gguf::GgufFile::open(Path::new(model)).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1)
    });
    let t1 = Instant::now();
    let tok = tokenizer::Tokenizer::from_gguf(&g).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1)
    });
    let t2 = Instant::now();
    let ids = tok.encode(text, flag("--bos"), flag("--special"));
    let t3 = Instant::now();
    eprintln!("open {:?}, vocabulary {:?}, encode {:?}; {tok:?}", t1 - t0, t2 - t1, t3 - t2);
    println!("{ids:?}");
    for id in ids {
        println!("{id}\t{:?}", String::from_utf8_lossy(&tok.token_to_bytes(id)));
    }
}
