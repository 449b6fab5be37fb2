//! Where the weights the CPU computes with live (`strata::residency`, `--mmap`,
//! `--mmap-experts`): read into RAM at load by default, left mapped with the flags or when they
//! do not fit. Routed experts on the synthetic qwen3moe and Flash-Next fixtures against the
//! file's own tensor directory; dense weights on Gemma 3 270M (its output head is its token
//! embedding).

use strata::cpu::MatCpu;
use strata::engine::{Description, HostWeights};
use strata::model::{Ffn, Logits, Mat};
use strata::residency::{Placement, Weights};
use strata::{Engine, RunOptions};

use crate::models::models_util::reference;

const MOE: &str = "tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf";
const FLASH: &str = "tiny-qwen4exp/tiny-qwen4exp-public-f32.gguf";

fn load(rel: &str, mmap_experts: bool) -> Engine {
    // --mmap-experts alone: the dense weights are still read into RAM.
    let opts = RunOptions { max_context: 64, mmap_experts, ..Default::default() };
    Engine::load(&reference(rel), opts).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// (routed-expert matrices, one non-expert matrix) of a CPU model.
fn mats(e: &Engine) -> (Vec<&Mat>, &Mat) {
    match e.model.description() {
        Description::Decoder(m) => {
            let experts = m.w.layers.iter().flat_map(|l| match &l.ffn.ffn {
                Ffn::Moe { gate, up, down, .. } => vec![gate, up, down],
                Ffn::Dense { .. } => Vec::new(),
            });
            (experts.collect(), &m.w.layers[0].attn.wq)
        }
        Description::Qwen4Exp(q) => (
            q.layers.iter().flat_map(|l| l.moe.experts.iter().flat_map(|e| [&e.gate, &e.up, &e.down])).collect(),
            &q.output,
        ),
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
    e.eval(&mut *s, toks, Logits::All, &mut out).unwrap();
    out
}

#[test]
fn cpu_experts_are_read_into_ram_unless_mmap_experts() {
    for rel in [MOE, FLASH] {
        let (ram, mapped) = (load(rel, false), load(rel, true));
        let ((re, rw), (me, mw)) = (mats(&ram), mats(&mapped));
        assert!(!re.is_empty() && re.len() == me.len(), "{rel}");
        assert!(re.iter().all(|m| !m.is_mapped()), "{rel}: an expert stayed mapped by default");
        assert!(me.iter().all(|m| m.is_mapped()), "{rel}: --mmap-experts copied an expert");
        // The other weights follow --mmap, not --mmap-experts.
        assert!(!rw.is_mapped() && !mw.is_mapped(), "{rel}: a non-expert weight stayed mapped");
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
        let p = e.read_experts_into_ram(Some(bytes - 1)).expect("an MoE model");
        assert_eq!(p, Placement::TooBig { bytes, budget: bytes - 1 }, "{rel}");
        let msg = p.message(Weights::Experts).expect("a message when they do not fit");
        assert!(msg.contains("do not fit") && msg.contains("--mmap-experts"), "{msg}");
        assert!(mats(&e).0.iter().all(|m| m.is_mapped()), "{rel}");
        assert_eq!(
            e.read_experts_into_ram(Some(bytes)),
            Some(Placement::Ram { bytes }),
            "{rel}: exactly the budget fits"
        );
        assert!(mats(&e).0.iter().all(|m| !m.is_mapped()), "{rel}");
        // Read once: nothing left to copy.
        assert_eq!(e.read_experts_into_ram(Some(0)), Some(Placement::Ram { bytes: 0 }), "{rel}");
    }
    // A dense model has no experts to place.
    let mut dense =
        Engine::load(&crate::models::models_util::gemma_path(), RunOptions { max_context: 64, ..Default::default() })
            .unwrap();
    assert_eq!(dense.read_experts_into_ram(None), None);
}

fn gemma(mmap: bool) -> Engine {
    Engine::load(&crate::models::models_util::gemma_path(), RunOptions { max_context: 64, mmap, ..Default::default() })
        .unwrap()
}

/// Every matrix of a shared-decoder model, and whether its token embedding is the output head.
fn dense_mats(e: &Engine) -> (Vec<&Mat>, &Mat, &Mat) {
    let Description::Decoder(m) = e.model.description() else { panic!("a decoder was expected") };
    let w = &m.w;
    let layers = w.layers.iter().flat_map(|l| {
        let a = &l.attn;
        let mut v = vec![&a.wq, &a.wk, &a.wv, &a.wo];
        if let Ffn::Dense { gate, up, down } = &l.ffn.ffn {
            v.extend([gate, up, down]);
        }
        v
    });
    (layers.chain([&w.output]).collect(), &w.output, &w.tok_embd)
}

#[test]
fn dense_weights_are_read_into_ram_unless_mmap() {
    let (ram, mapped) = (gemma(false), gemma(true));
    let ((rm, rout, remb), (mm, _, memb)) = (dense_mats(&ram), dense_mats(&mapped));
    assert!(rm.iter().all(|m| !m.is_mapped()), "a matrix stayed mapped by default");
    assert!(mm.iter().all(|m| m.is_mapped()) && memb.is_mapped(), "--mmap copied a matrix");
    assert!(rm.iter().zip(&mm).all(|(a, b)| a.data() == b.data()), "the copies differ from the file");
    // Gemma's head is its embedding: one copy serves both.
    assert!(
        !remb.is_mapped() && remb.data().as_ptr() == rout.data().as_ptr(),
        "the tied embedding was copied twice or not at all"
    );
    // The copy is one region whose bytes are the file's matrices, each window once.
    let g = gguf::GgufFile::open(&crate::models::models_util::gemma_path()).unwrap();
    let file_bytes: u64 = g.tensors().iter().filter(|t| t.dims.len() == 2).map(|t| t.n_bytes as u64).sum();
    let copied: u64 = rm.iter().map(|m| m.data().len() as u64).sum();
    assert_eq!(copied, file_bytes, "bytes in RAM vs the file's matrices");
    let toks = [2u32, 818, 5279, 563, 496];
    let (a, b) = (logits(&ram, &toks), logits(&mapped, &toks));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "logits differ");
}

#[test]
fn qwen4exp_dense_weights_are_read_into_ram_unless_mmap() {
    let load =
        |mmap| Engine::load(&reference(FLASH), RunOptions { max_context: 64, mmap, ..Default::default() }).unwrap();
    let (mut ram, mut mapped) = (load(false), load(true));
    let (rd, md) = (ram.model.host_matrices(HostWeights::Dense), mapped.model.host_matrices(HostWeights::Dense));
    assert!(rd.len() > 10 && rd.len() == md.len());
    assert!(rd.iter().all(|m| !m.is_mapped()) && md.iter().all(|m| m.is_mapped()));
    assert!(rd.iter().zip(&md).all(|(a, b)| a.data() == b.data()), "the copies differ from the file");
    drop((rd, md));
    assert!(mats(&mapped).0.iter().all(|m| m.is_mapped()), "--mmap copied an expert");
    let toks = [1u32, 5, 9, 300, 17];
    let (a, b) = (logits(&ram, &toks), logits(&mapped, &toks));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "logits differ");
}

