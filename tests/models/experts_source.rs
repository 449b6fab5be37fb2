//! The expert source against independent facts: a model written here from known f32 weights
//! (each expert's bytes must be exactly those weights), gguf-py's reading of the synthetic
//! fixtures (when the test-data venv exists), and every bad-input case of issue 12.

use std::path::{Path, PathBuf};

use quant::GgmlType;
use strata::experts::{ExpertError, ExpertSource, Residency, SourceOptions};

use crate::models::models_qwen3::qwen3_cfg;
use crate::models::models_util::{TinyCfg, TinyModel, reference};

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("strata-experts-{}-{name}", std::process::id()))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn moe_model() -> TinyModel {
    TinyModel::random(TinyCfg { moe: Some((8, 2)), n_ff: 64, n_layer: 3, ..qwen3_cfg() }, 7)
}

const MAPPED: SourceOptions = SourceOptions { mmap: true, ram_budget: None };

#[test]
fn experts_are_the_written_weights_mapped_and_in_ram() {
    let m = moe_model();
    let path = tmp("f32.gguf");
    m.write_gguf(&path, GgmlType::F32);
    for opts in [MAPPED, SourceOptions::default()] {
        let src = ExpertSource::open(&path, opts).unwrap();
        assert_eq!(src.residency(), if opts.mmap { Residency::Mapped } else { Residency::Ram });
        assert_eq!((src.n_layers(), src.n_expert(), src.dims()), (3, 8, (64, 64)));
        for (il, l) in m.layers.iter().enumerate() {
            for e in 0..8 {
                let x = src.expert(il, e).unwrap();
                assert_eq!((x.gate.rows, x.gate.cols, x.down.rows, x.down.cols), (64, 64, 64, 64));
                assert!(x.gate.data == f32_bytes(&l.gate[e]), "layer {il} expert {e} gate");
                assert!(x.up.data == f32_bytes(&l.up[e]), "layer {il} expert {e} up");
                assert!(x.down.data == f32_bytes(&l.down[e]), "layer {il} expert {e} down");
            }
        }
        let err = src.expert(3, 0).unwrap_err().to_string();
        assert!(err.contains("layer 3, expert 0") && err.contains("3 MoE layers of 8 experts"), "{err}");
        assert!(matches!(src.expert(0, 8), Err(ExpertError::OutOfRange { .. })));
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn quantized_experts_dequantize_to_the_written_weights() {
    let m = moe_model();
    let path = tmp("q8.gguf");
    m.write_gguf_mixed(&path, GgmlType::Q8_0, GgmlType::Q8_0);
    let src = ExpertSource::open(&path, MAPPED).unwrap();
    let x = src.expert(2, 5).unwrap();
    assert_eq!(x.gate.ty, GgmlType::Q8_0);
    let mut got = vec![0f32; 64 * 64];
    quant::dequantize_row(GgmlType::Q8_0, x.gate.data, &mut got).unwrap();
    let want = &m.layers[2].gate[5];
    let amax = want.iter().fold(0f32, |a, v| a.max(v.abs()));
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= amax / 127.0, "{g} vs {w}");
    }
    let _ = std::fs::remove_file(path);
}

