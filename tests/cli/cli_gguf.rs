//! `strata gguf` end to end on the synthetic fixtures: the listing against facts written
//! independently (testdata/reference/README.md, the Python generator's tensor lists, file sizes,
//! ggml's block sizes), then damaged copies that `--check` must name by file, tensor and byte.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::support::strata_out as strata;
use serde_json::Value as Json;

const QWEN3MOE: &str = "tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf";
const SPLIT_1: &str = "tiny-qwen4exp/tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf";
const SPLIT_2: &str = "tiny-qwen4exp/tiny-qwen4exp-public-q8_0-split-00002-of-00002.gguf";

fn reference(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/reference")).join(rel)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run_ok(args: &[&str]) -> String {
    let out = strata(args);
    assert!(out.status.success(), "strata {args:?} failed:\n{}", text(&out.stderr));
    text(&out.stdout)
}

fn json_of(path: &Path) -> Json {
    serde_json::from_str(&run_ok(&["gguf", "--json", path.to_str().unwrap()])).expect("JSON")
}

/// `strata gguf --check` on a damaged file: exit status 1, the problems on stdout (returned),
/// and a summary naming the file on stderr.
fn check_fails(path: &Path) -> String {
    let out = strata(&["gguf", "--check", path.to_str().unwrap()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains(&path.display().to_string()) && stderr.contains("problem"), "{stderr}");
    stdout
}

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-cli-gguf-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A writable copy of a fixture in `dir`.
fn copy(rel: &str, dir: &Path) -> PathBuf {
    let to = dir.join(Path::new(rel).file_name().unwrap());
    std::fs::write(&to, std::fs::read(reference(rel)).unwrap()).unwrap();
    to
}

/// Bytes of a tensor by ggml's block layout (f32: 4 bytes per value; q8_0: 34 per 32 values).
fn ggml_bytes(ty: &str, n: u64) -> u64 {
    match ty {
        "f32" => 4 * n,
        "q8_0" => n / 32 * 34,
        other => panic!("unexpected type {other}"),
    }
}

/// Offset of a tensor info in the file: its name as a GGUF string (u64 length + bytes).
fn info_at(b: &[u8], name: &str) -> usize {
    let mut s = (name.len() as u64).to_le_bytes().to_vec();
    s.extend_from_slice(name.as_bytes());
    b.windows(s.len()).position(|w| w == s).unwrap_or_else(|| panic!("no tensor info {name}"))
}

/// Offsets of the fields after a tensor's name: (dims, type, data offset).
fn info_fields(b: &[u8], name: &str, n_dims: usize) -> (usize, usize, usize) {
    let dims = info_at(b, name) + 8 + name.len() + 4;
    (dims, dims + 8 * n_dims, dims + 8 * n_dims + 4)
}

fn tensors_by_name(j: &Json) -> HashMap<String, &Json> {
    j["tensors"].as_array().unwrap().iter().map(|t| (t["name"].as_str().unwrap().to_string(), t)).collect()
}

fn dims(v: &Json) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect()
}

#[test]
fn cli_gguf_help_explains_the_command() {
    assert!(run_ok(&["--help"]).contains("gguf"));
    let help = run_ok(&["gguf", "--help"]);
    for s in ["--check", "--json", "Exit status", "overlapping", "shard"] {
        assert!(help.contains(s), "gguf --help lacks {s}:\n{help}");
    }
}

