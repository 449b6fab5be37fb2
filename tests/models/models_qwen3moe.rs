//! Qwen3-MoE: random-weight models against the float64 reference (`models_util`), and the
//! synthetic models of testdata/reference/tiny-qwen3moe against llama.cpp's logits.

use strata::cpu::prelude::*;
use strata::kv_cache::KvType;
use strata::model::Decoder;
use strata::model::Logits;

use crate::models::models_qwen3::check_against_reference;
use crate::models::models_util::{TinyCfg, TinyModel, ids, read_json, reference};

/// f32 weights: the README reports an f64 numpy pass within 1.7e-3 of llama.cpp
/// (3.6e-4 when emulating the f16 KV cache, which we do).
const TINY_F32_TOL: f64 = 2e-3;
/// Q8_0 / mixed weights on the 10-token prompt: Q8 activation rounding can flip between
/// implementations; the README reports up to 0.7 on long prompts.
const TINY_Q8_TOL: f64 = 0.1;

#[test]
fn qwen3moe_f32_matches_scalar_reference() {
    let cfg = TinyCfg { moe: Some((8, 2)), n_ff: 48, ..crate::models::models_qwen3::qwen3_cfg() };
    check_against_reference(&TinyModel::random(cfg, 11), quant::GgmlType::F32, 5e-3, "qwen3moe-f32.gguf");
}

fn check_tiny(variant: &str, tol: f64, n_greedy: usize) {
    let g = read_json(&format!("tiny-qwen3moe/ref-{variant}/greedy.json"));
    let model = Decoder::load(&reference(&format!("tiny-qwen3moe/tiny-qwen3moe-v1024-{variant}.gguf"))).unwrap();
    let (shape, want) =
        strata::npy::read_f32(&reference(&format!("tiny-qwen3moe/ref-{variant}/prompt1_all_logits.npy"))).unwrap();
    let r0 = &g["results"][0];
    let prompt = ids(&r0["prompt_token_ids"]);
    assert_eq!(shape, vec![prompt.len(), model.n_vocab]);
    let mut sess = model.new_session(KvType::F16, 1024, 512);
    let mut got = Vec::new();
    model.eval(&mut sess, &prompt, Logits::All, &mut got).unwrap();
    let (mut max, mut at) = (0f64, 0);
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let d = (*a as f64 - *b as f64).abs();
        if !(d <= max) {
            max = d;
            at = i;
        }
    }
    eprintln!(
        "tiny-qwen3moe {variant}: max |logit diff| vs llama.cpp {max:.2e} (pos {}, token {})",
        at / model.n_vocab,
        at % model.n_vocab
    );
    assert!(got.iter().all(|x| x.is_finite()), "{variant}: non-finite logits");
    assert!(max <= tol, "{variant}: max diff {max} at {at}");
    // Greedy continuations (teacher-free) for every prompt.
    for r in g["results"].as_array().unwrap() {
        let prompt = ids(&r["prompt_token_ids"]);
        let want = ids(&r["generated_token_ids"]);
        let mut sess = model.new_session(KvType::F16, 1024, 512);
        let mut logits = Vec::new();
        model.eval(&mut sess, &prompt, Logits::Last, &mut logits).unwrap();
        let mut out = Vec::new();
        while out.len() < want.len() {
            let t =
                logits.iter().enumerate().fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32;
            out.push(t);
            model.eval(&mut sess, &[t], Logits::Last, &mut logits).unwrap();
        }
        let ok = out.iter().zip(&want).take_while(|(a, b)| a == b).count();
        eprintln!(
            "tiny-qwen3moe {variant} prompt of {} tokens: {ok}/{} greedy tokens identical",
            prompt.len(),
            want.len()
        );
        assert!(ok >= n_greedy.min(want.len()), "{variant}: diverged at {ok}\n got  {out:?}\n want {want:?}");
    }
}

#[test]
fn tiny_qwen3moe_f32_matches_llama_cpp() {
    check_tiny("f32", TINY_F32_TOL, 16);
}

#[test]
fn tiny_qwen3moe_q8_0_matches_llama_cpp() {
    check_tiny("q8_0", TINY_Q8_TOL, 16);
}

#[test]
fn tiny_qwen3moe_mixed_matches_llama_cpp() {
    check_tiny("mixed", TINY_Q8_TOL, 16);
}
