//! Speculative decoding with the MTP drafter is lossless and its rollback is exact:
//! - greedy ids and the final sequence state with `--spec 1..8 --mtp` equal plain greedy on
//!   synthetic qwen4exp models (F32 and Q8_0, dense and sparse MTP attention, the head's own
//!   tables or the model's) and on the llama.cpp f32 fixture (whose plain greedy ids are
//!   llama.cpp's);
//! - a random head is mostly rejected (rollbacks), an "echo" head on a model that repeats
//!   is accepted, and a wrapper that corrupts the j-th draft forces partial windows;
//! - every proposal equals, bit for bit (tokens and probabilities), what a fresh head run
//!   over the accepted history with the plain pass's hidden states proposes — so no rejected
//!   draft or stale hidden state survives a rollback in the head's cache;
//! - bad MTP files (wrong dims, missing tensors, the old single-stream `hnorm`, a partial
//!   `hc_head` mixer, truncated, wrong architecture, directories) give errors that name the
//!   file and the key or tensor, and the expected shape.

use std::path::{Path, PathBuf};

use strata::EngineError;
use strata::cpu::CpuQwen4Exp;
use strata::cpu::prelude::*;
use strata::model::qwen4exp::{KvType, Mtp, Qwen4Exp, SeqState};
use strata::spec::{CpuMtpHead, Draft, Drafter, MtpDrafter, SpecConfig, SpecStats, generate_greedy_spec};
use strata::synth::qwen4exp::{SynthConfig, SynthMtp, write, write_mtp};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-spec-mtp-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Records every proposal of an [`MtpDrafter`] and optionally corrupts draft `wrong_at`.
struct Recorder<'a> {
    inner: MtpDrafter<CpuMtpHead<'a>>,
    /// (history length, max, drafts as proposed by the head)
    log: Vec<(usize, usize, Vec<Draft>)>,
    wrong_at: Option<usize>,
    n_vocab: u32,
}

impl Drafter for Recorder<'_> {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<Draft> {
        let d = self.inner.propose(history, max);
        self.log.push((history.len(), max, d.clone()));
        let mut d = d;
        if let Some(j) = self.wrong_at
            && let Some(x) = d.get_mut(j)
        {
            x.token = (x.token + 1) % self.n_vocab;
        }
        d
    }
    fn wants_hidden(&self) -> bool {
        self.inner.wants_hidden()
    }
    fn observe(&mut self, tokens: &[u32], hidden: &[f32]) {
        self.inner.observe(tokens, hidden)
    }
}

struct Case {
    what: String,
    model: CpuQwen4Exp,
    mtp: Mtp,
    prompt: Vec<u32>,
    kv: KvType,
}

/// Plain greedy ids, final state, and the trunk hidden states of every consumed position.
fn plain(c: &Case, n: usize) -> (Vec<u32>, SeqState, Vec<f32>) {
    let mut st = c.model.0.new_state(c.kv);
    let ids = c.model.0.generate_greedy(&mut st, &c.prompt, n).unwrap();
    let mut seq = c.prompt.clone();
    seq.extend_from_slice(&ids[..n - 1]);
    let mut st2 = c.model.0.new_state(c.kv);
    let (_, hidden) = c.model.0.forward_hidden(&mut st2, &seq, 0).unwrap();
    assert!(st2 == st, "{}: one pass != step-by-step state", c.what);
    (ids, st, hidden)
}