#[test]
fn cli_gguf_lists_tiny_qwen3moe() {
    let path = reference(QWEN3MOE);
    let p = path.to_str().unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    let out = run_ok(&["gguf", p]);
    for line in ["version      3", "tensors      27", "alignment    32", &format!("size         {size} bytes")] {
        assert!(out.lines().any(|l| l == line), "no line {line:?} in:\n{out}");
    }
    // SmolLM2's vocabulary cut to 1024 tokens, abbreviated.
    let tokens = out.lines().find(|l| l.trim_start().starts_with("tokenizer.ggml.tokens ")).unwrap();
    assert!(tokens.contains(r#"[1024 strings: "<|endoftext|>", "<|im_start|>", "<|im_end|>", ...]"#), "{tokens}");
    assert!(out.contains(r#""qwen3moe""#));
    let row = out.lines().find(|l| l.trim_start().starts_with("blk.1.ffn_down_exps.weight ")).unwrap();
    assert!(row.contains("q8_0") && row.contains("[128, 256, 8]") && row.ends_with(" 278528"), "{row}");
    assert!(run_ok(&["gguf", "--check", p]).contains("OK"));

    // README: 2 layers, hidden 256, 4 heads / 2 KV heads of 64, 8 experts, expert FFN 128,
    // vocabulary 1024.
    let (h, q, kv, e, ff, vocab) = (256u64, 4 * 64, 2 * 64, 8, 128, 1024);
    let mut want: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![h, vocab]),
        ("output_norm.weight".into(), vec![h]),
        ("output.weight".into(), vec![h, vocab]),
    ];
    for l in 0..2 {
        for (n, d) in [
            ("attn_norm", vec![h]),
            ("attn_q", vec![h, q]),
            ("attn_k", vec![h, kv]),
            ("attn_v", vec![h, kv]),
            ("attn_output", vec![q, h]),
            ("attn_q_norm", vec![64]),
            ("attn_k_norm", vec![64]),
            ("ffn_norm", vec![h]),
            ("ffn_gate_inp", vec![h, e]),
            ("ffn_gate_exps", vec![h, ff, e]),
            ("ffn_up_exps", vec![h, ff, e]),
            ("ffn_down_exps", vec![ff, h, e]),
        ] {
            want.push((format!("blk.{l}.{n}.weight"), d));
        }
    }
    let j = json_of(&path);
    assert_eq!(j["ok"], true);
    let file = &j["files"][0];
    assert_eq!(
        (file["version"].as_u64(), file["size"].as_u64(), file["alignment"].as_u64()),
        (Some(3), Some(size), Some(32))
    );
    let data = file["data_offset"].as_u64().unwrap();
    let by_name = tensors_by_name(&j);
    assert_eq!(by_name.len(), want.len());
    let mut spans = Vec::new();
    for (name, d) in &want {
        let t = by_name.get(name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(&dims(&t["shape"]), d, "{name}");
        let n: u64 = d.iter().product();
        let bytes = t["bytes"].as_u64().unwrap();
        assert_eq!(bytes, ggml_bytes(t["type"].as_str().unwrap(), n), "{name}");
        let at = t["file_offset"].as_u64().unwrap();
        assert_eq!((at, at % 32), (data + t["offset"].as_u64().unwrap(), 0), "{name}");
        spans.push((at, at + bytes));
    }
    spans.sort();
    assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0) && spans.last().unwrap().1 <= size);
    let meta = j["metadata"].as_array().unwrap();
    let tokens = meta.iter().find(|m| m["key"] == "tokenizer.ggml.tokens").unwrap();
    assert_eq!((tokens["type"].as_str(), tokens["value"].as_array().unwrap().len()), (Some("[string]"), 1024));
    let experts = meta.iter().find(|m| m["key"] == "qwen3moe.expert_count").unwrap();
    assert_eq!(experts["value"], 8);
}

#[test]
fn cli_gguf_lists_every_shard_of_tiny_qwen4exp() {
    let (first, second) = (reference(SPLIT_1), reference(SPLIT_2));
    let sizes = [&first, &second].map(|p| std::fs::metadata(p).unwrap().len());
    // Either shard names the model.
    let out = run_ok(&["gguf", second.to_str().unwrap()]);
    assert!(out.contains(&format!("shards (2, 113 tensors, {} bytes)", sizes[0] + sizes[1])), "{out}");
    let shard_rows: Vec<&str> = out.lines().filter(|l| l.contains("-of-00002.gguf") && l.contains("tensor")).collect();
    assert_eq!(shard_rows.len(), 2, "{out}");
    assert!(
        shard_rows[0].contains(SPLIT_1) && shard_rows[0].contains(&format!(" {} bytes", sizes[0])),
        "{}",
        shard_rows[0]
    );
    assert!(
        shard_rows[1].contains(SPLIT_2)
            && shard_rows[1].contains(" 1 tensor ")
            && shard_rows[1].contains(&format!(" {} bytes", sizes[1])),
        "{}",
        shard_rows[1]
    );
    assert!(run_ok(&["gguf", "--check", first.to_str().unwrap()]).contains("2 files, 113 tensors"));

    let j = json_of(&first);
    assert_eq!(j["ok"], true);
    let files = j["files"].as_array().unwrap();
    assert_eq!(files.len(), 2);
    for (f, size) in files.iter().zip(sizes) {
        assert_eq!(f["size"].as_u64(), Some(size));
    }
    // The generator's own list: names, ggml dims and types; the PLE table alone in shard 2.
    let gen_json: Json = serde_json::from_str(
        &std::fs::read_to_string(reference("tiny-qwen4exp/tiny-qwen4exp-public-q8_0-split.json")).unwrap(),
    )
    .unwrap();
    let by_name = tensors_by_name(&j);
    let list = gen_json["tensors"].as_array().unwrap();
    assert_eq!(by_name.len(), list.len());
    for e in list {
        let name = e[0].as_str().unwrap();
        let t = by_name.get(name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(dims(&t["shape"]), dims(&e[1]), "{name}");
        assert_eq!(t["type"].as_str().unwrap().to_ascii_uppercase(), e[2].as_str().unwrap(), "{name}");
        let n: u64 = dims(&e[1]).iter().product();
        assert_eq!(t["bytes"].as_u64().unwrap(), ggml_bytes(t["type"].as_str().unwrap(), n), "{name}");
        assert_eq!(t["shard"].as_u64(), Some(if name == "per_layer_token_embd.weight" { 2 } else { 1 }), "{name}");
    }
    let keys: Vec<&str> = j["metadata"].as_array().unwrap().iter().map(|m| m["key"].as_str().unwrap()).collect();
    for k in gen_json["keys"].as_array().unwrap() {
        assert!(keys.contains(&k.as_str().unwrap()), "no key {k}");
    }
    // Same names and shapes as the f32 model's list ("   name [d0, d1] F32" lines).
    let listed = std::fs::read_to_string(reference("tiny-qwen4exp/tiny-qwen4exp-public-f32.tensors.txt")).unwrap();
    let mut n = 0;
    for line in listed.lines().filter(|l| l.starts_with("   ")) {
        let (name, rest) = line.trim().split_once(' ').unwrap();
        let shape = rest.rsplit_once(' ').unwrap().0;
        let t = by_name.get(name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(serde_json::to_string(&t["shape"]).unwrap(), shape.replace(' ', ""), "{name}");
        n += 1;
    }
    assert_eq!(n, 113);
}

#[test]
fn cli_gguf_check_names_each_defect() {
    let d = tmp_dir("defects");
    let size = std::fs::metadata(reference(QWEN3MOE)).unwrap().len();

    // Cut short inside the last tensor (278528 bytes of q8_0 ending the file).
    let cut = copy(QWEN3MOE, &d);
    let b = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &b[..b.len() - 1000]).unwrap();
    let out = check_fails(&cut);
    let want = format!(
        "{}: tensor \"blk.1.ffn_down_exps.weight\": data [{}, {size}) lies outside the file ({} bytes)",
        cut.display(),
        size - 278528,
        size - 1000
    );
    assert_eq!(out.trim(), want);
    // The listing still shows the file, and says on stderr what is wrong.
    let list = strata(&["gguf", cut.to_str().unwrap()]);
    assert_eq!(list.status.code(), Some(1));
    assert!(text(&list.stdout).contains("blk.1.ffn_down_exps.weight") && text(&list.stderr).contains(&want));

    // Three tensor infos damaged at once: all three are named with their info's byte offset.
    let bad = copy(QWEN3MOE, &d);
    let mut b = std::fs::read(&bad).unwrap();
    let (_, _, off_q) = info_fields(&b, "blk.0.attn_q.weight", 2);
    let off = u64::from_le_bytes(b[off_q..off_q + 8].try_into().unwrap());
    b[off_q..off_q + 8].copy_from_slice(&(off + 4).to_le_bytes());
    let (_, ty_k, _) = info_fields(&b, "blk.1.attn_k.weight", 2);
    b[ty_k..ty_k + 4].copy_from_slice(&99u32.to_le_bytes());
    let (dims_v, _, _) = info_fields(&b, "blk.0.attn_v.weight", 2);
    b[dims_v..dims_v + 8].copy_from_slice(&250u64.to_le_bytes());
    let at = |name: &str| info_at(&b, name);
    let (q, k, v) = (at("blk.0.attn_q.weight"), at("blk.1.attn_k.weight"), at("blk.0.attn_v.weight"));
    std::fs::write(&bad, &b).unwrap();
    let out = check_fails(&bad);
    let f = bad.display();
    for want in [
        format!(
            "{f}: tensor \"blk.0.attn_q.weight\" at byte {q}: data offset {} is not a multiple of the alignment 32",
            off + 4
        ),
        format!("{f}: tensor \"blk.1.attn_k.weight\" at byte {k}: unknown ggml type 99"),
        format!(
            "{f}: tensor \"blk.0.attn_v.weight\" at byte {v}: bad shape [250, 128]: row length 250 is not a multiple of the q8_0 block size 32"
        ),
        // Moved by 4 bytes, attn_q now runs into attn_k.
        format!("{f}: tensors \"blk.0.attn_q.weight\" and \"blk.0.attn_k.weight\" overlap at byte"),
    ] {
        assert!(out.contains(&want), "no {want:?} in:\n{out}");
    }
    assert_eq!(out.lines().count(), 4, "{out}");
    let j: Json =
        serde_json::from_slice(&strata(&["gguf", "--check", "--json", bad.to_str().unwrap()]).stdout).unwrap();
    let kinds: Vec<&str> = j["problems"].as_array().unwrap().iter().map(|p| p["kind"].as_str().unwrap()).collect();
    // File order: blk.0.attn_q, blk.0.attn_v, blk.1.attn_k; overlaps last.
    assert_eq!(
        (j["ok"].as_bool(), kinds),
        (Some(false), vec!["misaligned", "bad_shape", "unknown_tensor_type", "overlap"])
    );

    // Two tensors with one name.
    let dup = copy(QWEN3MOE, &d);
    let mut b = std::fs::read(&dup).unwrap();
    let k_norm = info_at(&b, "blk.0.attn_k_norm.weight");
    b[k_norm + 8 + "blk.0.attn_".len()] = b'q';
    std::fs::write(&dup, &b).unwrap();
    let out = check_fails(&dup);
    assert_eq!(
        out.trim(),
        format!("{}: duplicate tensor name \"blk.0.attn_q_norm.weight\" (info at byte {k_norm})", dup.display())
    );

    // Not GGUF at all, and a header cut short.
    let junk = d.join("junk.gguf");
    std::fs::write(&junk, b"hello, world").unwrap();
    assert!(check_fails(&junk).contains("not a GGUF file"));
    std::fs::write(&junk, &std::fs::read(reference(QWEN3MOE)).unwrap()[..20]).unwrap();
    assert!(check_fails(&junk).contains("truncated: metadata count needs 8 bytes at byte 16, file has 20"));
}

#[test]
fn cli_gguf_check_finds_missing_extra_and_damaged_shards() {
    let d = tmp_dir("shards");
    let first = copy(SPLIT_1, &d);
    let second = copy(SPLIT_2, &d);
    run_ok(&["gguf", "--check", first.to_str().unwrap()]);

    // The PLE table's shard cut short.
    let b = std::fs::read(&second).unwrap();
    std::fs::write(&second, &b[..b.len() - 64]).unwrap();
    let out = check_fails(&first);
    assert!(out.starts_with(&format!("{}: tensor \"per_layer_token_embd.weight\": data [", second.display())), "{out}");
    assert!(out.contains(&format!("lies outside the file ({} bytes)", b.len() - 64)), "{out}");

    std::fs::remove_file(&second).unwrap();
    let out = check_fails(&first);
    assert_eq!(
        out.trim(),
        format!("{}: split: shard 2 of 2 is missing (the model was named by {})", second.display(), first.display())
    );
    // Listing still shows the shard that is there.
    assert!(text(&strata(&["gguf", first.to_str().unwrap()]).stdout).contains("unreadable"));

    std::fs::write(&second, &b).unwrap();
    let stale = d.join("tiny-qwen4exp-public-q8_0-split-00003-of-00003.gguf");
    std::fs::write(&stale, &b).unwrap();
    let out = check_fails(&second);
    assert!(out.trim().starts_with(&format!("{}: split: extra shard: named shard 3 of 3", stale.display())), "{out}");
}
