//! A user's clone has nothing beside it: no file of the repository may refer to the folder that
//! sat beside our development checkouts, and the test data must be in the repository (or be
//! generated from it) without committing model weights.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Files tracked by git (the repository as a clone sees it); without git, every file outside
/// `target*` and `.git`.
pub(crate) fn repo_files() -> Vec<PathBuf> {
    if let Ok(out) = Command::new("git").args(["ls-files", "-z"]).current_dir(root()).output()
        && out.status.success()
    {
        return out
            .stdout
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| PathBuf::from(String::from_utf8_lossy(s).into_owned()))
            .collect();
    }
    let mut files = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root().join(&rel)).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if rel.as_os_str().is_empty() && (name.starts_with("target") || name == ".git") {
                continue;
            }
            let p = rel.join(&name);
            if e.file_type().unwrap().is_dir() { stack.push(p) } else { files.push(p) }
        }
    }
    files
}

#[test]
fn no_file_refers_to_a_folder_outside_the_repository() {
    // Spelled in pieces so that this file does not match itself.
    let patterns = [["..", "/shared"].concat(), ["shared", "/reference"].concat(), ["shared", "/examples"].concat()];
    let mut hits = Vec::new();
    for rel in repo_files() {
        let Ok(bytes) = std::fs::read(root().join(&rel)) else { continue };
        let text = String::from_utf8_lossy(&bytes);
        for (n, line) in text.lines().enumerate() {
            if patterns.iter().any(|p| line.contains(p.as_str())) {
                hits.push(format!("{}:{}: {}", rel.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(hits.is_empty(), "files refer to a folder outside the repository:\n{}", hits.join("\n"));
}

#[test]
fn generated_test_models_are_listed_and_not_committed() {
    let sums = std::fs::read_to_string(root().join("testdata/generated.sha256")).unwrap();
    let tracked: Vec<PathBuf> = repo_files();
    assert!(!tracked.iter().any(|p| p.extension().is_some_and(|e| e == "gguf")), "a GGUF file is committed");
    let mut n = 0;
    for line in sums.lines() {
        let (hash, name) = line.split_once("  ").expect("sha256sum format: HASH  NAME");
        assert_eq!(hash.len(), 64, "{line}");
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()), "{line}");
        // Every generated model sits beside the references recorded on it.
        let dir = root().join("testdata/reference").join(name);
        let parent = dir.parent().unwrap();
        assert!(parent.is_dir(), "{name}: no reference folder {}", parent.display());
        n += 1;
    }
    assert_eq!(n, 6);
}
