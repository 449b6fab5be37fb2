//! Bad metadata gives typed errors; random text round-trips; a small hand-made SentencePiece
//! vocabulary tokenizes as the merge-by-score rules dictate (expected ids traced by hand).

use std::path::{Path, PathBuf};

use gguf::{GgufFile, GgufWriter, Value};
use tokenizer::{Tokenizer, TokenizerError};

const REF: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/reference");
const TINY: &str = "tiny-qwen3moe/tiny-qwen3moe-v1024-f32.gguf";

fn build(meta: &[(&str, Value)]) -> Result<Tokenizer, TokenizerError> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::Str("llama".into()));
    for (k, v) in meta {
        w.add_metadata(*k, v.clone());
    }
    Tokenizer::from_gguf(&GgufFile::from_bytes("synthetic.gguf", w.to_bytes().unwrap()).unwrap())
}

fn strs(v: &[&str]) -> Value {
    Value::Array(v.iter().map(|s| Value::Str(s.to_string())).collect())
}

/// SentencePiece vocabulary: 0 <unk>, 1 <s>, 2 </s>, 3..=258 <0x00>..<0xFF>, then pieces.
fn spm_vocab(extra: &[(&str, Value)]) -> Tokenizer {
    let pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "ll", "▁w", "or", "llo", "▁he", "▁hello", "▁wor"];
    let scores = [-20.0f32, -21., -22., -23., -24., -25., -26., -27., -1., -2., -3., -4., -5., -6., -7., -8.];
    let mut toks: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut sc = vec![0.0f32; 3];
    for b in 0..=255u8 {
        toks.push(format!("<0x{b:02X}>"));
        types.push(6);
        sc.push(0.0);
    }
    for (p, s) in pieces.iter().zip(scores) {
        toks.push(p.to_string());
        types.push(1);
        sc.push(s);
    }
    let mut meta = vec![
        ("tokenizer.ggml.model", Value::Str("llama".into())),
        ("tokenizer.ggml.tokens", Value::Array(toks.into_iter().map(Value::Str).collect())),
        ("tokenizer.ggml.token_type", Value::Array(types.into_iter().map(Value::I32).collect())),
        ("tokenizer.ggml.scores", Value::Array(sc.into_iter().map(Value::F32).collect())),
    ];
    meta.extend(extra.iter().cloned());
    build(&meta).unwrap()
}

#[test]
fn spm_merges_by_score_with_space_prefix_and_byte_fallback() {
    let t = spm_vocab(&[]);
    let id = |s: &str| t.token_id(s).unwrap();
    // Defaults for "llama": BOS 1, EOS 2, add_bos, add_space_prefix.
    assert_eq!((t.bos(), t.eos(), t.add_bos()), (Some(1), Some(2), true));
    // "▁hello▁world": ▁h, ll, ▁w, or, llo, ▁he, ▁hello, ▁wor merge in score order; l, d stay.
    let ids = t.encode("hello world", true, false);
    assert_eq!(ids, vec![1, id("▁hello"), id("▁wor"), id("l"), id("d")]);
    assert_eq!(t.decode(&ids[1..]), "hello world"); // the added leading space is dropped
    // "é" is not a piece: its UTF-8 bytes become byte tokens.
    assert_eq!(t.encode("hé", false, false), vec![id("▁h"), 3 + 0xC3, 3 + 0xA9]);
    assert_eq!(t.decode(&t.encode("hé", false, false)), "hé");
    // After a special token the text gets the space prefix again.
    assert_eq!(t.encode("<s>hello", false, true), vec![1, id("▁hello")]);
    assert_eq!(t.encode("<s>hello", false, false)[..3], [id("▁"), 3 + b'<' as u32, 3 + b's' as u32]);
    // Without the prefix: h, e, ll → llo.
    let t = spm_vocab(&[("tokenizer.ggml.add_space_prefix", Value::Bool(false))]);
    let id = |s: &str| t.token_id(s).unwrap();
    assert_eq!(t.encode("hello", false, false), vec![id("h"), id("e"), id("llo")]);
    assert!(t.encode("", true, false) == vec![1] && t.encode("", false, false).is_empty());
}

