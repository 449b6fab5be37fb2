//! Writes the seed corpora of the fuzz targets into `fuzz/corpus/<target>/` (committed; each
//! seed a few KB at most, named after what it is; docs/reliability.md lists them):
//!
//!     cd fuzz && cargo run --example make_seeds
//!
//! Real inputs where the repository has them: the header and tensor directory of the
//! synthetic test models (`testdata/reference/`, after `scripts/make-testdata.sh`), the
//! protocol lines of docs/serve-protocol.md, request bodies of the server tests, the kernel
//! fixture of the emulator tests (`target/tmp/rust-kernels-fixture/...`, built by
//! `cargo test -p emulator`) and the embedded gfx1100 code object of a `--features gpu`
//! build. Small synthetic files where a complete, valid input must fit in a few KB: a GGUF
//! with every value type and a few tensors written by `GgufWriter`, split sets of it, and a
//! one-kernel code object laid out by hand.

use std::path::{Path, PathBuf};

use gguf::{GgufFile, GgufWriter, Value};
use quant::GgmlType;

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn out(target: &str, name: &str, bytes: &[u8]) {
    let d = Path::new(REPO).join("fuzz/corpus").join(target);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join(name), bytes).unwrap();
    println!("{target}/{name}: {} bytes", bytes.len());
}

fn read_prefix(p: &Path, n: usize) -> Option<Vec<u8>> {
    match std::fs::read(p) {
        Ok(mut b) => {
            b.truncate(n);
            Some(b)
        }
        Err(e) => {
            eprintln!("skipped {}: {e}", p.display());
            None
        }
    }
}

/// A small model with one key of every GGUF value type and tensors of a few types.
fn small_model() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::Str("llama".into()))
        .add_metadata("general.name", Value::Str("fuzz-seed".into()))
        .add_metadata("general.alignment", Value::U32(32))
        .add_metadata("llama.block_count", Value::U32(1))
        .add_metadata("llama.context_length", Value::U64(128))
        .add_metadata("llama.rope.freq_base", Value::F32(10000.0))
        .add_metadata("llama.attention.layer_norm_rms_epsilon", Value::F64(1e-6))
        .add_metadata("seed.u8", Value::U8(7))
        .add_metadata("seed.i8", Value::I8(-7))
        .add_metadata("seed.u16", Value::U16(700))
        .add_metadata("seed.i16", Value::I16(-700))
        .add_metadata("seed.i32", Value::I32(-70000))
        .add_metadata("seed.i64", Value::I64(-7_000_000_000))
        .add_metadata("seed.bool", Value::Bool(true))
        .add_metadata("seed.ints", Value::Array(vec![Value::I32(3), Value::I32(3), Value::I32(2), Value::I32(0)]))
        .add_metadata("seed.strs", Value::Array(vec![Value::Str("<s>".into()), Value::Str("▁a".into())]))
        .add_metadata(
            "seed.nested",
            Value::Array(vec![Value::Array(vec![Value::U8(1)]), Value::Array(vec![Value::U8(2), Value::U8(3)])]),
        );
    let f32s = |n: usize| (0..n).flat_map(|i| (i as f32 * 0.25).to_le_bytes()).collect::<Vec<u8>>();
    w.add_tensor("token_embd.weight", &[32, 4], GgmlType::Q8_0, vec![1u8; 4 * 34])
        .add_tensor("output_norm.weight", &[8], GgmlType::F32, f32s(8))
        .add_tensor("blk.0.attn_q.weight", &[4, 2], GgmlType::F16, vec![0x3cu8; 16])
        .add_tensor("blk.0.ffn_down.weight", &[256], GgmlType::Q4K, vec![0x11u8; 144]);
    w
}