/// Runs one configuration, checks losslessness and the proposals; returns the stats.
fn run(
    c: &Case,
    n: usize,
    cfg: SpecConfig,
    wrong_at: Option<usize>,
    want: &(Vec<u32>, SeqState, Vec<f32>),
) -> SpecStats {
    // One row of hidden state per position: the trunk's wide residual.
    let (m, e) = (&c.model.0, c.mtp.width());
    let mut rec = Recorder {
        inner: MtpDrafter::new(m, &c.mtp, c.kv, cfg.min_p),
        log: Vec::new(),
        wrong_at,
        n_vocab: m.n_vocab() as u32,
    };
    let mut st = crate::support::session(&c.model, c.kv, c.prompt.len() + n);
    let loaded: &dyn strata::engine::LoadedModel = &c.model;
    let (ids, s) = generate_greedy_spec(loaded, &mut st, &c.prompt, n, &mut rec, cfg).unwrap();
    let st = crate::support::qwen4exp_state(&*st);
    let tag = format!("{} N={} min_p={} wrong_at={wrong_at:?}", c.what, cfg.n_draft, cfg.min_p);
    assert_eq!(ids, want.0, "{tag}: ids differ ({s:?})");
    assert!(*st == want.1, "{tag}: final state differs");
    assert_eq!(s.decoded as usize, n - 1, "{tag}");
    assert_eq!(s.verify_steps + s.accepted, s.decoded, "{tag}");
    let ms = rec.inner.stats;
    assert_eq!((ms.desyncs, ms.errors), (0, 0), "{tag}: {ms:?}");
    // Every proposal == a fresh head over the accepted history (plain pass hidden states).
    // (Every 3rd proposal with min-p > 0, to keep the test fast: min-p changes only where the
    // chain stops, which is checked on every proposal.)
    let mut seq = c.prompt.clone();
    seq.extend_from_slice(&want.0);
    let every = if cfg.min_p > 0.0 { 3 } else { 1 };
    for (i, (hl, max, drafts)) in rec.log.iter().enumerate() {
        assert!(drafts.iter().all(|d| (0.0..=1.0).contains(&d.p)));
        assert!(
            drafts.iter().rev().skip(1).all(|d| d.p >= cfg.min_p),
            "{tag}: chain did not stop below min-p: {drafts:?}"
        );
        if i % every != 0 {
            continue;
        }
        let mut fresh = MtpDrafter::new(m, &c.mtp, c.kv, cfg.min_p);
        fresh.observe(&seq[..hl - 1], &want.2[..(hl - 1) * e]);
        let again = fresh.propose(&seq[..*hl], *max);
        assert!(
            again.len() == drafts.len()
                && again.iter().zip(drafts).all(|(a, b)| a.token == b.token && a.p.to_bits() == b.p.to_bits()),
            "{tag}: proposal at history {hl}: {drafts:?}, fresh head: {again:?}"
        );
    }
    s
}

fn add(t: &mut SpecStats, s: &SpecStats) {
    t.verify_steps += s.verify_steps;
    t.windows_with_drafts += s.windows_with_drafts;
    t.drafted += s.drafted;
    t.accepted += s.accepted;
    t.rollbacks += s.rollbacks;
    t.rollback_tokens += s.rollback_tokens;
    t.decoded += s.decoded;
}

/// N = 1..8 × min-p {0, 0.5}; returns summed stats.
fn check_all(c: &Case, n: usize) -> SpecStats {
    let want = plain(c, n);
    let mut t = SpecStats::default();
    for n_draft in 1..=8 {
        for min_p in [0.0f32, 0.5] {
            let s = run(c, n, SpecConfig { n_draft, min_p }, None, &want);
            add(&mut t, &s);
        }
    }
    eprintln!("{}: acceptance {:.3}, tokens/verify {:.3}, {t:?}", c.what, t.acceptance_rate(), t.tokens_per_verify());
    t
}

fn synth_case(what: &str, cfg: &SynthConfig, seed: u64, split: bool, head: &SynthMtp) -> Case {
    let paths = write(cfg, seed, &tmp(&format!("{what}-trunk")), split).unwrap();
    let mp = tmp(&format!("{what}-mtp.gguf"));
    write_mtp(cfg, head, seed + 100, &mp).unwrap();
    let model = Qwen4Exp::open(&paths[0]).unwrap();
    let mtp = Mtp::open(&model, &mp).unwrap_or_else(|e| panic!("{what}: {e}"));
    let base: Vec<u32> = (0..10).map(|k| (k * 37 + 5) % cfg.n_vocab as u32).collect();
    let mut prompt = base.clone();
    prompt.extend_from_slice(&base[..6]);
    Case { what: what.into(), model: CpuQwen4Exp(model), mtp, prompt, kv: KvType::F16 }
}