#[test]
fn dense_weights_that_do_not_fit_stay_mapped_and_large_ones_are_copied_in_pieces() {
    let mut e = gemma(true);
    let mats = e.model.host_matrices(HostWeights::Dense);
    let bytes = Mat::mapped_bytes(&mats);
    drop(mats);
    let p = e.read_dense_into_ram(Some(bytes - 1)).expect("a CPU model");
    assert_eq!(p, Placement::TooBig { bytes, budget: bytes - 1 });
    let msg = p.message(Weights::Dense).expect("a message when they do not fit");
    assert!(msg.contains("do not fit") && msg.contains("--mmap"), "{msg}");
    assert!(dense_mats(&e).0.iter().all(|m| m.is_mapped()));
    // The copy hands back the mapped pages piece by piece: never a whole 178 MB head at once.
    let mut pieces = Vec::new();
    Mat::read_into_ram(e.model.host_matrices(HostWeights::Dense), |src| pieces.push(src.len())).unwrap();
    assert_eq!(pieces.iter().map(|&n| n as u64).sum::<u64>(), bytes);
    assert!(pieces.iter().all(|&n| n <= 8 << 20), "largest piece {:?}", pieces.iter().max());
    assert!(dense_mats(&e).0.iter().all(|m| !m.is_mapped()));
    assert_eq!(e.read_dense_into_ram(Some(0)), Some(Placement::Ram { bytes: 0 }), "read once: nothing left to copy");
}