/// Header, metadata without the tokenizer arrays, and the complete tensor directory of a real
/// file (no tensor data: the directory's offsets point past the end).
fn directory_only(g: &GgufFile) -> Vec<u8> {
    let mut b = Vec::new();
    let s = |b: &mut Vec<u8>, s: &str| {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    };
    let meta: Vec<_> = g.metadata().iter().filter(|(k, _)| !k.starts_with("tokenizer.ggml.")).collect();
    b.extend(b"GGUF");
    b.extend(3u32.to_le_bytes());
    b.extend((g.tensors().len() as u64).to_le_bytes());
    b.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        s(&mut b, k);
        b.extend(v.type_code().to_le_bytes());
        match v {
            Value::U32(x) => b.extend(x.to_le_bytes()),
            Value::F32(x) => b.extend(x.to_le_bytes()),
            Value::Str(x) => s(&mut b, x),
            Value::Bool(x) => b.push(*x as u8),
            Value::Array(a) => {
                let ty = a.first().map_or(5, Value::type_code);
                b.extend(ty.to_le_bytes());
                b.extend((a.len() as u64).to_le_bytes());
                for e in a {
                    match e {
                        Value::I32(x) => b.extend(x.to_le_bytes()),
                        Value::U64(x) => b.extend(x.to_le_bytes()),
                        Value::U32(x) => b.extend(x.to_le_bytes()),
                        other => panic!("array element {other:?}"),
                    }
                }
            }
            other => panic!("value {other:?}"),
        }
    }
    for t in g.tensors() {
        s(&mut b, &t.name);
        b.extend((t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            b.extend(d.to_le_bytes());
        }
        b.extend((t.ty as u32).to_le_bytes());
        b.extend(t.offset.to_le_bytes());
    }
    b
}

/// The tokenizer metadata of a real file cut to its first `n` tokens (merges kept when both
/// parts and the result are among them), no tensors: a vocabulary small enough for a seed.
fn small_tokenizer(g: &GgufFile, n: usize) -> Vec<u8> {
    let mut w = GgufWriter::new();
    let tokens: Vec<String> =
        g.get_array("tokenizer.ggml.tokens").unwrap()[..n].iter().map(|v| v.as_str().unwrap().to_string()).collect();
    let keep: std::collections::HashSet<&str> = tokens.iter().map(String::as_str).collect();
    for (k, v) in g.metadata() {
        let v = match (k.as_str(), v) {
            ("tokenizer.ggml.tokens" | "tokenizer.ggml.token_type", Value::Array(a)) => Value::Array(a[..n].to_vec()),
            ("tokenizer.ggml.merges", Value::Array(a)) => Value::Array(
                a.iter()
                    .filter(|m| {
                        let m = m.as_str().unwrap();
                        m.split_once(' ').is_some_and(|(l, r)| {
                            keep.contains(l) && keep.contains(r) && keep.contains(format!("{l}{r}").as_str())
                        })
                    })
                    .cloned()
                    .collect(),
            ),
            (k, v) if k.starts_with("tokenizer.") || k == "general.architecture" => v.clone(),
            _ => continue,
        };
        w.add_metadata(k.clone(), v);
    }
    w.add_metadata("tokenizer.chat_template", Value::Str(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}".into(),
    ));
    let b = w.to_bytes().unwrap();
    let t = tokenizer::Tokenizer::from_gguf(&GgufFile::from_bytes("seed", b.clone()).unwrap())
        .expect("the seed vocabulary loads");
    assert_eq!(t.vocab_size(), n);
    b
}

