//! Real files: the default Gemma 3 model and the two-shard tiny-qwen4exp fixture. Expected
//! facts come from testdata/reference (llama.cpp's view of these files, and the generator's
//! tensor list), not from this reader.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gguf::GgufFile;
use quant::GgmlType;

const REF: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/reference");

fn gemma_path() -> PathBuf {
    let dir = std::env::var_os("STRATA_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/strata/models"));
    let p = dir.join("gemma-3-270m-q4_k_m.gguf");
    assert!(p.exists(), "default model missing: {} (set STRATA_MODEL_DIR or run setup.sh)", p.display());
    p
}

#[test]
fn gemma3_default_model() {
    let g = GgufFile::open(&gemma_path()).unwrap();
    assert_eq!(g.architecture().unwrap(), "gemma3");
    assert_eq!(g.get_u32("gemma3.block_count").unwrap(), 18);
    assert_eq!(g.get_u32("gemma3.embedding_length").unwrap(), 640);
    assert_eq!(g.get_u32("gemma3.feed_forward_length").unwrap(), 2048);
    assert_eq!(g.get_u32("gemma3.attention.head_count").unwrap(), 4);
    assert_eq!(g.get_u32("gemma3.attention.head_count_kv").unwrap(), 1);
    assert_eq!(g.get_f32("gemma3.attention.layer_norm_rms_epsilon").unwrap(), 1e-6);
    assert_eq!(g.get_array("tokenizer.ggml.tokens").unwrap().len(), 262_144);
    // Tensor types per testdata/reference/README.md.
    let mut by_type: BTreeMap<&str, usize> = BTreeMap::new();
    for t in g.tensors() {
        *by_type.entry(t.ty.name()).or_default() += 1;
        assert_eq!(g.tensor_data(t).len(), t.n_bytes, "{}", t.name);
    }
    let want: BTreeMap<&str, usize> =
        [("q8_0", 10), ("q5_0", 81), ("q4_K", 27), ("q6_K", 9), ("f32", 109)].into_iter().collect();
    assert_eq!(by_type, want);
    let emb = g.tensor("token_embd.weight").unwrap();
    assert_eq!((emb.dims.as_slice(), emb.ty), (&[640u64, 262_144][..], GgmlType::Q8_0));
    assert_eq!(g.tensors().iter().filter(|t| t.name.ends_with("attn_v.weight") && t.ty == GgmlType::Q8_0).count(), 9);
    assert!(g.tensor("output.weight").is_none(), "gemma3 ties the output head to token_embd");
    for i in 0..18 {
        assert!(g.tensor(&format!("blk.{i}.attn_q.weight")).is_some());
    }
    // The last tensor ends inside the file (bounds were checked at open) and the whole file is
    // the size the README states.
    assert_eq!(std::fs::metadata(gemma_path()).unwrap().len(), 253_113_024);
}

#[test]
fn tiny_qwen4exp_two_shards_open_as_one() {
    let dir = Path::new(REF).join("tiny-qwen4exp");
    let first = dir.join("tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf");
    let second = dir.join("tiny-qwen4exp-public-q8_0-split-00002-of-00002.gguf");
    let g = GgufFile::open(&first).unwrap();
    let g2 = GgufFile::open(&second).unwrap();
    assert_eq!(g.paths().len(), 2);
    assert_eq!(g.architecture().unwrap(), "qwen4exp");
    assert_eq!(g2.architecture().unwrap(), "qwen4exp");
    assert_eq!(g.tensors(), g2.tensors());

    // The generator's own list: names, ggml dims and types of all 113 tensors.
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tiny-qwen4exp-public-q8_0-split.json")).unwrap())
            .unwrap();
    let list = json["tensors"].as_array().unwrap();
    assert_eq!(g.tensors().len(), list.len());
    for e in list {
        let name = e[0].as_str().unwrap();
        let t = g.tensor(name).unwrap_or_else(|| panic!("missing {name}"));
        let dims: Vec<u64> = e[1].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        assert_eq!(t.dims, dims, "{name}");
        assert_eq!(t.ty.name().to_ascii_uppercase(), e[2].as_str().unwrap().to_ascii_uppercase(), "{name}");
        // "the second shard holds only the PLE table"
        assert_eq!(t.file_index, usize::from(name == "per_layer_token_embd.weight"), "{name}");
        assert_eq!(g.tensor_data(t).len(), t.n_bytes);
    }
    // Same tensor names as the single-file f32 model.
    let single = GgufFile::open(&dir.join("tiny-qwen4exp-public-f32.gguf")).unwrap();
    let mut a: Vec<&str> = single.tensors().iter().map(|t| t.name.as_str()).collect();
    let mut b: Vec<&str> = g.tensors().iter().map(|t| t.name.as_str()).collect();
    a.sort();
    b.sort();
    assert_eq!(a, b);
    // The PLE table is Q8_0 in both and holds identical bytes.
    let ple_a = single.tensor("per_layer_token_embd.weight").unwrap();
    let ple_b = g.tensor("per_layer_token_embd.weight").unwrap();
    assert_eq!(single.tensor_data(ple_a), g.tensor_data(ple_b));
}

#[test]
fn tiny_qwen3moe_opens() {
    let g = GgufFile::open(&Path::new(REF).join("tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf")).unwrap();
    assert_eq!(g.architecture().unwrap(), "qwen3moe");
    assert_eq!(g.get_u32("qwen3moe.expert_count").unwrap(), 8);
    assert_eq!(g.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    let e = g.tensor("blk.0.ffn_down_exps.weight").unwrap();
    assert_eq!((e.dims.as_slice(), e.ty), (&[128u64, 256, 8][..], GgmlType::Q8_0));
}
