//! Token ids against llama.cpp's (testdata/reference, produced by llama-cpp-python 0.3.36 on
//! llama.cpp 0c1e570): the Gemma 3 SentencePiece vocabulary and the SmolLM2-derived byte-level
//! BPE vocabularies of the tiny synthetic models.

use std::path::{Path, PathBuf};

use gguf::GgufFile;
use serde_json::Value as J;
use tokenizer::Tokenizer;

const REF: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/reference");

fn gemma_path() -> PathBuf {
    let dir = std::env::var_os("STRATA_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/strata/models"));
    let p = dir.join("gemma-3-270m-q4_k_m.gguf");
    assert!(p.exists(), "default model missing: {} (set STRATA_MODEL_DIR or run setup.sh)", p.display());
    p
}

fn load(path: &Path) -> Tokenizer {
    Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap()
}

fn json(rel: &str) -> J {
    serde_json::from_str(&std::fs::read_to_string(Path::new(REF).join(rel)).unwrap()).unwrap()
}

fn ids(v: &J) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn gemma() -> &'static Tokenizer {
    static T: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
    T.get_or_init(|| load(&gemma_path()))
}

#[test]
fn gemma_tokenize_matches_llama_cpp() {
    let t = gemma();
    let r = json("gemma3-270m-q4_k_m/reference.json");
    let cases = r["tokenize"].as_array().unwrap();
    let mut bad = Vec::new();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want = ids(&c["ids"]);
        let got = t.encode(text, false, true);
        if got != want {
            bad.push(format!("{text:?}\n  want {want:?}\n  got  {got:?}"));
        }
    }
    eprintln!("gemma tokenize: {}/{} strings match llama.cpp", cases.len() - bad.len(), cases.len());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn gemma_prompt_ids_with_bos() {
    let t = gemma();
    let mut n = 0;
    for c in json("gemma3-270m-q4_k_m/reference.json")["greedy"].as_array().unwrap() {
        assert_eq!(t.encode(c["prompt"].as_str().unwrap(), true, false), ids(&c["prompt_ids"]));
        n += 1;
    }
    for c in json("gemma3-270m-q4_k_m/greedy.json")["results"].as_array().unwrap() {
        assert_eq!(t.encode(c["prompt"].as_str().unwrap(), true, false), ids(&c["prompt_token_ids"]));
        n += 1;
    }
    let p = json("gemma3-270m-q4_k_m/reference.json")["perplexity"].clone();
    let got = t.encode(p["text"].as_str().unwrap(), true, false);
    assert_eq!(got.len(), p["n_tokens"].as_u64().unwrap() as usize, "perplexity text token count");
    assert_eq!(got[0], 2);
    eprintln!("gemma prompts: {n} prompts match llama.cpp (+ perplexity text length)");
}

#[test]
fn gemma_decode_round_trip_and_reference_texts() {
    let t = gemma();
    let r = json("gemma3-270m-q4_k_m/reference.json");
    for c in r["tokenize"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        assert_eq!(t.decode(&t.encode(text, false, true)), text);
        assert_eq!(t.decode(&ids(&c["ids"])), text);
    }
    // llama.cpp's own detokenization of the greedy continuations.
    for c in r["greedy"].as_array().unwrap() {
        let g = ids(&c["ids"]);
        assert_eq!(t.decode_with(&g, false), c["text"].as_str().unwrap());
        assert_eq!(t.decode_with(&g[..16], false), c["text16"].as_str().unwrap());
    }
    for c in json("gemma3-270m-q4_k_m/greedy.json")["results"].as_array().unwrap() {
        let g = ids(&c["generated_token_ids"]);
        assert_eq!(t.decode_with(&g, false), c["generated_text"].as_str().unwrap());
        // 64 tokens without llama_vocab_is_eog stopping: none of them is EOG.
        assert_eq!(c["stop_reason"], "length");
        assert!(g.iter().all(|&i| !t.is_eog(i)));
    }
    // Streaming: concatenated token bytes equal the decoded text.
    let s = "Ünïcödé 🎉 naïve";
    let bytes: Vec<u8> = t.encode(s, false, false).iter().flat_map(|&i| t.token_to_bytes(i)).collect();
    assert_eq!(String::from_utf8(bytes).unwrap(), s);
}

