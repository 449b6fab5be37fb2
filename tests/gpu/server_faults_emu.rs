//! Fault injection on the real engine running on the software device (`--device emu`); the CPU
//! runs, and the helpers used here: cli/server_faults.rs.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cli::server_faults::{Serve, tmp_dir, trunk_and_table};
use crate::models::models_util::{ids, read_json};

/// On the device (`--device emu`) a decode window's PLE rows are read by a host thread while the
/// window runs and reach it through a mailbox at the PLE layer (gpu/qwen4exp/ple_feed.rs). A
/// table truncated mid-run fails that request with an error naming the file, promptly (the
/// device is answered, nothing waits for rows that never come); the engine keeps serving, and
/// once the table is whole again the answer is the first run's.
#[test]
fn ple_table_truncated_mid_run_on_the_device() {
    let d = tmp_dir("ple-device");
    let (trunk, table) = trunk_and_table(&d);
    let r = read_json("tiny-qwen4exp/ref/q8_0-split/ref.json");
    // A 5-token prompt runs as a window (not a prompt chunk): every read goes through the feed.
    let toks = ids(&r["sequences"][0]["token_ids"])[..5].to_vec();
    let args = [
        "-m",
        trunk.to_str().unwrap(),
        "--ple-gguf",
        table.to_str().unwrap(),
        "--ple-io",
        "direct",
        "--ple-cache-mb",
        "0",
        "--device",
        "emu",
    ];
    let mut e = Serve::start(&args);
    let (first, done) = e.generate(1, &toks, 6).unwrap();
    assert_eq!((first.len(), &done["reason"]), (6, &json!("length")), "{done}");
    let saved = std::fs::read(&table).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&table).unwrap();
    f.set_len(4096).unwrap();
    let start = Instant::now();
    let (got, done) = e.generate(2, &toks, 6).expect("engine alive after the table was truncated");
    assert_eq!(done["reason"], "error", "truncated table: {done} after {got:?}");
    let msg = done["error"].as_str().unwrap_or("");
    assert!(msg.contains("ple-table.gguf") && msg.contains("PLE"), "{msg}");
    assert!(start.elapsed() < Duration::from_secs(60), "the failed request took {:?}", start.elapsed());
    f.set_len(0).unwrap();
    drop(f);
    std::fs::OpenOptions::new().write(true).open(&table).unwrap().write_all(&saved).unwrap();
    let (got, done) = e.generate(3, &toks, 6).expect("engine alive");
    assert_eq!((got.as_slice(), &done["reason"]), (&first[..], &json!("length")), "restored: {done}");
    drop(e);
    let _ = std::fs::remove_dir_all(&d);
}
