//! Bad input from the command line (issue 14 items 6 and 7), end to end through the `strata`
//! binary: a model path that is not a file, GGUF errors (said once), NaN and out-of-range
//! metadata (refused at load, naming the key), NaN block scales (refused at load, naming the
//! tensor and block), NaN f32 weights (an error naming the position, and with
//! STRATA_CHECK_FINITE=1 the layer), and bytes that are not UTF-8 on `--serve`'s stdin.
//! The bad models are the synthetic fixture rewritten with one thing changed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::strata_cmd as strata;
use gguf::{GgufFile, GgufWriter, Value};

/// The tiny qwen3moe model (1024 tokens, q8_0), from scripts/make-testdata.sh.
pub(crate) fn fixture() -> PathBuf {
    let p = crate::models::models_util::reference("tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf");
    assert!(p.is_file(), "missing {} (scripts/make-testdata.sh)", p.display());
    p
}

fn tmp(name: &str) -> PathBuf {
    crate::support::scratch_dir("bad-input").join(name)
}

/// The fixture with metadata `key` set to `value` (None: removed), tensors patched (shape and
/// bytes).
pub(crate) fn rewrite(
    name: &str,
    edits: &[(&str, Option<Value>)],
    patch: impl Fn(&str, &mut Vec<u64>, &mut Vec<u8>),
) -> PathBuf {
    let g = GgufFile::open(&fixture()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        match edits.iter().find(|(e, _)| e == k) {
            Some((_, Some(nv))) => w.add_metadata(k.clone(), nv.clone()),
            Some((_, None)) => &mut w,
            None => w.add_metadata(k.clone(), v.clone()),
        };
    }
    for (k, v) in edits {
        if g.get(k).is_none()
            && let Some(v) = v
        {
            w.add_metadata(k.to_string(), v.clone());
        }
    }
    for t in g.tensors() {
        let (mut dims, mut d) = (t.dims.clone(), g.tensor_data(t).to_vec());
        patch(&t.name, &mut dims, &mut d);
        w.add_tensor(t.name.clone(), &dims, t.ty, d);
    }
    let p = tmp(name);
    w.write(&p).unwrap();
    p
}

/// Runs `strata ARGS`, expects exit status 1 and no panic; returns stderr.
pub(crate) fn fails(args: &[&str]) -> String {
    let o = strata().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "strata {args:?}: {o:?}");
    assert!(!err.contains("panicked"), "strata {args:?}: {err}");
    err
}

fn gen_args(model: &Path, tokens: &str) -> Vec<String> {
    ["generate", "-m", model.to_str().unwrap(), "--tokens", tokens, "-n", "4", "--temp", "0"].map(String::from).to_vec()
}