#[test]
fn bad_metadata_is_a_typed_error() {
    let toks = strs(&["a", "b", "c"]);
    let e = build(&[("tokenizer.ggml.tokens", toks.clone())]).unwrap_err();
    assert!(
        matches!(e, TokenizerError::Gguf(gguf::GgufError::MissingKey { ref key, .. }) if key == "tokenizer.ggml.model"),
        "{e}"
    );
    let m = |s: &str| ("tokenizer.ggml.model", Value::Str(s.into()));
    assert!(matches!(build(&[m("t5"), ("tokenizer.ggml.tokens", toks.clone())]), Err(TokenizerError::Unsupported(_))));
    let e =
        build(&[m("gpt2"), ("tokenizer.ggml.pre", Value::Str("nope".into())), ("tokenizer.ggml.tokens", toks.clone())]);
    assert!(matches!(e, Err(TokenizerError::Unsupported(ref s)) if s.contains("nope")));
    assert!(
        matches!(build(&[m("gpt2"), ("tokenizer.ggml.tokens", toks.clone())]), Err(TokenizerError::Gguf(_))),
        "merges missing"
    );
    let cases: Vec<(&str, Value)> = vec![
        ("tokenizer.ggml.tokens", Value::Array(vec![Value::U32(1); 3])),
        ("tokenizer.ggml.tokens", strs(&["a", "b", "a"])),
        ("tokenizer.ggml.token_type", Value::Array(vec![Value::I32(1)])),
        ("tokenizer.ggml.token_type", Value::Array(vec![Value::U8(1); 3])),
        ("tokenizer.ggml.scores", Value::Array(vec![Value::Str("x".into()); 3])),
        ("tokenizer.ggml.scores", Value::F32(1.0)),
    ];
    for (k, v) in cases {
        let mut meta = vec![m("llama"), ("tokenizer.ggml.tokens", toks.clone())];
        meta.retain(|(mk, _)| *mk != k);
        meta.push((k, v));
        let e = build(&meta).unwrap_err();
        assert!(matches!(e, TokenizerError::BadMetadata { ref key, .. } if key == k), "{k}: {e}");
    }
    // add_bos with no valid BOS (the gpt2 default id 11 is outside a 3-token vocabulary).
    let e = build(&[
        m("gpt2"),
        ("tokenizer.ggml.tokens", toks.clone()),
        ("tokenizer.ggml.merges", strs(&["a b"])),
        ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
    ])
    .unwrap_err();
    assert!(matches!(e, TokenizerError::BadMetadata { ref key, .. } if key == "tokenizer.ggml.add_bos_token"), "{e}");
    // A special id the file states must name a token (llama.cpp warns and keeps its default,
    // so a BOS of 999999 quietly became token 1): an error naming the key (issue 14 item 6).
    for (k, v, why) in [
        ("tokenizer.ggml.eos_token_id", Value::U32(99), "token id 99 is out of range (the vocabulary has 3 tokens)"),
        (
            "tokenizer.ggml.bos_token_id",
            Value::U32(999_999),
            "token id 999999 is out of range (the vocabulary has 3 tokens)",
        ),
        (
            "tokenizer.ggml.padding_token_id",
            Value::I32(-1),
            "token id -1 is out of range (the vocabulary has 3 tokens)",
        ),
        (
            "tokenizer.ggml.unknown_token_id",
            Value::Str("0".into()),
            "must be a token id (an unsigned integer), not a string",
        ),
    ] {
        let e = build(&[m("llama"), ("tokenizer.ggml.tokens", toks.clone()), (k, v)]).unwrap_err();
        assert_eq!(e.to_string(), format!("tokenizer metadata {k:?}: {why}"));
    }
    // The llama defaults (bos 1, eos 2, unk 0) apply when the file states none.
    let t = build(&[m("llama"), ("tokenizer.ggml.tokens", toks)]).unwrap();
    assert_eq!(t.eos(), Some(2));
    assert!(t.decode(&[7, 99, u32::MAX]).is_empty());
}

