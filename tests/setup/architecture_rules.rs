//! The architecture rules of docs/architecture.md that a tool can check: no crate compiles
//! another's source through a `#[path]` include, the engine's dispatch needs (almost) no
//! `cfg(feature = "gpu")`, and the `model` crate names no backend and no command line.

use std::path::Path;

use crate::setup::repo_self_contained::repo_files;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &Path) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_default()
}

#[test]
fn no_source_file_is_included_through_a_path_attribute() {
    // Spelled in two pieces so that this file does not match itself.
    let needle = concat!("#[", "path");
    let found: Vec<String> = repo_files()
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
        .filter(|f| read(f).lines().any(|l| l.trim_start().starts_with(needle)))
        .map(|f| f.display().to_string())
        .collect();
    assert!(found.is_empty(), "shared code is a crate, not a #[path] include: {found:?}");
}

#[test]
fn the_engine_holds_at_most_8_gpu_feature_gates() {
    let gate = concat!("feature = ", "\"gpu\"");
    let per_file: Vec<(String, usize)> = repo_files()
        .into_iter()
        .filter(|f| f.starts_with("engine/src") && f.extension().is_some_and(|e| e == "rs"))
        .map(|f| (f.display().to_string(), read(&f).matches(gate).count()))
        .filter(|(_, n)| *n > 0)
        .collect();
    let total: usize = per_file.iter().map(|(_, n)| n).sum();
    assert!(
        total <= 8,
        "{total} gates in engine/src (a backend difference belongs behind model::loaded): {per_file:?}"
    );
}

#[test]
fn the_model_crate_names_no_backend_and_no_command_line() {
    let manifest = read(Path::new("model/Cargo.toml"));
    let deps = manifest.split("[dependencies]").nth(1).unwrap_or("").split("\n[").next().unwrap_or("");
    // The key of each dependency line: `name = ...` or `name.workspace = true`.
    let names: Vec<&str> =
        deps.lines().filter_map(|l| l.trim().split(['=', ' ', '.']).next()).filter(|k| !k.is_empty()).collect();
    assert!(names.contains(&"quant"), "the [dependencies] table was not read: {names:?}");
    for name in ["cpu-kernels", "clap", "gpu-executor", "cpu-executor"] {
        assert!(!names.contains(&name), "model/Cargo.toml depends on {name}");
    }
}
