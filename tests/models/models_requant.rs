//! Real weights in the quantizations people download: SmolLM2-135M-Instruct requantized by
//! llama.cpp's own quantizer into Q2_K (its mix, and pure), Q3_K_S/M/L, Q4_K_S, IQ3_S, IQ3_M and
//! IQ4_XS, and
//! llama.cpp's logits at every position of one prompt on each file. Both are made at test time
//! by testdata/reference/requant-smollm2/make_requant.py (`./setup.sh --test` runs it) into
//! testdata/generated/requant-smollm2; Strata's CPU logits must agree with llama.cpp's.

use std::path::PathBuf;

use strata::model::Logits;

use crate::models::models_util::ids;

/// Teacher-forced argmax agreement with llama.cpp, the bound. Both engines quantize the
/// activations to Q8_K / Q8_0 the same way, but sum in a different order, so a near-tie can flip.
const MIN_ARGMAX_AGREEMENT: f64 = 0.95;
/// Largest |logit difference| at any position and token. SmolLM2's logits span about ±30; an
/// error in a block layout or a grid moves them by whole units (measured: see each type's line).
const MAX_LOGIT_DIFF: f32 = 0.25;

fn generated() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/generated/requant-smollm2"))
}

fn index() -> serde_json::Value {
    let p = generated().join("index.json");
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (made by ./setup.sh --test: testdata/reference/requant-smollm2/make_requant.py with llama.cpp)",
            p.display()
        )
    });
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("parsing {}: {e}", p.display()))
}

/// `ftype`'s file on the CPU against llama.cpp, after checking the file really holds `ty`
/// tensors (llama.cpp falls back to other types where a row is not a multiple of 256).
fn check(ftype: &str, ty: &str) {
    let index = index();
    let entry = &index["types"][ftype];
    let n_ty = entry["tensor_types"][ty].as_u64().unwrap_or(0);
    assert!(n_ty > 0, "{ftype}: llama.cpp wrote no {ty} tensor: {}", entry["tensor_types"]);
    let prompt = ids(&index["prompt_ids"]);
    let (shape, want) = strata::npy::read_f32(&generated().join(format!("{ftype}.logits.npy"))).unwrap();

    let opts = strata::RunOptions { max_context: 512, ..Default::default() };
    let e = strata::Engine::load(&generated().join(format!("{ftype}.gguf")), opts).unwrap();
    let mut sess = e.new_session().unwrap();
    let mut got = Vec::new();
    e.eval(&mut *sess, &prompt, Logits::All, &mut got).unwrap();
    let v = shape[1];
    assert_eq!(shape[0], prompt.len());
    assert_eq!(got.len(), want.len(), "{ftype}: logits shape");

    let argmax = strata::model::argmax;
    let (mut agree, mut max_diff, mut at) = (0usize, 0f32, 0usize);
    for (pos, (g, w)) in got.chunks(v).zip(want.chunks(v)).enumerate() {
        agree += (argmax(g) == argmax(w)) as usize;
        for (a, b) in g.iter().zip(w) {
            let d = (a - b).abs();
            if !(d <= max_diff) {
                (max_diff, at) = (d, pos);
            }
        }
    }
    let rate = agree as f64 / prompt.len() as f64;
    eprintln!(
        "{ftype} ({n_ty} {ty} tensors, {}): argmax {agree}/{} positions, max |logit diff| {max_diff:.3} (pos {at})",
        entry["tensor_types"],
        prompt.len()
    );
    assert!(rate >= MIN_ARGMAX_AGREEMENT, "{ftype}: argmax agrees at only {agree}/{} positions", prompt.len());
    assert!(max_diff <= MAX_LOGIT_DIFF, "{ftype}: max |logit diff| {max_diff} at position {at}");
}

// Each file against llama.cpp, naming the type its K/IQ tensors have: llama.cpp's mixes move
// ffn_down up a type (Q2_K writes it as Q3_K, Q3_K_M as Q4_K, Q3_K_L as Q5_K), so Q2_K itself
// comes from the pure file.

#[test]
fn requant_q2_k_matches_llama_cpp() {
    check("Q2_K", "q3_K");
}

#[test]
fn requant_q2_k_pure_matches_llama_cpp() {
    check("Q2_K-pure", "q2_K");
}

#[test]
fn requant_q3_k_s_matches_llama_cpp() {
    check("Q3_K_S", "q3_K");
}

#[test]
fn requant_q3_k_m_matches_llama_cpp() {
    check("Q3_K_M", "q4_K");
}

#[test]
fn requant_q3_k_l_matches_llama_cpp() {
    check("Q3_K_L", "q5_K");
}

#[test]
fn requant_q4_k_s_matches_llama_cpp() {
    check("Q4_K_S", "q4_K");
}

#[test]
fn requant_iq3_s_matches_llama_cpp() {
    check("IQ3_S", "iq3_s");
}

#[test]
fn requant_iq3_m_matches_llama_cpp() {
    check("IQ3_M", "iq3_s");
}

#[test]
fn requant_iq4_xs_matches_llama_cpp() {
    check("IQ4_XS", "iq4_xs");
}