/// Deterministic random strings over a palette that stresses both tokenizers.
fn random_strings(n: usize) -> Vec<String> {
    let palette: Vec<char> =
        "aZ09 .,!?'\"\t\n\r-_()<>/\\é ñÜß€日本語한글🎉🙂 \u{a0}\u{2003}\u{200b}ĠĊ".chars().collect();
    let words = ["<start_of_turn>", "<|im_end|>", "<b>", "  ", "\n\n", "don't", "1234567", "<0x41>"];
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..n)
        .map(|_| {
            let len = (next() % 40) as usize;
            let mut out = String::new();
            for _ in 0..len {
                let r = next();
                if r % 9 == 0 {
                    out += words[(r / 9 % words.len() as u64) as usize];
                } else {
                    out.push(palette[(r / 9 % palette.len() as u64) as usize]);
                }
            }
            out
        })
        .collect()
}

fn gemma_path() -> PathBuf {
    let dir = std::env::var_os("STRATA_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/strata/models"));
    dir.join("gemma-3-270m-q4_k_m.gguf")
}

#[test]
fn random_text_round_trips() {
    let gemma = Tokenizer::from_gguf(&GgufFile::open(&gemma_path()).unwrap()).unwrap();
    let tiny = Tokenizer::from_gguf(&GgufFile::open(&Path::new(REF).join(TINY)).unwrap()).unwrap();
    let strings = random_strings(400);
    for s in &strings {
        for t in [&gemma, &tiny] {
            for special in [false, true] {
                let ids = t.encode(s, false, special);
                assert!(ids.iter().all(|&i| (i as usize) < t.vocab_size()));
                let d = t.decode(&ids);
                assert!(&d == s, "{} special={special}: {s:?} -> {ids:?} -> {d:?}", t.model_name());
                let bytes: Vec<u8> = ids.iter().flat_map(|&i| t.token_to_bytes(i)).collect();
                assert!(bytes == s.as_bytes(), "token bytes of {s:?}");
            }
        }
    }
}

#[test]
fn long_text_is_fast_enough() {
    let gemma = Tokenizer::from_gguf(&GgufFile::open(&gemma_path()).unwrap()).unwrap();
    let text = random_strings(2000).concat();
    let t0 = std::time::Instant::now();
    let ids = gemma.encode(&text, true, true);
    let dt = t0.elapsed();
    eprintln!("gemma: {} bytes -> {} tokens in {:?}", text.len(), ids.len(), dt);
    assert!(dt.as_secs_f64() < 5.0, "{dt:?}");
    assert!(gemma.decode(&ids[1..]) == text, "long text does not round-trip");
    // SentencePiece decoding turns a literal U+2581 into a space, as llama.cpp does.
    assert_eq!(gemma.decode(&gemma.encode("a\u{2581}b", false, false)), "a b");
}

#[test]
fn long_runs_do_not_blow_up() {
    let tiny = Tokenizer::from_gguf(&GgufFile::open(&Path::new(REF).join(TINY)).unwrap()).unwrap();
    let gemma = Tokenizer::from_gguf(&GgufFile::open(&gemma_path()).unwrap()).unwrap();
    let runs = [
        format!("{}a", " ".repeat(100_000)),
        "x".repeat(100_000),
        "\n".repeat(50_000),
        "1".repeat(50_000),
        "!?".repeat(30_000),
        format!("{}\tb", " \n".repeat(30_000)),
    ];
    for s in &runs {
        for t in [&tiny, &gemma] {
            let t0 = std::time::Instant::now();
            let ids = t.encode(s, false, true);
            let dt = t0.elapsed();
            assert!(t.decode(&ids) == *s, "{}: run of {:?} does not round-trip", t.model_name(), &s[..4]);
            assert!(dt.as_secs_f64() < 20.0, "{}: {:?} took {dt:?}", t.model_name(), &s[..4]);
        }
    }
}