#[test]
fn gemma_specials() {
    let t = gemma();
    assert_eq!(t.vocab_size(), 262_144);
    assert_eq!((t.bos(), t.eos(), t.add_bos()), (Some(2), Some(1), true));
    assert_eq!(t.eog_ids(), vec![1, 106, 212]);
    assert!(t.is_eog(106) && !t.is_eog(2));
    assert_eq!(t.eot(), Some(106));
    assert_eq!(t.model_name(), "spm");
    // Control tokens are parsed only with parse_special; user-defined ones always.
    assert_eq!(t.encode("<end_of_turn>", false, true), vec![106]);
    assert_ne!(t.encode("<end_of_turn>", false, false), vec![106]);
    assert_eq!(t.encode("\n\n", false, false), vec![108]);
    assert_eq!(t.decode_with(&[105, 2364, 107], false), "user\n");
    assert_eq!(t.token_to_bytes(238 + 0xE2), vec![0xE2]); // <0xE2> byte token
    assert!(t.token_to_bytes(u32::MAX).is_empty());
}

fn qwen3moe_cases(dir: &str) -> Vec<(String, Vec<u32>)> {
    json(&format!("tiny-qwen3moe/{dir}/greedy.json"))["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["prompt"].as_str().unwrap().to_string(), ids(&c["prompt_token_ids"])))
        .collect()
}

#[test]
fn tiny_qwen3moe_bpe_matches_llama_cpp() {
    let t = load(&Path::new(REF).join("tiny-qwen3moe/tiny-qwen3moe-v1024-f32.gguf"));
    assert_eq!((t.vocab_size(), t.model_name(), t.add_bos()), (1024, "bpe", false));
    assert_eq!((t.bos(), t.eos()), (Some(1), Some(2)));
    // <|endoftext|>, <|im_end|>, and <reponame> (llama.cpp's FIM "repo" token) end generation.
    assert_eq!(t.eog_ids(), vec![0, 2, 4]);
    let mut n = 0;
    for dir in ["ref-f32", "ref-q8_0", "ref-mixed"] {
        for (prompt, want) in qwen3moe_cases(dir) {
            // llama-cpp-python tokenize(add_bos=True): this vocabulary does not add BOS.
            let got = t.encode(&prompt, true, false);
            assert_eq!(got, want, "{dir}: {prompt:?}");
            assert_eq!(t.decode(&got), prompt);
            n += 1;
        }
    }
    eprintln!("tiny-qwen3moe: {n} prompts match llama.cpp");
}

#[test]
fn tiny_qwen3moe_generated_text() {
    let t = load(&Path::new(REF).join("tiny-qwen3moe/tiny-qwen3moe-v1024-f32.gguf"));
    for dir in ["ref-f32", "ref-q8_0", "ref-mixed"] {
        for c in json(&format!("tiny-qwen3moe/{dir}/greedy.json"))["results"].as_array().unwrap() {
            let g = ids(&c["generated_token_ids"]);
            // llama-cpp-python's detokenize (control tokens such as <file_sep> left out).
            assert_eq!(t.decode_with(&g, false), c["generated_text"].as_str().unwrap());
            // Generation stopped on llama_vocab_is_eog or at 64 tokens: here always the length
            // (<file_sep>, id 5, appears and is not EOG), so no generated id may be EOG.
            assert_eq!(c["stop_reason"], "length");
            assert!(g.iter().all(|&i| !t.is_eog(i)), "{dir}: {g:?}");
        }
    }
}

#[test]
fn tiny_qwen4exp_split_vocab_matches_llama_cpp() {
    let t = load(&Path::new(REF).join("tiny-qwen4exp/tiny-qwen4exp-public-q8_0-split-00002-of-00002.gguf"));
    let r = json("tiny-qwen4exp/ref/q8_0-split/ref.json");
    let seqs = r["sequences"].as_array().unwrap();
    // seq1 = tokenize("The capital of France is")[:8]
    let s1 = t.encode("The capital of France is", false, false);
    assert_eq!(&s1[..8], &ids(&seqs[0]["token_ids"])[..]);
    // seq3 = tokenize(printing-press paragraph)[:300]; the paragraph is the start of the
    // tiny-qwen3moe prompt 3, up to "for the first time."
    let (p3, _) = qwen3moe_cases("ref-f32").remove(2);
    let end = p3.find("for the first time.").unwrap() + "for the first time.".len();
    let s3 = t.encode(&p3[..end], false, false);
    assert_eq!(&s3[..300], &ids(&seqs[2]["token_ids"])[..]);
}