/// gguf-py (llama.cpp's own reader) as the independent view of the fixtures: the bytes of a few
/// experts, hashed, must be the bytes the source serves. Skips when the venv of
/// scripts/make-testdata.sh is absent.
#[test]
fn experts_of_the_fixtures_match_gguf_py() {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/testdata-venv/bin/python");
    if !py.exists() {
        eprintln!("skipped: no {} (run scripts/make-testdata.sh)", py.display());
        return;
    }
    for (file, layer, experts) in [
        ("tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf", 1usize, [0usize, 5, 7]),
        ("tiny-qwen4exp/tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf", 3, [1, 2, 6]),
    ] {
        let path = reference(file);
        let src = ExpertSource::open(&path, MAPPED).unwrap();
        let block = src.block(layer).unwrap();
        let script = format!(
            "import gguf,hashlib,sys\nr=gguf.GGUFReader(sys.argv[1])\nt={{x.name:x for x in r.tensors}}\n\
             for e in {experts:?}:\n  for m in ('gate','up','down'):\n    d=t['blk.{block}.ffn_'+m+'_exps.weight'].data[e]\n    print(hashlib.sha256(d.tobytes()).hexdigest())\n"
        );
        let out = std::process::Command::new(&py).arg("-c").arg(&script).arg(&path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let want: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect();
        let mut got = Vec::new();
        for e in experts {
            let x = src.expert(layer, e).unwrap();
            for part in [x.gate, x.up, x.down] {
                got.push(sha256(part.data));
            }
        }
        assert_eq!(got, want, "{file}");
    }
}

fn sha256(b: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn bad_shards_are_precise_errors_and_the_source_reopens() {
    let m = moe_model();
    let path = tmp("bad.gguf");
    m.write_gguf(&path, GgmlType::F32);
    let good = std::fs::read(&path).unwrap();
    // Oversized: bytes appended after the last tensor.
    let mut long = good.clone();
    long.extend_from_slice(&[0u8; 4096]);
    std::fs::write(&path, &long).unwrap();
    let err = ExpertSource::open(&path, MAPPED).unwrap_err().to_string();
    assert!(err.contains(path.to_str().unwrap()) && err.contains("4096 bytes after the last tensor"), "{err}");
    // Truncated inside the experts: the reader names the file and the tensor.
    std::fs::write(&path, &good[..good.len() - 1000]).unwrap();
    let err = ExpertSource::open(&path, MAPPED).unwrap_err().to_string();
    assert!(err.contains(path.to_str().unwrap()) && err.contains("exps"), "{err}");
    // Restored: opens again (no state left behind by the errors).
    std::fs::write(&path, &good).unwrap();
    let src = ExpertSource::open(&path, MAPPED).unwrap();
    assert!(src.expert(1, 1).is_ok());
    // Truncated while in use: a mapped lookup is an error, not a SIGBUS.
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(good.len() as u64 / 2).unwrap();
    let err = src.expert(2, 7).unwrap_err().to_string();
    assert!(err.contains("truncated or rewritten while in use"), "{err}");
    drop(src);
    // A RAM copy too large for the budget names the flag to use instead.
    std::fs::write(&path, &good).unwrap();
    let err =
        ExpertSource::open(&path, SourceOptions { mmap: false, ram_budget: Some(1 << 10) }).unwrap_err().to_string();
    assert!(err.contains("--mmap-experts"), "{err}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn expert_shapes_must_agree_with_the_header() {
    // expert_feed_forward_length says 64; a model whose expert stacks are 32 wide disagrees.
    let m = TinyModel::random(TinyCfg { moe: Some((8, 2)), n_ff: 32, ..qwen3_cfg() }, 3);
    let path = tmp("shape.gguf");
    m.write_gguf(&path, GgmlType::F32);
    // Rewrite the file with a header that claims 64.
    let src = gguf::GgufFile::open(&path).unwrap();
    let mut w = gguf::GgufWriter::new();
    for (k, v) in src.metadata() {
        let v = if k == "qwen3moe.expert_feed_forward_length" { gguf::Value::U32(64) } else { v.clone() };
        w.add_metadata(k.clone(), v);
    }
    for t in src.tensors() {
        w.add_tensor(t.name.clone(), &t.dims, t.ty, src.tensor_data(t).to_vec());
    }
    let bad = tmp("shape-bad.gguf");
    w.write(&bad).unwrap();
    let err = ExpertSource::open(&bad, MAPPED).unwrap_err().to_string();
    assert!(
        err.contains("blk.0.ffn_gate_exps.weight") && err.contains("[64, 32, 8]") && err.contains("[64, 64, 8]"),
        "{err}"
    );
    let _ = (std::fs::remove_file(path), std::fs::remove_file(bad));
}