/// Random heads are (nearly always) rejected: every window rolls back the GDN state and the
/// head's cache; ids and state stay plain greedy's. F32 and Q8_0 models, dense and sparse
/// MTP attention, model-shared and own tables.
#[test]
fn spec_mtp_random_head_lossless_with_rollbacks() {
    let n = 24;
    for (what, ty, split, tied, head) in [
        ("f32-random", quant::GgmlType::F32, false, true, SynthMtp::default()),
        (
            "q8_0-random-sparse-own",
            quant::GgmlType::Q8_0,
            true,
            false,
            SynthMtp { matrix_type: quant::GgmlType::Q8_0, ratio: 2, own_tables: true, ..SynthMtp::default() },
        ),
    ] {
        let mut cfg = SynthConfig::tiny();
        cfg.matrix_type = ty;
        cfg.tied = tied;
        let c = synth_case(what, &cfg, 31, split, &head);
        let t = check_all(&c, n);
        assert!(t.drafted > 0 && t.rollbacks > 0, "{what}: {t:?}");
        assert!(t.drafted > t.accepted, "{what}: {t:?}");
    }
}

/// An echo head on tied models (which settle into repeating a token) is accepted; a wrapper
/// that corrupts draft j of every window forces windows that accept exactly j drafts and
/// roll back (the accepted part's real hidden states feed the head).
#[test]
fn spec_mtp_echo_head_accepted_and_partial_windows() {
    let n = 24;
    for (what, ty, split, head) in [
        ("f32-echo", quant::GgmlType::F32, false, SynthMtp { echo: true, ..SynthMtp::default() }),
        (
            "q8_0-echo-own",
            quant::GgmlType::Q8_0,
            true,
            SynthMtp {
                matrix_type: quant::GgmlType::Q8_0,
                ratio: 0,
                own_tables: true,
                echo: true,
                ..SynthMtp::default()
            },
        ),
    ] {
        let mut cfg = SynthConfig::tiny();
        cfg.matrix_type = ty;
        cfg.tied = true;
        let c = synth_case(what, &cfg, 41, split, &head);
        let t = check_all(&c, n);
        assert!(t.accepted > 0 && t.tokens_per_verify() > 1.5, "{what}: {t:?}");
        let want = plain(&c, n);
        for n_draft in [3, 8] {
            for j in 0..n_draft {
                let cfg = SpecConfig { n_draft, min_p: 0.0 };
                let s = run(&c, n, cfg, Some(j), &want);
                assert!(s.rollbacks > 0, "{what} N={n_draft} j={j}: {s:?}");
                assert!(s.accepted <= s.windows_with_drafts * j as u64, "{what}: {s:?}");
                if j > 0 {
                    assert!(s.accepted > 0, "{what} N={n_draft} j={j}: {s:?}");
                }
            }
        }
        // The echo head's probability is about 0.9 here: min-p 0.99 keeps every draft out of
        // the windows (and `run` checks the head stopped chaining after the first one).
        let s = run(&c, n, SpecConfig { n_draft: 4, min_p: 0.99 }, None, &want);
        assert_eq!((s.drafted, s.verify_steps), (0, n as u64 - 1), "{what}: {s:?}");
    }
}

