//! Gemma 3 270M Q4_K_M (the default model) against llama.cpp's recorded outputs in
//! testdata/reference/gemma3-270m-q4_k_m (see make_reference.py there).

use strata::model::Logits;
use strata::sampler::{Sampler, SamplerConfig};

use crate::models::models_util::{gemma, ids, read_json, reference};

/// Top-10 logits at the first 16 generated positions (teacher-forced): max |ours - llama.cpp|.
/// Gemma 3's residual stream has large outliers, so a one-ulp difference anywhere flips a later
/// Q8 activation quant and moves logits by ~0.1; the forward pass therefore copies llama.cpp's
/// CPU float order (`Arch::ggml_exact`). That copy covers batches of < TILED_MIN_BATCH
/// tokens (measured: identical logits); a longer prompt batch goes through llama.cpp's tiled
/// K-quant GEMM, which we do not reproduce, so the long prompt only gets this bound.
const TOP10_LOGIT_TOL: f64 = 1.0;
/// Prompts shorter than this run through kernels we copy exactly.
const TILED_MIN_BATCH: usize = 8;
/// Same, for those prompts (measured 0; room for libm differences only).
const TOP10_EXACT_TOL: f64 = 1e-3;
/// Last-position logits of prompt 1 (6 tokens, one batch) over the whole vocabulary: measured
/// bit-identical to llama.cpp (max |diff| 0); the bound only leaves room for libm differences.
const LAST_LOGITS_MAX_TOL: f64 = 1e-3;
const LAST_LOGITS_RMS_TOL: f64 = 1e-4;
/// Perplexity relative to llama.cpp's.
const PPL_REL_TOL: f64 = 0.01;

/// Greedy tokens that must equal llama.cpp's (the brief: first 16 of every prompt). Measured:
/// all 64 of every greedy.json prompt and all 24 of reference.json's. The short prompts are
/// bit-exact; the long printing-press prompt (a 180-token batch, where llama.cpp's tiled
/// K-quant GEMM is not copied) matches but is not guaranteed to beyond the first few tokens.
const GREEDY_IDENTICAL: usize = 16;

/// Identical for at least GREEDY_IDENTICAL tokens.
fn check_greedy(label: &str, got: &[u32], want: &[u32]) {
    let ok = first_mismatch(got, want).unwrap_or(got.len().min(want.len()));
    eprintln!("{label}: {ok}/{} greedy tokens identical to llama.cpp", want.len());
    assert!(ok >= GREEDY_IDENTICAL.min(want.len()), "{label}: diverged at token {ok}\n got  {got:?}\n want {want:?}");
}

fn greedy(prompt: &[u32], n: usize) -> Vec<u32> {
    let e = gemma();
    let mut sess = e.new_session().unwrap();
    let mut s = Sampler::new(SamplerConfig::greedy());
    e.generate(&mut *sess, prompt, n, &mut s, |_| true).expect("generate").0
}

