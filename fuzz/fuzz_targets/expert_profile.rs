//! The engine's expert-profile reader (`--expert-profile FILE`, the STRP v1 format of
//! `experts::profile`, from the `experts` crate, which spares the fuzz build the engine
//! library): fuzzed bytes through `Profile::parse`. Properties: no panic,
//! no allocation beyond what the file's length allows (the header's counts are checked
//! against the length first); a profile that parses is internally consistent (ranked entries
//! inside n_layers x n_expert, a table of n_layers x n_expert entries) and writes back
//! byte for byte (`to_bytes`); `check_model` accepts exactly its own shape.
//!
//! Input: profile bytes.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

use experts::profile::{Profile, Table};

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.strp");
    match Profile::parse(path, data) {
        Err(e) => {
            let _ = e.to_string();
        }
        Ok(p) => {
            let cells = p.n_layers as usize * p.n_expert as usize;
            let n = match &p.table {
                Table::Frequency(v) => v.len(),
                Table::Rank(v) => {
                    assert!(v.iter().all(|&r| r >= -1 && (r as i64) < cells as i64));
                    v.len()
                }
            };
            assert_eq!(n, cells);
            assert!(p.ranked.len() <= cells);
            assert!(p.ranked.iter().all(|&(l, e)| (l as u32) < p.n_layers && (e as u32) < p.n_expert));
            assert_eq!(p.to_bytes(), data, "a parsed profile must write back byte for byte");
            assert!(p.check_model(path, p.n_layers as usize, p.n_expert as usize).is_ok());
            assert!(p.check_model(path, p.n_layers as usize + 1, p.n_expert as usize).is_err());
        }
    }
});