#[test]
fn a_qwen4exp_layers_experts_stay_one_range_in_ram_and_mapped() {
    // `--pcie-frac` lets the device read a layer's experts in place as one stack
    // (gpu-executor/src/experts/pcie.rs): the copy in RAM keeps each tensor's experts back to back.
    let g = gguf::GgufFile::open(&reference(FLASH)).unwrap();
    for mmap_experts in [false, true] {
        let e = load(FLASH, mmap_experts);
        let Description::Qwen4Exp(q) = e.model.description() else { panic!("{FLASH}: not Flash-Next") };
        for (il, l) in q.layers.iter().enumerate() {
            let parts: [(&str, fn(&strata::model::qwen4exp::moe::SwiGlu) -> &Mat); 3] =
                [("gate", |x| &x.gate), ("up", |x| &x.up), ("down", |x| &x.down)];
            for (name, pick) in parts {
                let mats: Vec<&Mat> = l.moe.experts.iter().map(pick).collect();
                let joined = Mat::joined(&mats)
                    .unwrap_or_else(|| panic!("blk.{il}.ffn_{name}_exps split apart (--mmap-experts {mmap_experts})"));
                let t = g.tensors().iter().find(|t| t.name == format!("blk.{il}.ffn_{name}_exps.weight")).unwrap();
                assert!(
                    joined == g.tensor_data(t),
                    "blk.{il}.ffn_{name}_exps: the joined range is not the file's tensor"
                );
            }
            // Two different tensors are not one range.
            assert!(Mat::joined(&[&l.moe.experts[0].gate, &l.moe.experts[0].up]).is_none() || l.moe.experts.len() == 1);
        }
    }
}

/// The GPU's CPU pool quantizes a one-token MoE input once for all the experts it computes
/// (`cpu::ExpertActs`); every expert's gate and up products from it equal the per-expert
/// products (`DecoderMatmul::mm`, Flash-Next's `SwiGluCpu::forward`) bit for bit, on the
/// synthetic qwen3moe (Q8_0) and the two-shard Flash-Next Q8_0 fixtures.
#[test]
fn expert_activations_quantized_once_give_the_per_expert_bits() {
    use strata::cpu::qwen4exp::SwiGluCpu;
    use strata::cpu::{DecoderMatmul, ExpertActs, Numerics, matmul_prepared};
    let e = load(MOE, false);
    let Description::Decoder(m) = e.model.description() else { panic!("{MOE}: not a decoder") };
    let mut checked = 0;
    for l in &m.w.layers {
        let Ffn::Moe { gate, up, .. } = &l.ffn.ffn else { continue };
        let x: Vec<f32> = (0..gate.cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        let entry = m.acts_entry(Numerics::Llama, gate, 1).expect("quantized experts share");
        let acts = ExpertActs::new(entry, gate, up, &x, 1).expect("prepared");
        for ex in 0..gate.n_mat {
            let (mut want, mut got) = (vec![0f32; gate.rows], vec![f32::NAN; gate.rows]);
            for (w, a) in [(gate, acts.gate_up()[0]), (up, acts.gate_up()[1])] {
                m.mm(Numerics::Llama, w, ex, &x, 1, &mut want);
                matmul_prepared(&w.matrix(ex), a, &mut got);
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "expert {ex}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 16, "{checked}");
    let flash = strata::model::qwen4exp::Qwen4Exp::open(&reference(
        "tiny-qwen4exp/tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf",
    ))
    .unwrap();
    for l in &flash.layers {
        let x: Vec<f32> = (0..flash.hp.n_embd).map(|i| ((i * 53 % 97) as f32 - 48.0) / 30.0).collect();
        let acts = l.moe.experts[0].shared_acts(&x).expect("Q8_0 experts share");
        for f in &l.moe.experts {
            let (mut want, mut got) = (vec![0f32; flash.hp.n_embd], vec![f32::NAN; flash.hp.n_embd]);
            f.forward(&x, 1, &mut want);
            f.forward_shared(&acts, &mut got);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}