fn first_mismatch(a: &[u32], b: &[u32]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

#[test]
fn gemma3_greedy_matches_llama_cpp_greedy_json() {
    let g = read_json("gemma3-270m-q4_k_m/greedy.json");
    for r in g["results"].as_array().unwrap() {
        let prompt = ids(&r["prompt_token_ids"]);
        let text = r["prompt"].as_str().unwrap();
        let want = ids(&r["generated_token_ids"]);
        let got = greedy(&prompt, want.len());
        check_greedy(text, &got, &want);
    }
}

#[test]
fn gemma3_greedy_matches_llama_cpp_reference_json() {
    let g = read_json("gemma3-270m-q4_k_m/reference.json");
    let e = gemma();
    for r in g["greedy"].as_array().unwrap() {
        let prompt = ids(&r["prompt_ids"]);
        let want = ids(&r["ids"]);
        let got = greedy(&prompt, want.len());
        check_greedy(r["prompt"].as_str().unwrap(), &got, &want);
        if first_mismatch(&got[..16], &want[..16]).is_none() {
            assert_eq!(e.tokenizer.decode(&got[..16]), r["text16"].as_str().unwrap());
        }
    }
}

#[test]
fn gemma3_top10_logits_close_to_llama_cpp() {
    let g = read_json("gemma3-270m-q4_k_m/greedy.json");
    let e = gemma();
    let nv = e.model.n_vocab();
    let mut worst = 0f64;
    for r in g["results"].as_array().unwrap() {
        let prompt = ids(&r["prompt_token_ids"]);
        let generated = ids(&r["generated_token_ids"]);
        let top = r["top10_first16"].as_array().unwrap();
        // Teacher-forced in llama.cpp's schedule: the prompt as one batch, then llama.cpp's
        // tokens one at a time (batch size decides which ggml kernels run, hence the rounding).
        let mut sess = e.new_session().unwrap();
        let mut logits = Vec::new();
        e.eval(&mut *sess, &prompt, Logits::Last, &mut logits).unwrap();
        let tol = if prompt.len() < TILED_MIN_BATCH { TOP10_EXACT_TOL } else { TOP10_LOGIT_TOL };
        for (k, entries) in top.iter().enumerate() {
            if k > 0 {
                e.eval(&mut *sess, &generated[k - 1..k], Logits::Last, &mut logits).unwrap();
            }
            let row = &logits[..nv];
            for ent in entries.as_array().unwrap() {
                let (id, want) = (ent[0].as_u64().unwrap() as usize, ent[1].as_f64().unwrap());
                let d = (row[id] as f64 - want).abs();
                assert!(d <= tol, "{:?} step {k} token {id}: {} vs {want} (tolerance {tol})", r["prompt"], row[id]);
                if d > worst {
                    worst = d;
                    eprintln!(
                        "top-10: new worst {d:.4} at {:?} step {k} token {id}: {} vs {want}",
                        r["prompt"], row[id]
                    );
                }
            }
        }
    }
    eprintln!("top-10 logits: max |diff| {worst:.4} (tolerance {TOP10_LOGIT_TOL})");
    assert!(worst <= TOP10_LOGIT_TOL, "top-10 logits differ by up to {worst}");
}

#[test]
fn gemma3_last_logits_close_to_llama_cpp() {
    let (shape, want) = strata::npy::read_f32(&reference("gemma3-270m-q4_k_m/prompt1_last_logits.npy")).unwrap();
    let g = read_json("gemma3-270m-q4_k_m/greedy.json");
    let prompt = ids(&g["results"][0]["prompt_token_ids"]);
    let e = gemma();
    assert_eq!(shape, vec![e.model.n_vocab()]);
    let mut sess = e.new_session().unwrap();
    let mut logits = Vec::new();
    e.eval(&mut *sess, &prompt, Logits::Last, &mut logits).unwrap();
    let (mut max, mut sq, mut at) = (0f64, 0f64, 0);
    for (i, (a, b)) in logits.iter().zip(&want).enumerate() {
        let d = (*a as f64 - *b as f64).abs();
        sq += d * d;
        if d > max {
            max = d;
            at = i;
        }
    }
    let rms = (sq / want.len() as f64).sqrt();
    eprintln!("last logits: max |diff| {max:.4} at {at}, rms {rms:.5}");
    assert!(max <= LAST_LOGITS_MAX_TOL, "max |diff| {max} at token {at}: {} vs {}", logits[at], want[at]);
    assert!(rms <= LAST_LOGITS_RMS_TOL, "rms diff {rms}");
}

#[test]
fn gemma3_perplexity_within_1_percent() {
    let g = read_json("gemma3-270m-q4_k_m/reference.json");
    let p = &g["perplexity"];
    let e = gemma();
    let ctx = p["ctx"].as_u64().unwrap() as usize;
    let r = strata::cli::perplexity(e, p["text"].as_str().unwrap(), ctx, 1).unwrap();
    let want = p["ppl"].as_f64().unwrap();
    eprintln!("perplexity {:.4} vs llama.cpp {want:.4} over {} tokens", r.ppl, r.n_scored);
    assert_eq!(r.n_scored + 1, p["n_tokens"].as_u64().unwrap() as usize);
    assert!((r.ppl / want - 1.0).abs() <= PPL_REL_TOL, "ppl {} vs {want}", r.ppl);
}

#[test]
fn gemma3_tokenizer_matches_llama_cpp() {
    let g = read_json("gemma3-270m-q4_k_m/reference.json");
    let e = gemma();
    for r in g["tokenize"].as_array().unwrap() {
        let text = r["text"].as_str().unwrap();
        assert_eq!(e.tokenizer.encode(text, false, true), ids(&r["ids"]), "{text:?}");
    }
    // Prompts as `generate` encodes them (BOS added, specials not parsed).
    for r in g["greedy"].as_array().unwrap() {
        assert_eq!(e.encode(r["prompt"].as_str().unwrap(), false), ids(&r["prompt_ids"]));
    }
}

/// RMS logit difference allowed between prefill chunk sizes (see the test; measured ~0.2).
const CHUNKED_RMS_TOL: f64 = 0.5;

#[test]
fn gemma3_chunked_prefill_and_int8_cache_agree() {
    let e = gemma();
    let g = read_json("gemma3-270m-q4_k_m/greedy.json");
    let prompt = ids(&g["results"][1]["prompt_token_ids"]);
    let run = |kv, chunk| {
        let mut sess = e
            .model
            .new_session(&strata::engine::SessionConfig {
                kv,
                max_ctx: 64,
                prefill_chunk: chunk,
                numerics: Default::default(),
            })
            .unwrap();
        let mut logits = Vec::new();
        e.eval(&mut *sess, &prompt, Logits::All, &mut logits).unwrap();
        logits
    };
    let whole = run(strata::kv_cache::KvType::F16, 512);
    let chunked = run(strata::kv_cache::KvType::F16, 3);
    let int8 = run(strata::kv_cache::KvType::Int8, 512);
    let maxd = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    // Same math, different batching: llama.cpp (which we copy) uses other kernels, hence other
    // summation orders, for batches of 3 and of 20 tokens, and on Gemma 3 that alone moves
    // logits by up to ~1 (one flipped activation quant is enough). So: close, not equal.
    let rms_chunked =
        (whole.iter().zip(&chunked).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / whole.len() as f64).sqrt();
    eprintln!("chunked prefill vs whole: max |diff| {}, rms {rms_chunked:.4}", maxd(&whole, &chunked));
    assert!(rms_chunked < CHUNKED_RMS_TOL, "chunked prefill: rms logit difference {rms_chunked}");
    // int8 KV is an approximation: logits stay within a loose band and greedy at the end agrees.
    let nv = e.model.n_vocab();
    let last = |l: &[f32]| {
        let r = &l[l.len() - nv..];
        r.iter().enumerate().fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
    };
    let rms = (whole.iter().zip(&int8).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / whole.len() as f64).sqrt();
    eprintln!("int8 KV vs f16 KV: max |diff| {}, rms {rms:.4}", maxd(&whole, &int8));
    assert!(rms < 1.0, "int8 cache: rms logit difference {rms}");
    assert_eq!(last(&whole), last(&int8));
}

#[test]
fn gemma3_context_overflow_is_a_clear_error() {
    let e = gemma();
    let mut sess = e
        .model
        .new_session(&strata::engine::SessionConfig {
            kv: strata::kv_cache::KvType::F16,
            max_ctx: 8,
            prefill_chunk: 512,
            numerics: Default::default(),
        })
        .unwrap();
    let mut logits = Vec::new();
    let err = e.eval(&mut *sess, &[2; 9], Logits::Last, &mut logits).unwrap_err();
    assert!(matches!(err, strata::EngineError::ContextFull { needed: 9, capacity: 8 }), "{err}");
    assert!(err.to_string().contains("--max-context"));
}
