//! Qwen3 (dense) on small random-weight GGUF models written with the gguf crate's writer,
//! checked against the independent float64 forward pass in `models_util`.

use strata::cpu::prelude::*;
use strata::kv_cache::KvType;
use strata::model::Decoder;
use strata::model::Logits;

use crate::models::models_util::{TinyCfg, TinyModel, max_abs_diff};

/// F32 weights: the engine differs from the f64 reference only by f32 arithmetic and by the
/// f16 rounding of the query and of the attention probabilities (llama.cpp's numerics).
const F32_LOGIT_TOL: f64 = 5e-3;
/// Q8_0 weights: the reference uses the dequantized weights, so what remains is the engine's
/// Q8_0 quantization of the activations (llama.cpp does the same) before each dot product.
const Q8_LOGIT_TOL: f64 = 0.1;

pub fn qwen3_cfg() -> TinyCfg {
    TinyCfg {
        n_vocab: 96,
        n_embd: 64,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 32,
        n_ff: 96,
        moe: None,
        rope_base: 10000.0,
        eps: 1e-6,
        gemma_window: None,
    }
}

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("strata-test-{}-{name}", std::process::id()))
}

pub fn check_against_reference(m: &TinyModel, ty: quant::GgmlType, tol: f64, name: &str) {
    let path = tmp(name);
    m.write_gguf(&path, ty);
    let model = Decoder::load(&path).expect("load tiny model");
    let tokens: Vec<u32> = (0..23).map(|i| (i * 37 + 5) % m.cfg.n_vocab as u32).collect();
    let want = m.reference_logits(&tokens);
    for chunk in [512, 5, 1] {
        let mut sess = model.new_session(KvType::F16, 64, chunk);
        let mut got = Vec::new();
        model.eval(&mut sess, &tokens, Logits::All, &mut got).unwrap();
        let (d, i, j) = max_abs_diff(&got, &want);
        eprintln!("{name} (prefill chunk {chunk}): max |logit diff| {d:.2e} at pos {i} token {j}");
        assert!(d <= tol, "{name}: {d} at pos {i} token {j}: {} vs {}", got[i * m.cfg.n_vocab + j], want[i][j]);
    }
    // Incremental decode (one token at a time) gives the same last logits.
    let mut sess = model.new_session(KvType::F16, 64, 512);
    let mut got = Vec::new();
    model.eval(&mut sess, &tokens[..10], Logits::Last, &mut got).unwrap();
    for &t in &tokens[10..] {
        model.eval(&mut sess, &[t], Logits::Last, &mut got).unwrap();
    }
    let (d, _, _) = max_abs_diff(&got, &want[want.len() - 1..]);
    assert!(d <= tol, "{name}: decode path differs by {d}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn qwen3_f32_matches_scalar_reference() {
    check_against_reference(&TinyModel::random(qwen3_cfg(), 7), quant::GgmlType::F32, F32_LOGIT_TOL, "qwen3-f32.gguf");
}

#[test]
fn qwen3_q8_0_close_to_scalar_reference() {
    let m = TinyModel::random(qwen3_cfg(), 8).roundtrip(quant::GgmlType::Q8_0);
    check_against_reference(&m, quant::GgmlType::Q8_0, Q8_LOGIT_TOL, "qwen3-q8_0.gguf");
}