/// The echo head in the published layout (wide residual in, GR, own `hc_head` mixer) on the
/// public-shape tied model `strata synth --preset public --tied --mtp-head echo --seed 11` writes,
/// with `strata bench --pp 16`'s prompt: every draft is accepted at N = 1, 4, 8, and the ids
/// are plain greedy's.
#[test]
fn spec_mtp_echo_head_full_acceptance_public() {
    let mut cfg = SynthConfig::public();
    cfg.tied = true;
    let paths = write(&cfg, 11, &tmp("echo-pub-trunk"), false).unwrap();
    let mp = tmp("echo-pub-mtp.gguf");
    let echo = SynthMtp { echo: true, ..SynthMtp::default() };
    write_mtp(&cfg, &echo, 11, &mp).unwrap();
    let cpu = CpuQwen4Exp(Qwen4Exp::open(&paths[0]).unwrap());
    let m = &cpu.0;
    let head = Mtp::open(m, &mp).unwrap();
    assert!(head.hc_head.is_some() && head.hnorm.len() == cfg.hc * cfg.n_embd);
    let nv = cfg.n_vocab as u32;
    let prompt: Vec<u32> = (0..16u32).map(|i| (i.wrapping_mul(2_654_435_761) % nv).max(3)).collect();
    let n = 64;
    let plain = m.generate_greedy(&mut m.new_state(KvType::F16), &prompt, n).unwrap();
    for n_draft in [1, 4, 8] {
        let mut d = MtpDrafter::new(m, &head, KvType::F16, 0.0);
        let mut st = crate::support::session(&cpu, KvType::F16, prompt.len() + n);
        let cfg = SpecConfig { n_draft, min_p: 0.0 };
        let loaded: &dyn strata::engine::LoadedModel = &cpu;
        let (ids, s) = generate_greedy_spec(loaded, &mut st, &prompt, n, &mut d, cfg).unwrap();
        assert_eq!(ids, plain, "N={n_draft}: ids differ");
        assert!(s.drafted > 0 && s.accepted == s.drafted && s.rollbacks == 0, "N={n_draft}: {s:?}");
    }
}

/// A prompt longer than the head's 512-pair micro-batch: the catch-up pass is split, the
/// output and the proposals stay exact.
#[test]
fn spec_mtp_long_prompt() {
    let mut cfg = SynthConfig::tiny();
    cfg.tied = true;
    let mut c = synth_case("long", &cfg, 61, false, &SynthMtp::default());
    c.prompt = (0..600).map(|k| (k * 7 + 3) % 300).collect();
    let want = plain(&c, 8);
    let s = run(&c, 8, SpecConfig { n_draft: 3, min_p: 0.0 }, None, &want);
    assert!(s.drafted > 0, "{s:?}");
}

/// The llama.cpp f32 fixture with a synthetic head of its shape: speculative ids == plain
/// greedy == llama.cpp's recorded greedy ids.
#[test]
fn spec_mtp_lossless_on_llama_cpp_fixture() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/reference/tiny-qwen4exp");
    let model = Qwen4Exp::open(&dir.join("tiny-qwen4exp-public-f32.gguf")).unwrap();
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("ref/f32/ref.json")).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    let s = &j["sequences"][1];
    let (prompt, greedy) = (ids(&s["token_ids"]), ids(&s["greedy_ids"]));
    let mp = tmp("fixture-mtp.gguf");
    write_mtp(&SynthConfig::public(), &SynthMtp::default(), 3, &mp).unwrap();
    let mtp = Mtp::open(&model, &mp).unwrap_or_else(|e| panic!("{e}"));
    let c = Case { what: "llama.cpp f32 fixture".into(), model: CpuQwen4Exp(model), mtp, prompt, kv: KvType::F16 };
    let n = greedy.len();
    assert_eq!(plain(&c, n).0, greedy);
    let want = plain(&c, n);
    let mut t = SpecStats::default();
    for n_draft in [1, 4, 8] {
        add(&mut t, &run(&c, n, SpecConfig { n_draft, min_p: 0.0 }, None, &want));
    }
    assert!(t.drafted > 0 && t.rollbacks > 0, "{t:?}");
}

// ------------------------------------------------------------------------------ bad files

fn err_of(m: &Qwen4Exp, p: &Path) -> String {
    match Mtp::open(m, p) {
        Ok(_) => panic!("{} loaded", p.display()),
        Err(e) => e.to_string(),
    }
}