pub(crate) fn fails_gen(model: &Path, tokens: &str) -> String {
    let a = gen_args(model, tokens);
    fails(&a.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn model_path_that_is_not_a_file_says_what_it_is() {
    let d = tmp("a-directory");
    std::fs::create_dir_all(&d).unwrap();
    let fifo = tmp("a-fifo");
    let _ = std::fs::remove_file(&fifo);
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let link = tmp("a-dangling-link");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("/nonexistent/model.gguf", &link).unwrap();
    let cases = [
        (d.clone(), "is a directory, not a GGUF file"),
        (fifo.clone(), "is a FIFO (named pipe), not a regular file"),
        (link.clone(), "is a symbolic link to /nonexistent/model.gguf, which does not exist"),
        (PathBuf::from("/nonexistent/model.gguf"), "not found (nor is it a model name of `strata fetch --list`)"),
    ];
    for (p, want) in cases {
        let err = fails(&["generate", "-m", p.to_str().unwrap(), "-p", "hi", "-n", "1"]);
        assert!(err.contains(&format!("model file {} {want}", p.display())), "{err}");
    }
}

#[test]
fn gguf_errors_are_printed_once() {
    let bytes = std::fs::read(fixture()).unwrap();
    let cut = tmp("truncated.gguf");
    std::fs::write(&cut, &bytes[..5000]).unwrap();
    let err = fails_gen(&cut, "1,2");
    let msg = "array of key \"tokenizer.ggml.tokens\" at byte 905: count 1024 cannot fit in the 4095 bytes left";
    assert_eq!(err.matches(msg).count(), 1, "{err}");
    assert_eq!(err.trim_end(), format!("error: loading {p}: {p}: {msg}", p = cut.display()));
    let text = tmp("not-a-model.txt");
    std::fs::write(&text, "just some text, no GGUF magic here\n").unwrap();
    let err = fails_gen(&text, "1");
    assert_eq!(err.matches("not a GGUF file (magic 0x7473756a at byte 0)").count(), 1, "{err}");
}

#[test]
fn nan_and_out_of_range_metadata_is_refused_at_load() {
    let cases: [(&str, Value, &str); 7] = [
        ("qwen3moe.attention.layer_norm_rms_epsilon", Value::F32(f32::NAN), "NaN is not a finite number"),
        (
            "qwen3moe.attention.layer_norm_rms_epsilon",
            Value::F32(-1e-6),
            "-0.000001 is not a usable RMS norm epsilon (a finite number in (0, 1)",
        ),
        ("qwen3moe.rope.freq_base", Value::F32(f32::NAN), "NaN is not a finite number"),
        ("qwen3moe.rope.freq_base", Value::F32(-1.0), "-1 is not a usable rope frequency base (a finite number > 1"),
        ("qwen3moe.rope.freq_base", Value::F32(0.0), "0 is not a usable rope frequency base"),
        (
            "tokenizer.ggml.bos_token_id",
            Value::U32(999_999),
            "token id 999999 is out of range (the vocabulary has 1024 tokens)",
        ),
        (
            "tokenizer.ggml.eos_token_id",
            Value::Str("two".into()),
            "must be a token id (an unsigned integer), not a string",
        ),
    ];
    for (i, (key, value, want)) in cases.into_iter().enumerate() {
        let p = rewrite(&format!("meta-{i}.gguf"), &[(key, Some(value))], |_, _, _| {});
        let err = fails_gen(&p, "1,2");
        assert!(err.contains(key) && err.contains(want), "{key}: {err}");
    }
}

#[test]
fn wrong_types_missing_keys_and_a_vocab_mismatch_are_refused_at_load() {
    let p = rewrite("type.gguf", &[("qwen3moe.block_count", Some(Value::Str("two".into())))], |_, _, _| {});
    let err = fails_gen(&p, "1,2");
    assert_eq!(
        err.trim_end(),
        format!(
            "error: loading {p}: {p}: metadata key \"qwen3moe.block_count\": expected an integer that fits in u32, found string \"two\"",
            p = p.display()
        )
    );
    let p = rewrite("nohead.gguf", &[("qwen3moe.attention.head_count", None)], |_, _, _| {});
    let err = fails_gen(&p, "1,2");
    assert!(err.contains("metadata key \"qwen3moe.attention.head_count\" not found"), "{err}");
    // 1000 embedding and output rows for the tokenizer's 1024 tokens (llama.cpp refuses it too).
    let p = rewrite("vocab.gguf", &[], |name, dims, d| {
        if name == "token_embd.weight" || name == "output.weight" {
            dims[1] = 1000;
            d.truncate(1000 * 8 * 34);
        }
    });
    let err = fails_gen(&p, "1,2");
    assert!(
        err.contains("vocabulary mismatch: the tokenizer has 1024 tokens but token_embd.weight has 1000 rows"),
        "{err}"
    );
}

/// Row `row` of the q8_0 `token_embd.weight` (256 columns: 8 blocks of 34 bytes, f16 scale
/// first) with every block scale NaN.
fn nan_row(row: usize) -> impl Fn(&str, &mut Vec<u64>, &mut Vec<u8>) {
    move |name, _, d| {
        if name == "token_embd.weight" {
            for b in 0..8 {
                let at = row * 8 * 34 + b * 34;
                d[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
            }
        }
    }
}

/// The fixture with `token_embd.weight` widened to f32 and row `row` NaN: plain float weights
/// have no block scales for the load check, so the NaN reaches the forward pass.
fn nan_row_f32(name: &str, row: usize) -> PathBuf {
    let g = GgufFile::open(&fixture()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add_metadata(k.clone(), v.clone());
    }
    for t in g.tensors() {
        let d = g.tensor_data(t);
        if t.name != "token_embd.weight" {
            w.add_tensor(t.name.clone(), &t.dims, t.ty, d.to_vec());
            continue;
        }
        let mut x = vec![0f32; t.n_elements() as usize];
        quant::dequantize_row(t.ty, d, &mut x).unwrap();
        let cols = t.dims[0] as usize;
        x[row * cols..(row + 1) * cols].fill(f32::NAN);
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.add_tensor(t.name.clone(), &t.dims, quant::GgmlType::F32, bytes);
    }
    let p = tmp(name);
    w.write(&p).unwrap();
    p
}

/// A NaN block scale is refused at load (issue 36), naming the tensor and the block: row 5's
/// first block is block 40.
#[test]
fn a_nan_block_scale_is_refused_at_load_naming_tensor_and_block() {
    let p = rewrite("nan-embd-scales-row-5.gguf", &[], nan_row(5));
    let err = fails_gen(&p, "3,7");
    assert!(
        err.contains("tensor 'token_embd.weight': block 40 has a NaN scale (d), at byte 1360 of its q8_0 data"),
        "{err}"
    );
}

#[test]
fn nan_weights_are_an_error_naming_the_position() {
    let p = nan_row_f32("nan-embd-row-5.gguf", 5);
    // The prompt does not use row 5: the model runs.
    let ok = strata().args(gen_args(&p, "3,7")).output().unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    // It does: greedy decoding used to pick token 0 from all-NaN logits and exit 0. The NaN of
    // position 1 reaches the last position's logits through attention.
    let err = fails_gen(&p, "3,5,7");
    assert!(err.contains("non-finite logits at position 2 (token 7): 1024 of 1024 values are NaN or infinite; the model's weights or metadata hold NaN or infinity (STRATA_CHECK_FINITE=1 names the first layer that produces one)"), "{err}");
    // Every position's logits: the first bad one is the token itself.
    let npy = tmp("nan.npy");
    let err = fails(&["logits", "-m", p.to_str().unwrap(), "--tokens", "3,5,7", "--out", npy.to_str().unwrap()]);
    assert!(err.contains("non-finite logits at position 1 (token 5)"), "{err}");
    // The per-layer scan names the layer and position where it starts.
    let a = gen_args(&p, "3,5,7");
    let o = strata().args(&a).env("STRATA_CHECK_FINITE", "1").output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("non-finite values in the residual stream after layer 0 at position 1 (token 5): 256 of 256 values are NaN or infinite"), "{err}");
}

fn serve(model: &Path, input: &[u8]) -> (Vec<serde_json::Value>, std::process::Output) {
    let mut child = strata()
        .args(["--serve", "-m", model.to_str().unwrap(), "--max-context", "64"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let o = child.wait_with_output().unwrap();
    let lines = String::from_utf8(o.stdout.clone())
        .expect("engine output is UTF-8")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    (lines, o)
}

fn done(lines: &[serde_json::Value], id: u64) -> &serde_json::Value {
    let d: Vec<_> = lines.iter().filter(|l| l["type"] == "done" && l["id"] == id).collect();
    assert_eq!(d.len(), 1, "one done for {id}: {lines:?}");
    d[0]
}

#[test]
fn serve_answers_a_line_that_is_not_utf8_and_goes_on() {
    let req = |id: u32| {
        format!(
            "{{\"type\":\"generate\",\"id\":{id},\"tokens\":[1,2],\"max_tokens\":2,\"sampling\":{{\"temperature\":0}}}}\n"
        )
    };
    let mut input = req(1).into_bytes();
    input.extend_from_slice(b"\xff\n");
    input.extend_from_slice(req(2).as_bytes());
    let (lines, o) = serve(&fixture(), &input);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(lines[0]["type"], "hello");
    for id in [1, 2] {
        assert_eq!(done(&lines, id)["generated_tokens"], 2, "{lines:?}");
    }
    let errors: Vec<_> = lines.iter().filter(|l| l["type"] == "error").collect();
    assert_eq!(errors.len(), 1, "{lines:?}");
    assert_eq!(errors[0]["error"], "malformed request: the line is not valid UTF-8 (byte 0xff at offset 0)");
}

#[test]
fn serve_fails_a_request_with_nan_logits_and_serves_the_next() {
    let p = nan_row_f32("nan-embd-row-5-serve.gguf", 5);
    let input = concat!(
        "{\"type\":\"generate\",\"id\":1,\"tokens\":[3,5,7],\"max_tokens\":2}\n",
        "{\"type\":\"generate\",\"id\":2,\"tokens\":[3,7],\"max_tokens\":2,\"sampling\":{\"temperature\":0}}\n",
        "{\"type\":\"generate\",\"id\":3,\"tokens\":[1],\"max_tokens\":-5}\n",
    );
    let (lines, o) = serve(&p, input.as_bytes());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d = done(&lines, 1);
    assert_eq!(d["reason"], "error");
    assert!(d["error"].as_str().unwrap().starts_with("non-finite logits at position 2 (token 7)"), "{d}");
    assert_eq!(done(&lines, 2)["generated_tokens"], 2);
    assert_eq!(
        done(&lines, 3)["error"],
        "malformed request: field `max_tokens`: invalid value: integer `-5`, expected u32"
    );
}

/// A token-id file that is not one (`--tokens-file`, for prompts too long for the command
/// line) is an error naming the file and the byte offset, or the id outside the vocabulary;
/// the flags that cannot go together are refused by the parser.
#[test]
fn bad_token_files_name_the_file_and_offset() {
    let p = fixture();
    let m = p.to_str().unwrap();
    let npy = tmp("ids.npy");
    let npy = npy.to_str().unwrap();
    let cases: [(&str, &str, &str); 4] = [
        ("ids-letter.txt", "1, 2,\n3 x", "byte 8: 'x' where a token id was expected"),
        ("ids-vocab.txt", "1 2 1024", "byte 4: token id 1024 is outside the vocabulary of 1024"),
        ("ids-empty.txt", " \n", "no token ids in the file"),
        ("ids-commas.txt", "[1,,2]", "byte 3: a comma with no token id before it"),
    ];
    for (name, text, want) in cases {
        let f = tmp(name);
        std::fs::write(&f, text).unwrap();
        let f = f.to_str().unwrap();
        for cmd in ["logits", "generate"] {
            let mut args = vec![cmd, "-m", m, "--tokens-file", f];
            args.extend(if cmd == "logits" { ["--out", npy] } else { ["-n", "1"] });
            let err = fails(&args);
            assert!(err.contains(&format!("{f}: {want}")), "{cmd} {text:?}: {err}");
        }
    }
    let missing = tmp("no-such-ids.txt");
    let err = fails(&["perplexity", "-m", m, "--tokens-file", missing.to_str().unwrap()]);
    assert!(err.contains("no-such-ids.txt"), "{err}");
    let o =
        strata().args(["logits", "-m", m, "--tokens", "1,2", "--tokens-file", "x.txt", "--out", npy]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--tokens-file") && err.contains("cannot be used with"), "{err}");
    let err = fails(&["logits", "-m", m, "--tokens", "1,1024", "--out", npy]);
    assert!(err.contains("--tokens: id 1024 (number 2) is outside the vocabulary of 1024"), "{err}");
}

/// The fixture with `blk.0.attn_q.weight` ([256][256]) as `ty` blocks from `blocks` (one per
/// row), and the same model with that tensor as the f32 values `quant` dequantizes them to
/// (checked byte for byte against gguf-py by the quant vectors).
fn with_low_bit_tensor(ty: quant::GgmlType, blocks: &[u8]) -> (PathBuf, PathBuf) {
    let g = GgufFile::open(&fixture()).unwrap();
    let mut out = Vec::new();
    for as_f32 in [false, true] {
        let mut w = GgufWriter::new();
        for (k, v) in g.metadata() {
            w.add_metadata(k.clone(), v.clone());
        }
        for t in g.tensors() {
            if t.name == "blk.0.attn_q.weight" {
                assert_eq!(t.dims, vec![256, 256]);
                if as_f32 {
                    let mut f = vec![0f32; 256 * 256];
                    quant::dequantize_row(ty, blocks, &mut f).unwrap();
                    w.add_tensor(
                        t.name.clone(),
                        &t.dims,
                        quant::GgmlType::F32,
                        f.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
                    );
                } else {
                    w.add_tensor(t.name.clone(), &t.dims, ty, blocks.to_vec());
                }
            } else {
                w.add_tensor(t.name.clone(), &t.dims, t.ty, g.tensor_data(t).to_vec());
            }
        }
        let p = tmp(&format!("attn-q-{}{}.gguf", ty.name(), if as_f32 { "-as-f32" } else { "" }));
        w.write(&p).unwrap();
        out.push(p);
    }
    (out.remove(0), out.remove(0))
}

/// A weight type the CPU runs and the device has no kernel for yet (Q2_K here; issue 36) runs
/// on `--device cpu`, close to the same weights dequantized to f32 (the CPU's Q2_K dot reads
/// Q8_K activations: same argmax at every position, logits within 2% of their range), and on
/// `--device emu` it is refused naming the tensor and the type, never widened to f32.
#[test]
fn low_bit_types_run_on_the_cpu_and_are_refused_on_the_device() {
    // Q2_K blocks: 16 scale/min bytes and 64 bytes of 2-bit weights from a fixed LCG, then
    // d = 0.02 and dmin = 0.005 (f16).
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut byte = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 56) as u8
    };
    let mut blocks = Vec::with_capacity(256 * 84);
    for _ in 0..256 {
        blocks.extend((0..80).map(|_| byte()));
        blocks.extend_from_slice(&0x251f_u16.to_le_bytes());
        blocks.extend_from_slice(&0x1d1f_u16.to_le_bytes());
    }
    let (q2, f32m) = with_low_bit_tensor(quant::GgmlType::Q2K, &blocks);
    let logits = |m: &Path, device: &str| {
        let npy = tmp(&format!("{}-{device}.npy", m.file_stem().unwrap().to_str().unwrap()));
        let args = ["logits", "-m", m.to_str().unwrap(), "--tokens", "3,5,7,11,13", "--device", device];
        let o = strata().args(args).args(["--out", npy.to_str().unwrap()]).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        strata::npy::read_f32(&npy).unwrap().1
    };
    let (got, want) = (logits(&q2, "cpu"), logits(&f32m, "cpu"));
    let range = want.iter().fold(0f32, |a, &b| a.max(b.abs()));
    let argmax = |r: &[f32]| r.iter().enumerate().fold(0, |b, (i, &x)| if x > r[b] { i } else { b });
    for (pos, (g, w)) in got.chunks(1024).zip(want.chunks(1024)).enumerate() {
        assert_eq!(argmax(g), argmax(w), "position {pos}");
        let max = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(max <= 0.02 * range, "position {pos}: max |diff| {max} of range {range}");
    }
    let npy = tmp("q2k-emu.npy");
    let err = fails(&[
        "logits",
        "-m",
        q2.to_str().unwrap(),
        "--tokens",
        "3,5",
        "--device",
        "emu",
        "--out",
        npy.to_str().unwrap(),
    ]);
    assert!(
        err.contains(
            "tensor 'blk.0.attn_q.weight': type q2_K is not supported here (no gfx1100 kernel yet; the CPU runs it: --device cpu)"
        ),
        "{err}"
    );
}
