//! Synthetic qwen4exp GGUFs (`model::qwen4exp::synth`) exercise the loader paths the llama.cpp
//! fixtures do not: the `recurrent_layers` bool array, a dense attention layer (ratio 0), a
//! tied head, F16 and Q8_0 matrices, a Q5_0 PLE table in its own shard. There is no external
//! reference for random shapes, so these check invariants: the file loads with the intended
//! layer kinds, logits are finite, and any split into forward calls is bit-identical to one
//! pass (state carried correctly through every layer kind).

use std::path::PathBuf;

use strata::cpu::prelude::*;
use strata::model::qwen4exp::{KvType, LayerKind, Qwen4Exp};
use strata::synth::qwen4exp::{SynthConfig, write};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-qwen4exp-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// The writer's tiny shape with a Q5_0 PLE table, a tied head and `matrix_type` matrices.
fn small(matrix_type: quant::GgmlType) -> SynthConfig {
    let mut c = SynthConfig::tiny();
    if let Some(p) = c.ple.as_mut() {
        p.table_type = quant::GgmlType::Q5_0;
    }
    SynthConfig { matrix_type, tied: true, ..c }
}

#[test]
fn synthetic_models_load_and_split_passes_are_bit_identical() {
    for (i, ty) in [quant::GgmlType::F32, quant::GgmlType::F16, quant::GgmlType::Q8_0].into_iter().enumerate() {
        let cfg = small(ty);
        let paths = write(&cfg, 7 + i as u64, &tmp(&format!("small-{i}")), true).unwrap();
        assert_eq!(paths.len(), 2, "PLE table in its own shard");
        let m = Qwen4Exp::open(&paths[0]).unwrap_or_else(|e| panic!("{ty:?}: {e}"));
        assert_eq!(m.hp.layers, vec![LayerKind::Gdn, LayerKind::Qsa { ratio: 2 }, LayerKind::Dense, LayerKind::Gdn]);
        assert!(m.file.tensor("output.weight").is_none(), "tied head");
        assert_eq!(m.file.tensor("per_layer_token_embd.weight").unwrap().file_index, 1);

        // 40 tokens with EOS (2) inside; the QSA layer drops cells after top_k + r - 1 = 7.
        let toks: Vec<u32> = (0..40u32).map(|t| if t == 17 { 2 } else { (t * 37 + 11) % 300 }).collect();
        let mut st = m.new_state(KvType::F16);
        let whole = m.forward(&mut st, &toks, 0).unwrap();
        assert!(whole.iter().all(|v| v.is_finite()), "{ty:?}: non-finite logits");
        let mut st2 = m.new_state(KvType::F16);
        let mut parts = Vec::new();
        let mut at = 0;
        for len in [5, 1, 1, 13, 20] {
            parts.extend(m.forward(&mut st2, &toks[at..at + len], at).unwrap());
            at += len;
        }
        assert!(whole == parts, "{ty:?}: split passes differ");
        assert_eq!(st, st2, "{ty:?}: states differ");
        for p in paths {
            std::fs::remove_file(p).ok();
        }
    }
}

/// The `public` preset written by the Rust generator has the fixture's shapes and key values.
#[test]
fn synthetic_public_preset_matches_fixture_hparams() {
    let paths = write(&SynthConfig::public(), 1, &tmp("public"), false).unwrap();
    let ours = Qwen4Exp::open(&paths[0]).unwrap();
    let fixture = Qwen4Exp::open(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/reference/tiny-qwen4exp/tiny-qwen4exp-public-f32.gguf"),
    )
    .unwrap();
    let (a, b) = (&ours.hp, &fixture.hp);
    assert_eq!(a.layers, b.layers);
    let shape = |h: &strata::model::qwen4exp::HParams| {
        (h.n_vocab, h.n_embd, h.n_head, h.n_head_kv, h.head_dim, h.n_rot, h.ssm_state, h.hc, h.idx_top_k, h.n_expert)
    };
    assert_eq!(shape(a), shape(b));
    let (pa, pb) = (a.ple.as_ref().unwrap(), b.ple.as_ref().unwrap());
    assert_eq!(
        (pa.layer, pa.ngram, pa.heads_per_ngram, pa.head_dim),
        (pb.layer, pb.ngram, pb.heads_per_ngram, pb.head_dim)
    );
    let mut st = ours.new_state(KvType::F16);
    let l = ours.forward(&mut st, &[1, 2, 3, 4], 0).unwrap();
    assert!(l.iter().all(|v| v.is_finite() && v.abs() < 100.0));
    std::fs::remove_file(&paths[0]).ok();
}

/// A checkpoint that counts its MTP block in `block_count` (`nextn_predict_layers = 1`, as the
/// real release does) runs the same trunk: identical logits to the file without the block.
#[test]
fn synthetic_mtp_block_is_skipped_by_the_trunk() {
    let mut cfg = small(quant::GgmlType::F32);
    let plain = write(&cfg, 42, &tmp("trunk"), false).unwrap();
    cfg.mtp_stub = true;
    let with_mtp = write(&cfg, 42, &tmp("trunk-mtp"), false).unwrap();
    let (a, b) = (Qwen4Exp::open(&plain[0]).unwrap(), Qwen4Exp::open(&with_mtp[0]).unwrap());
    assert_eq!((b.hp.n_layer, b.hp.n_nextn), (4, 1));
    assert!(b.file.tensor("blk.4.nextn.eh_proj.weight").is_some());
    let toks: Vec<u32> = (0..12).map(|t| t * 7 % 300).collect();
    let (mut sa, mut sb) = (a.new_state(KvType::F16), b.new_state(KvType::F16));
    assert!(a.forward(&mut sa, &toks, 0).unwrap() == b.forward(&mut sb, &toks, 0).unwrap());
    for p in plain.iter().chain(&with_mtp) {
        std::fs::remove_file(p).ok();
    }
}