/// Rewrites a GGUF: `meta` maps (key, value) → Some(new) / None (drop); `tensor` likewise.
fn rewrite(
    src: &Path,
    dst: &Path,
    meta: impl Fn(&str, &gguf::Value) -> Option<gguf::Value>,
    tensor: impl Fn(&gguf::TensorInfo, &[u8]) -> Option<(Vec<u64>, Vec<u8>)>,
) {
    let g = gguf::GgufFile::open(src).unwrap();
    let mut w = gguf::GgufWriter::new();
    for (k, v) in g.metadata() {
        if let Some(v) = meta(k, v) {
            w.add_metadata(k.clone(), v);
        }
    }
    for t in g.tensors() {
        if let Some((dims, bytes)) = tensor(t, g.tensor_data(t)) {
            w.add_tensor(t.name.clone(), &dims, t.ty, bytes);
        }
    }
    w.write(dst).unwrap();
}

#[test]
fn spec_mtp_bad_files_give_named_errors() {
    let cfg = SynthConfig::tiny();
    let paths = write(&cfg, 51, &tmp("bad-trunk"), false).unwrap();
    let m = Qwen4Exp::open(&paths[0]).unwrap();
    let good = tmp("good-mtp.gguf");
    write_mtp(&cfg, &SynthMtp::default(), 1, &good).unwrap();
    Mtp::open(&m, &good).unwrap();
    let keep_meta = |_: &str, v: &gguf::Value| Some(v.clone());
    let keep_t = |t: &gguf::TensorInfo, b: &[u8]| Some((t.dims.clone(), b.to_vec()));

    let mut cases: Vec<(PathBuf, Vec<&str>)> = Vec::new();
    // A head written for other dimensions.
    let mut other = cfg.clone();
    other.n_embd = 64;
    other.head_dim = 16;
    let p = tmp("bad-embd.gguf");
    write_mtp(&other, &SynthMtp::default(), 1, &p).unwrap();
    cases.push((p, vec!["qwen4exp.embedding_length", "64", "128"]));
    let mut other = cfg.clone();
    other.layers.pop();
    let p = tmp("bad-blocks.gguf");
    write_mtp(&other, &SynthMtp::default(), 1, &p).unwrap();
    cases.push((p, vec!["qwen4exp.block_count", "4 trunk layers"]));
    let mut other = cfg.clone();
    other.n_head = 2;
    let p = tmp("bad-heads.gguf");
    write_mtp(&other, &SynthMtp::default(), 1, &p).unwrap();
    cases.push((p, vec!["qwen4exp.attention.head_count", "2", "4"]));
    let mut other = cfg.clone();
    other.n_vocab = 250;
    let p = tmp("bad-vocab.gguf");
    write_mtp(&other, &SynthMtp { own_tables: true, ..SynthMtp::default() }, 1, &p).unwrap();
    cases.push((p, vec!["blk.4.nextn.embed_tokens.weight", "250", "300"]));
    // Missing tensors and keys, wrong shapes, wrong architecture.
    let p = tmp("bad-missing.gguf");
    rewrite(&good, &p, keep_meta, |t, b| {
        (t.name != "blk.4.nextn.eh_proj.weight").then(|| (t.dims.clone(), b.to_vec()))
    });
    cases.push((p, vec!["blk.4.nextn.eh_proj.weight", "not found"]));
    let p = tmp("bad-missing-ffn.gguf");
    rewrite(&good, &p, keep_meta, |t, b| {
        (t.name != "blk.4.ffn_down_shexp.weight").then(|| (t.dims.clone(), b.to_vec()))
    });
    cases.push((p, vec!["blk.4.ffn_down_shexp.weight", "not found"]));
    // The old single-stream reading: `hnorm` over one stream [E] instead of the wide
    // residual [hc·E] (tiny: 2 streams of 128).
    let p = tmp("bad-shape.gguf");
    rewrite(&good, &p, keep_meta, |t, b| {
        if t.name == "blk.4.nextn.hnorm.weight" {
            Some((vec![128], b[..512].to_vec()))
        } else {
            Some((t.dims.clone(), b.to_vec()))
        }
    });
    cases.push((p, vec!["blk.4.nextn.hnorm.weight", "shape [128]", "expected [256]"]));
    // One of the head mixer's three tensors missing (all three absent = the trunk's mixer).
    let p = tmp("bad-missing-hc-head.gguf");
    rewrite(&good, &p, keep_meta, |t, b| {
        (t.name != "blk.4.nextn.hc_head_up.weight").then(|| (t.dims.clone(), b.to_vec()))
    });
    cases.push((p, vec!["blk.4.nextn.hc_head_up.weight", "not found", "[32, 256]"]));
    let p = tmp("bad-hc-head-down.gguf");
    rewrite(&good, &p, keep_meta, |t, b| {
        if t.name == "blk.4.nextn.hc_head_down.weight" {
            Some((vec![128, 32], b[..128 * 32 * 4].to_vec()))
        } else {
            Some((t.dims.clone(), b.to_vec()))
        }
    });
    cases.push((p, vec!["blk.4.nextn.hc_head_down.weight", "[128, 32]", "expected [256, 32]"]));
    let p = tmp("bad-missing-hc-attn.gguf");
    rewrite(&good, &p, keep_meta, |t, b| {
        (t.name != "blk.4.hc_attn_inject.weight").then(|| (t.dims.clone(), b.to_vec()))
    });
    cases.push((p, vec!["blk.4.hc_attn_inject.weight", "not found", "[256, 2]"]));
    let p = tmp("bad-nextn-key.gguf");
    rewrite(&good, &p, |k, v| (k != "qwen4exp.nextn_predict_layers").then(|| v.clone()), keep_t);
    cases.push((p, vec!["qwen4exp.nextn_predict_layers", "not found"]));
    let p = tmp("bad-arch.gguf");
    rewrite(
        &good,
        &p,
        |k, v| Some(if k == "general.architecture" { gguf::Value::Str("llama".into()) } else { v.clone() }),
        keep_t,
    );
    cases.push((p, vec!["\"llama\"", "qwen4exp"]));
    let p = tmp("bad-recurrent.gguf");
    rewrite(
        &good,
        &p,
        |k, v| {
            Some(if k == "qwen4exp.attention.recurrent_layers" {
                gguf::Value::Array(vec![gguf::Value::Bool(true); 5])
            } else {
                v.clone()
            })
        },
        keep_t,
    );
    cases.push((p, vec!["qwen4exp.attention.recurrent_layers", "block 4"]));
    // Truncated (data cut in half) and not a GGUF at all.
    let bytes = std::fs::read(&good).unwrap();
    let p = tmp("bad-truncated.gguf");
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    cases.push((p, vec!["outside the file"]));
    let p = tmp("bad-header.gguf");
    std::fs::write(&p, &bytes[..40]).unwrap();
    cases.push((p, vec!["metadata count", "cannot fit"]));
    let p = tmp("bad-text.gguf");
    std::fs::write(&p, b"not a model, just text").unwrap();
    cases.push((p, vec!["not a GGUF"]));

    for (p, needles) in &cases {
        let e = err_of(&m, p);
        eprintln!("{}: {e}", p.display());
        assert!(e.contains(&p.display().to_string()), "error does not name the file: {e}");
        for n in needles {
            assert!(e.contains(n), "{}: error {e:?} lacks {n:?}", p.display());
        }
    }

    // Directories: none, one (used), several.
    let empty = tmp("dir-empty");
    std::fs::create_dir_all(&empty).unwrap();
    let e = err_of(&m, &empty);
    assert!(e.contains("no *.gguf") && e.contains("dir-empty"), "{e}");
    let one = tmp("dir-one");
    std::fs::create_dir_all(&one).unwrap();
    std::fs::copy(&good, one.join("head.gguf")).unwrap();
    assert_eq!(Mtp::open(&m, &one).unwrap().path, one.join("head.gguf"));
    std::fs::copy(&good, one.join("other.gguf")).unwrap();
    let e = err_of(&m, &one);
    assert!(e.contains("2 GGUF files") && e.contains("head.gguf"), "{e}");
    let e = err_of(&m, &tmp("no-such-file.gguf"));
    assert!(e.contains("no-such-file.gguf") && e.contains("not found"), "{e}");

    // The head given as the model: a typed error that says what it is.
    match Qwen4Exp::open(&good) {
        Err(EngineError::MtpOnly) => {}
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("MTP file loaded as a model"),
    }
}
