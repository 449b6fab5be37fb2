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

/// A fresh sequence of `m` through the engine's interface (`model::loaded`), with room for
/// `positions` (the numerics mode the model's own: Flash-Next takes it from the model, a
/// device from its options).
pub fn session(
    m: &dyn strata::engine::LoadedModel,
    kv: strata::kv_cache::KvType,
    positions: usize,
) -> Box<dyn strata::engine::Session> {
    let cfg =
        strata::engine::SessionConfig { kv, max_ctx: positions, prefill_chunk: 512, numerics: Default::default() };
    m.new_session(&cfg).expect("a session")
}

/// The Flash-Next state of a CPU session made by [`session`].
pub fn flash_state(s: &dyn strata::engine::Session) -> &strata::model::qwen4exp::SeqState {
    &s.as_any().downcast_ref::<strata::cpu::FlashSession>().expect("a CPU Flash-Next session").st
}
