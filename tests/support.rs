//! Test support shared by the test modules: the `strata` binary under test and per-process
//! scratch directories. (Reference data and the fetched models: `models_util`; the device
//! list: `strata::test_device!`; random data: `strata::rng::SplitMix64`.)

use std::path::PathBuf;
use std::process::{Command, Output};

/// The `strata` binary cargo built for these tests.
pub fn strata_cmd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strata"))
}

/// `strata ARGS`, run to completion.
pub fn strata_out(args: &[&str]) -> Output {
    strata_cmd().args(args).output().expect("running strata")
}

/// `$TMPDIR/strata-<area>-<pid>/` (created): one scratch directory per test module and run.
pub fn scratch_dir(area: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-{area}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
    d
}