fn gguf_seeds() {
    let model = small_model().to_bytes().unwrap();
    GgufFile::from_bytes("seed", model.clone()).expect("the seed model opens");
    out("gguf_reader", "writer-all-value-types-4-tensors", &model);
    let reference = Path::new(REPO).join("testdata/reference");
    let moe = reference.join("tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf");
    if let Some(b) = read_prefix(&moe, 3072) {
        out("gguf_reader", "tiny-qwen3moe-q8_0-first-3KB", &b);
    }
    if let Ok(g) = GgufFile::open(&moe) {
        out("gguf_reader", "tiny-qwen3moe-q8_0-directory", &directory_only(&g));
        out("gguf_reader", "tiny-vocab-300-tokenizer-only", &small_tokenizer(&g, 300));
    }
    let exp2 = reference.join("tiny-qwen4exp/tiny-qwen4exp-public-q8_0-split-00002-of-00002.gguf");
    let exp1 = reference.join("tiny-qwen4exp/tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf");
    if let Some(b) = read_prefix(&exp2, 192) {
        out("gguf_reader", "tiny-qwen4exp-shard2-header", &b);
    }

    // Split sets: [flags] ([u32 len] [shard])* [last shard]; flags & 3 = count - 1.
    let dir = std::env::temp_dir().join(format!("strata-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for n in [2u32, 3] {
        let prefix = dir.join("s").to_string_lossy().into_owned();
        let paths = small_model().write_split(&prefix, n).unwrap();
        GgufFile::open(&paths[0]).expect("the seed split opens");
        let mut packed = vec![(n - 1) as u8];
        for (i, p) in paths.iter().enumerate() {
            let b = std::fs::read(p).unwrap();
            if i + 1 < paths.len() {
                packed.extend((b.len() as u32).to_le_bytes());
            }
            packed.extend(b);
        }
        out("gguf_split", &format!("writer-split-{n}-shards"), &packed);
    }
    std::fs::remove_dir_all(&dir).unwrap();
    if let (Some(a), Some(b)) = (read_prefix(&exp1, 2048), read_prefix(&exp2, 192)) {
        let mut packed = vec![1u8];
        packed.extend((a.len() as u32).to_le_bytes());
        packed.extend(a);
        packed.extend(b);
        out("gguf_split", "tiny-qwen4exp-split-shard1-first-2KB-shard2-header", &packed);
    }
}

fn tokenizer_seeds() {
    // [flags] text: bits 0-1 vocabulary (tiny, gemma, qwen2.5, smollm2), bit 2 add_bos,
    // bit 3 parse_special, bits 4-6 pre-tokenizer (default, gpt2, llama3, qwen2, starcoder).
    let texts: [(&str, &str); 10] = [
        ("english", "Hello world! How are you doing today?"),
        ("code", "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n"),
        ("unicode", "Grüße, 世界! Ça va? Привет 👋🏽 ﷺ"),
        ("numbers", "In 2024, 1234567 people paid $3.14 each (12.5%)."),
        ("whitespace", "  leading\n\n\ttabs   and    runs\r\n  \n"),
        ("chatml-specials", "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"),
        ("gemma-specials", "<start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\n"),
        ("contractions", "I'm sure they'll say it's what we've done, isn't it? 'quoted'"),
        ("sentencepiece-escape", "a▁b ▁▁c"),
        ("bytes", "\u{0}\u{1}\u{7f}\u{80}\u{ffff}\u{10ffff}"),
    ];
    for (i, (name, t)) in texts.iter().enumerate() {
        let flags = (i % 4) as u8 | ((i % 2) as u8) << 3 | ((i % 5) as u8) << 4;
        let mut b = vec![flags];
        b.extend(t.as_bytes());
        out("tokenizer_encode", name, &b);
    }
    let mut b = vec![0x0c];
    b.extend(texts[5].1.as_bytes());
    out("tokenizer_encode", "chatml-specials-parsed-bos", &b);

    // [flags] role NUL content ...: bits 0-2 template (chatml, gemma, llama3, jinja-qwen2.5,
    // jinja-smollm2), bit 3 add_generation_prompt. The conversation of tokenizer/tests/chat.rs.
    let conv = ["system", "You are terse. ", "user", "Hi!", "assistant", "Hello.", "user", "  What is 2+2?\n"];
    for t in 0..5u8 {
        let mut b = vec![t | 8];
        b.extend(conv.join("\0").as_bytes());
        out("tokenizer_chat", &format!("conversation-template-{t}"), &b);
    }
    let mut b = vec![3u8];
    b.extend("user\0Write a haiku about Rust.\0assistant\0Ownership, borrowed\0tool\0{\"ok\": true}".as_bytes());
    out("tokenizer_chat", "tool-role-jinja-qwen", &b);
}

fn serve_seeds() {
    // docs/serve-protocol.md: the requests, a cancel, and the malformed lines it describes.
    let lines = [
        r#"{"type":"generate","id":1,"tokens":[2,9259,1902],"max_tokens":64,"sampling":{"temperature":0.7,"top_k":40,"top_p":0.95,"min_p":0.05,"repeat_penalty":1.0,"repeat_last_n":64,"seed":42},"stop_tokens":[1,106]}"#,
        r#"{"type":"generate","id":2,"tokens":[2,9259],"max_tokens":16}"#,
        r#"{"type":"cancel","id":1}"#,
        r#"{"type":"generate","id":3,"tokens":[2,300000],"max_tokens":4}"#,
        r#"{"type":"generate","id":4,"tokens":[2,9259],"max_tokens":8,"sampling":{"temperature":0}}"#,
    ];
    out("serve_protocol", "docs-requests-and-cancel", (lines.join("\n") + "\n").as_bytes());
    out("serve_protocol", "docs-greedy", (lines[4].to_string() + "\n").as_bytes());
    out(
        "serve_protocol",
        "malformed-lines",
        b"not json\n{\"type\":\"generate\",\"id\":5}\n{\"type\":\"frobnicate\",\"id\":6}\n\n{\"type\":\"generate\",\"id\":7,\"tokens\":[],\"max_tokens\":1}\n",
    );
    out(
        "serve_protocol",
        "validation-errors",
        br#"{"type":"generate","id":8,"tokens":[1,2,3],"max_tokens":5,"sampling":{"top_p":0,"min_p":2}}
{"type":"generate","id":9,"tokens":[5],"max_tokens":0}
{"type":"generate","id":10,"tokens":[6,7],"max_tokens":3,"stop_tokens":[]}
{"type":"cancel","id":10}
"#,
    );
}

fn http_seeds() {
    // Request bodies of server/tests/it (http.rs, anthropic.rs, tools.rs).
    let weather = r#"{"type": "object", "properties": {"city": {"type": "string"}}}"#;
    let bodies = [
        ("openai-completion", r#"{"prompt": "Once upon a time", "max_tokens": 4}"#.to_string()),
        ("openai-completion-stop", r#"{"prompt": "Once upon a time", "max_tokens": 200, "stop": [" the", "never-there"]}"#.into()),
        ("openai-completion-tokens", r#"{"prompt": [2, 999999]}"#.into()),
        ("openai-completion-stream", r#"{"prompt": "x y", "max_tokens": 6, "stream": true, "stream_options": {"include_usage": true}, "seed": -1}"#.into()),
        ("openai-chat", r#"{"model": "x", "messages": [{"role": "user", "content": "Hi there, how are you?"}], "max_tokens": 8, "temperature": 0, "top_k": 1}"#.into()),
        ("openai-chat-parts", r#"{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Tell me a story"}]}], "stream": true, "max_completion_tokens": 5}"#.into()),
        ("openai-chat-bad-params", r#"{"messages": [{"role": "user", "content": "x"}], "temperature": 3, "n": 2, "top_p": 0}"#.into()),
        ("openai-chat-tools", format!(r#"{{"max_tokens": 200, "messages": [{{"role": "user", "content": "Weather in Paris?"}}], "tools": [{{"type": "function", "function": {{"name": "get_weather", "description": "Current weather", "parameters": {weather}}}}}], "tool_choice": "required"}}"#)),
        ("openai-chat-tool-history", format!(r#"{{"messages": [{{"role": "user", "content": "Weather?"}}, {{"role": "assistant", "content": null, "tool_calls": [{{"id": "call_1", "type": "function", "function": {{"name": "get_weather", "arguments": "{{\"city\": \"Paris\"}}"}}}}]}}, {{"role": "tool", "tool_call_id": "call_1", "content": "18 C"}}], "tools": [{{"type": "function", "function": {{"name": "get_weather", "parameters": {weather}}}}}], "tool_choice": {{"type": "function", "function": {{"name": "get_weather"}}}}}}"#)),
        ("anthropic-messages", r#"{"model": "claude-x", "max_tokens": 1000, "system": "You are terse.", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}], "stop_sequences": ["never", " test"], "temperature": 0.5}"#.into()),
        ("anthropic-prefill-stream", r#"{"max_tokens": 50, "stream": true, "messages": [{"role": "user", "content": "Hello there friend"}, {"role": "assistant", "content": "Well,"}]}"#.into()),
        ("anthropic-tools", format!(r#"{{"max_tokens": 200, "messages": [{{"role": "user", "content": "Weather in Paris?"}}, {{"role": "assistant", "content": [{{"type": "text", "text": "I'll check."}}, {{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {{"city": "Paris"}}}}]}}, {{"role": "user", "content": [{{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{{"type": "text", "text": "18 C"}}], "is_error": false}}]}}], "tools": [{{"name": "get_weather", "description": "Current weather", "input_schema": {weather}}}], "tool_choice": {{"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true}}}}"#)),
        ("anthropic-unsupported-block", r#"{"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": ""}}]}]}"#.into()),
    ];
    for (name, b) in bodies {
        serde_json::from_str::<serde_json::Value>(&b).unwrap_or_else(|e| panic!("seed {name}: {e}"));
        out("http_request", name, b.as_bytes());
    }
}

/// A one-kernel gfx1100 code object laid out by hand: ELF64 header, a PT_LOAD (R+X) over the
/// whole file and a PT_NOTE, the NT_AMDGPU_METADATA msgpack note, a kernel descriptor, eight
/// instructions (loads, a branch, a store, s_endpgm), and .symtab/.strtab/.shstrtab.
fn minimal_code_object() -> Vec<u8> {
    use rmpv::Value as M;
    let s = |x: &str| M::from(x);
    let arg = |off: u64| {
        M::Map(vec![(s(".offset"), M::from(off)), (s(".size"), M::from(8)), (s(".value_kind"), s("global_buffer"))])
    };
    let kernel = M::Map(vec![
        (s(".name"), s("k")),
        (s(".symbol"), s("k.kd")),
        (s(".kernarg_segment_size"), M::from(16)),
        (s(".group_segment_fixed_size"), M::from(0)),
        (s(".private_segment_fixed_size"), M::from(0)),
        (s(".wavefront_size"), M::from(32)),
        (s(".max_flat_workgroup_size"), M::from(256)),
        (s(".sgpr_count"), M::from(8)),
        (s(".vgpr_count"), M::from(3)),
        (s(".args"), M::Array(vec![arg(0), arg(8)])),
    ]);
    let meta = M::Map(vec![
        (s("amdhsa.version"), M::Array(vec![M::from(1), M::from(2)])),
        (s("amdhsa.target"), s("amdgcn-amd-amdhsa--gfx1100")),
        (s("amdhsa.kernels"), M::Array(vec![kernel])),
    ]);
    let mut desc = Vec::new();
    rmpv::encode::write_value(&mut desc, &meta).unwrap();

    let mut f = vec![0u8; 64 + 2 * 56];
    let align = |f: &mut Vec<u8>, a: usize| f.resize(f.len().div_ceil(a) * a, 0);
    // Note: namesz, descsz, type, "AMDGPU\0" padded to 8, desc padded to 4.
    let note_off = f.len();
    f.extend(7u32.to_le_bytes());
    f.extend((desc.len() as u32).to_le_bytes());
    f.extend(32u32.to_le_bytes());
    f.extend(b"AMDGPU\0\0");
    f.extend(&desc);
    align(&mut f, 4);
    let note_len = f.len() - note_off;
    align(&mut f, 64);
    let kd = f.len();
    f.resize(kd + 64, 0);
    align(&mut f, 256);
    let code = f.len();
    let insts: [u32; 11] = [
        0xF4080100, 0xF8000000, // s_load_b128 s[4:7], s[0:1], null
        0x30000082, // v_lshlrev_b32_e32 v0, 2, v0
        0xBF89FC07, // s_waitcnt lgkmcnt(0)
        0xBFA10005, // s_cbranch_scc0 (to s_endpgm)
        0xDC520000, 0x01040000, // global_load_b32 v1, v0, s[4:5]
        0xBF8903F7, // s_waitcnt vmcnt(0)
        0xDC6A0000, 0x00060100, // global_store_b32 v0, v1, s[6:7]
        0xBFB00000, // s_endpgm
    ];
    for w in insts {
        f.extend(w.to_le_bytes());
    }
    let code_end = f.len();
    // Kernel descriptor: kernarg size 16, entry offset, rsrc1 (denormals kept, IEEE), rsrc2
    // (2 user SGPRs, workgroup id x), properties (kernarg pointer, wave32).
    f[kd + 8..kd + 12].copy_from_slice(&16u32.to_le_bytes());
    f[kd + 16..kd + 24].copy_from_slice(&((code - kd) as i64).to_le_bytes());
    f[kd + 48..kd + 52].copy_from_slice(&(0x00af_0000u32 | 0x41).to_le_bytes());
    f[kd + 52..kd + 56].copy_from_slice(&((2u32 << 1) | (1 << 7)).to_le_bytes());
    f[kd + 56..kd + 58].copy_from_slice(&((1u16 << 3) | (1 << 10)).to_le_bytes());

    align(&mut f, 8);
    let strtab_data = b"\0k.kd\0k\0";
    let shstr = b"\0.symtab\0.strtab\0.shstrtab\0";
    let symtab = f.len();
    f.extend([0u8; 24]);
    let sym = |f: &mut Vec<u8>, name: u32, info: u8, value: u64, size: u64| {
        f.extend(name.to_le_bytes());
        f.push(info);
        f.push(0);
        f.extend(1u16.to_le_bytes()); // st_shndx: any defined section
        f.extend(value.to_le_bytes());
        f.extend(size.to_le_bytes());
    };
    sym(&mut f, 1, 0x11, kd as u64, 64); // k.kd: GLOBAL OBJECT
    sym(&mut f, 6, 0x12, code as u64, (code_end - code) as u64); // k: GLOBAL FUNC
    let symtab_len = f.len() - symtab;
    let strtab = f.len();
    f.extend(strtab_data);
    let shstrtab = f.len();
    f.extend(shstr);
    align(&mut f, 8);
    let shoff = f.len();
    let sh = |f: &mut Vec<u8>, name: u32, ty: u32, off: usize, size: usize, link: u32, info: u32, entsize: u64| {
        f.extend(name.to_le_bytes());
        f.extend(ty.to_le_bytes());
        f.extend(0u64.to_le_bytes()); // flags
        f.extend(0u64.to_le_bytes()); // addr
        f.extend((off as u64).to_le_bytes());
        f.extend((size as u64).to_le_bytes());
        f.extend(link.to_le_bytes());
        f.extend(info.to_le_bytes());
        f.extend(8u64.to_le_bytes()); // addralign
        f.extend(entsize.to_le_bytes());
    };
    f.extend([0u8; 64]);
    sh(&mut f, 1, 2, symtab, symtab_len, 2, 1, 24); // .symtab, strings in section 2
    sh(&mut f, 9, 3, strtab, strtab_data.len(), 0, 0, 0); // .strtab
    sh(&mut f, 17, 3, shstrtab, shstr.len(), 0, 0, 0); // .shstrtab
    let total = f.len();

    // ELF header.
    f[0..4].copy_from_slice(b"\x7fELF");
    f[4] = 2; // 64-bit
    f[5] = 1; // little-endian
    f[6] = 1; // EV_CURRENT
    f[7] = 64; // ELFOSABI_AMDGPU_HSA
    f[8] = 3; // ABI version: code object v5
    let put16 = |f: &mut Vec<u8>, at: usize, v: u16| f[at..at + 2].copy_from_slice(&v.to_le_bytes());
    let put32 = |f: &mut Vec<u8>, at: usize, v: u32| f[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let put64 = |f: &mut Vec<u8>, at: usize, v: u64| f[at..at + 8].copy_from_slice(&v.to_le_bytes());
    put16(&mut f, 16, 3); // ET_DYN
    put16(&mut f, 18, 224); // EM_AMDGPU
    put32(&mut f, 20, 1);
    put64(&mut f, 32, 64); // e_phoff
    put64(&mut f, 40, shoff as u64);
    put32(&mut f, 48, 0x41); // EF_AMDGPU_MACH gfx1100
    put16(&mut f, 52, 64);
    put16(&mut f, 54, 56);
    put16(&mut f, 56, 2);
    put16(&mut f, 58, 64);
    put16(&mut f, 60, 4);
    put16(&mut f, 62, 3);
    // PT_LOAD R+X over the whole file, PT_NOTE over the note.
    let ph = |f: &mut Vec<u8>, at: usize, ty: u32, flags: u32, off: usize, size: usize, align: u64| {
        put32(f, at, ty);
        put32(f, at + 4, flags);
        put64(f, at + 8, off as u64);
        put64(f, at + 16, off as u64);
        put64(f, at + 24, off as u64);
        put64(f, at + 32, size as u64);
        put64(f, at + 40, size as u64);
        put64(f, at + 48, align);
    };
    ph(&mut f, 64, 1, 5, 0, total, 0x1000);
    ph(&mut f, 120, 4, 4, note_off, note_len, 4);
    f
}

fn emulator_seeds() {
    let co = minimal_code_object();
    let dev = emulator::Device::new();
    let m = dev.load_module(&co).expect("the hand-made code object loads");
    assert_eq!(m.kernels().len(), 1);
    let dis = emulator::disassemble(&co).expect("and disassembles");
    assert!(dis.contains("s_endpgm"), "{dis}");
    out("emulator_loader", "minimal-one-kernel-gfx1100", &co);
    let fixture =
        Path::new(REPO).join("target/tmp/rust-kernels-fixture/target/amdgcn-amd-amdhsa/release/lds_stable.elf");
    if let Some(b) = read_prefix(&fixture, 3072) {
        out("emulator_loader", "emulator-test-fixture-first-3KB", &b);
    }
    let embedded: Option<PathBuf> = std::fs::read_dir(Path::new(REPO).join("target/release/build"))
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("out/strata-kernels-gfx1100.elf"))
        .find(|p| p.is_file());
    if let Some(b) = embedded.and_then(|p| read_prefix(&p, 1024)) {
        out("emulator_loader", "embedded-gfx1100-kernels-first-1KB", &b);
    }
}

fn expert_profile_seeds() {
    use experts::profile::{Profile, Table};
    // The engine's own save (a rank table) for the tiny MoE's shape, 2 layers x 8 experts with
    // two experts never routed, and a profiling script's frequency table, 4 x 8.
    let counts: Vec<Vec<u64>> = (0..2).map(|l| (0..8).map(|e| ((e * 7 + l * 3) % 9) as u64).collect()).collect();
    let ranks = Profile::from_counts(&counts, 4).unwrap();
    out("expert_profile", "ranks-2x8-engine-save", &ranks.to_bytes());
    let mut freq = Profile::from_counts(&vec![vec![1u64; 8]; 4], 8).unwrap();
    freq.table = Table::Frequency((0..32).map(|i| 1.0 / (1.0 + i as f32)).collect());
    let b = freq.to_bytes();
    assert!(matches!(Profile::parse(Path::new("seed"), &b).unwrap().table, Table::Frequency(_)));
    out("expert_profile", "frequencies-4x8-profiling-script", &b);
    out("expert_profile", "header-only-0x0", &Profile::from_counts(&[], 0).unwrap().to_bytes());
}

fn main() {
    expert_profile_seeds();
    gguf_seeds();
    tokenizer_seeds();
    serve_seeds();
    http_seeds();
    emulator_seeds();
}
