//! Where the routed experts the CPU computes live (`strata::residency`, `--mmap-experts`): read
//! into RAM at load by default, left mapped with the flag or when they do not fit, checked on
//! the synthetic qwen3moe and Flash-Next fixtures against the file's own tensor directory.

use strata::engine::AnyModel;
use strata::model::{Ffn, Logits, Mat};
use strata::residency::Placement;
use strata::{Engine, RunOptions};

use crate::models_util::reference;

const MOE: &str = "tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf";
const FLASH: &str = "tiny-qwen4exp/tiny-qwen4exp-public-f32.gguf";

fn load(rel: &str, mmap_experts: bool) -> Engine {
    let opts = RunOptions { max_context: 64, mmap_experts, ..Default::default() };
    Engine::load(&reference(rel), opts).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// (routed-expert matrices, one non-expert matrix) of a CPU model.
fn mats(m: &AnyModel) -> (Vec<&Mat>, &Mat) {
    match m {
        AnyModel::Std(m) => {
            let experts = m.w.layers.iter().flat_map(|l| match &l.ffn.ffn {
                Ffn::Moe { gate, up, down, .. } => vec![gate, up, down],
                Ffn::Dense { .. } => Vec::new(),
            });
            (experts.collect(), &m.w.layers[0].attn.wq)
        }
        AnyModel::Flash(q) => (q.layers.iter().flat_map(|l| l.moe.experts.iter().flat_map(|e| [&e.gate, &e.up, &e.down])).collect(), &q.output),
        _ => panic!("a CPU model was expected"),
    }
}

/// Bytes of the `*_exps.weight` tensors in the file's directory.
fn exps_bytes(rel: &str) -> u64 {
    let g = gguf::GgufFile::open(&reference(rel)).unwrap();
    g.tensors().iter().filter(|t| t.name.ends_with("_exps.weight")).map(|t| t.n_bytes as u64).sum()
}

fn logits(e: &Engine, toks: &[u32]) -> Vec<f32> {
    let mut s = e.new_session().unwrap();
    let mut out = Vec::new();
    e.model.eval(&mut s, toks, Logits::All, &mut out).unwrap();
    out
}

#[test]
fn cpu_experts_are_read_into_ram_unless_mmap_experts() {
    for rel in [MOE, FLASH] {
        let (ram, mapped) = (load(rel, false), load(rel, true));
        let ((re, rw), (me, mw)) = (mats(&ram.model), mats(&mapped.model));
        assert!(!re.is_empty() && re.len() == me.len(), "{rel}");
        assert!(re.iter().all(|m| !m.is_mapped()), "{rel}: an expert stayed mapped by default");
        assert!(me.iter().all(|m| m.is_mapped()), "{rel}: --mmap-experts copied an expert");
        assert!(rw.is_mapped() && mw.is_mapped(), "{rel}: a non-expert weight was copied");
        assert!(re.iter().zip(&me).all(|(a, b)| a.data() == b.data()), "{rel}: the copies differ from the file");
        let copied: u64 = re.iter().map(|m| m.data().len() as u64).sum();
        assert_eq!(copied, exps_bytes(rel), "{rel}: bytes copied vs the file's expert tensors");
        let toks = [1u32, 5, 9, 300, 17];
        let (a, b) = (logits(&ram, &toks), logits(&mapped, &toks));
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{rel}: logits differ");
    }
}

#[test]
fn experts_that_do_not_fit_stay_mapped_with_the_reason() {
    for rel in [MOE, FLASH] {
        let mut e = load(rel, true);
        let bytes = exps_bytes(rel);
        let p = e.model.read_experts_into_ram(Some(bytes - 1)).expect("an MoE model");
        assert_eq!(p, Placement::Mapped { bytes, too_big: Some(bytes - 1) }, "{rel}");
        let msg = p.message().expect("a message when they do not fit");
        assert!(msg.contains("do not fit") && msg.contains("--mmap-experts"), "{msg}");
        assert!(mats(&e.model).0.iter().all(|m| m.is_mapped()), "{rel}");
        assert_eq!(e.model.read_experts_into_ram(Some(bytes)), Some(Placement::Ram { bytes }), "{rel}: exactly the budget fits");
        assert!(mats(&e.model).0.iter().all(|m| !m.is_mapped()), "{rel}");
        // Read once: nothing left to copy.
        assert_eq!(e.model.read_experts_into_ram(Some(0)), Some(Placement::Ram { bytes: 0 }), "{rel}");
    }
    // A dense model has no experts to place.
    let mut dense = Engine::load(&crate::models_util::gemma_path(), RunOptions { max_context: 64, ..Default::default() }).unwrap();
    assert_eq!(dense.model.read_experts_into_ram(None), None);
}
