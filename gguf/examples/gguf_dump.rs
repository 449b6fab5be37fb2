//! Prints the metadata and tensor list of a GGUF model (all shards of a split one).
//! usage: cargo run -p gguf --example gguf_dump -- MODEL.gguf [--tensors] [--key KEY]
use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: gguf_dump MODEL.gguf [--tensors] [--key KEY]");
        std::process::exit(2);
    };
    let g = match gguf::GgufFile::open(Path::new(path)) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    // --key KEY prints every element of one (array) value, one per line with its index.
    if let Some(i) = args.iter().position(|a| a == "--key") {
        let key = args.get(i + 1).map(String::as_str).unwrap_or("");
        match g.get(key) {
            Some(gguf::Value::Array(a)) => a.iter().enumerate().for_each(|(j, v)| println!("{j}\t{v}")),
            Some(v) => println!("{v}"),
            None => eprintln!("no key {key}"),
        }
        return;
    }
    println!("files: {:?} (GGUF v{}, alignment {})", g.paths(), g.version(), g.alignment());
    for (k, v) in g.metadata() {
        println!("{k} = {v}");
    }
    println!("{} tensors", g.tensors().len());
    if args.iter().any(|a| a == "--tensors") {
        for t in g.tensors() {
            println!(
                "  {:40} {:8} {:?} file {} offset {} bytes {}",
                t.name,
                t.ty.name(),
                t.dims,
                t.file_index,
                t.offset,
                t.n_bytes
            );
        }
    }
}
