//! Kernel toolchain detection and nested-build flags of `gpu-executor/build.rs`, a crate of
//! their own so that `tests/setup/kernel_toolchain.rs` can test them (a build script cannot be
//! linked into tests). Every environment lookup goes through a `Var` function, so tests pass a
//! fake environment (PATH with a stand-in `rustup`, `KERNEL_*` overrides) without touching the
//! process environment.
//!
//! Route 1: a system rustc (Debian's 1.96 has LLVM 22 with amdgcn) + its library source +
//! clang-22. Route 2: rustup nightly with the rust-src component (links with nightly's
//! rust-lld). `KERNEL_*` overrides win. See docs/kernels.md.
use std::path::Path;
use std::process::Command;

pub const INSTALL_HELP: &str = "\
no toolchain that can build the gfx11 kernels (feature `gpu`) was found. Install one of:
  Route 1 (Debian packages, offline):
      apt-get install rustc-web cargo-web rust-web-src clang-22 lld-22 llvm-22
  Route 2 (rustup):
      rustup toolchain install nightly && rustup component add rust-src --toolchain nightly
      (and llvm-22 for llvm-as-22: apt-get install llvm-22)
or point KERNEL_CARGO / KERNEL_RUSTC / KERNEL_RUST_SRC at a rustc with the amdgcn-amd-amdhsa
target and its matching library source. Or build without `--features gpu` (CPU only).";

/// How the nested cargo is run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolchain {
    pub route: &'static str,
    /// Program and leading arguments (`/usr/bin/cargo`, or `rustup run nightly cargo`).
    pub cargo: Vec<String>,
    /// `RUSTC` for the nested cargo (route 1), with `RUSTC_BOOTSTRAP=1`.
    pub rustc: Option<String>,
    /// `__CARGO_TESTS_ONLY_SRC_ROOT`: the library source for `-Zbuild-std` (route 1).
    pub src_root: Option<String>,
    /// Debian's rustc must link through the clang-22 driver (its rust-lld flavour ICEs on cdylibs).
    pub clang: Option<String>,
}

/// An environment lookup: `std::env::var(name).ok()` in the build script, a map in tests.
pub type Var<'a> = &'a dyn Fn(&str) -> Option<String>;

/// `exe` in the `PATH` of `var`.
pub fn find_in_path(var: Var, exe: &str) -> Option<String> {
    let path = var("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(exe)).find(|p| p.is_file()).map(|p| p.display().to_string())
}

fn output_of(cmd: &mut Command) -> Option<String> {
    let o = cmd.output().ok()?;
    o.status.success().then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// Route 1, then route 2 (`KERNEL_ROUTE=debian|rustup` forces one). The error lists why each
/// route was rejected; the caller adds `INSTALL_HELP`.
pub fn detect_toolchain(var: Var) -> Result<Toolchain, String> {
    let route = var("KERNEL_ROUTE");
    let mut notes = Vec::new();
    if route.as_deref() != Some("rustup") {
        match detect_debian(var) {
            Ok(t) => return Ok(t),
            Err(e) => notes.push(format!("route 1 (system rustc + clang-22): {e}")),
        }
    }
    if route.as_deref() != Some("debian") {
        match detect_rustup(var) {
            Ok(t) => return Ok(t),
            Err(e) => notes.push(format!("route 2 (rustup nightly + rust-src): {e}")),
        }
    }
    Err(notes.join("\n  "))
}

pub fn detect_debian(var: Var) -> Result<Toolchain, String> {
    let rustc = var("KERNEL_RUSTC").unwrap_or_else(|| "/usr/bin/rustc".into());
    let cargo = var("KERNEL_CARGO").unwrap_or_else(|| "/usr/bin/cargo".into());
    if !Path::new(&cargo).is_file() {
        return Err(format!("{cargo} not found"));
    }
    let version = output_of(Command::new(&rustc).env_clear().arg("--version"))
        .ok_or_else(|| format!("{rustc} --version failed"))?;
    // "rustc 1.96.0 (ac68faa20 2026-05-25) (built from a source tarball)"
    let ver = version.split_whitespace().nth(1).ok_or_else(|| format!("cannot parse `{version}`"))?.to_string();
    let src = var("KERNEL_RUST_SRC").unwrap_or_else(|| format!("/usr/src/rustc-{ver}/library"));
    if !Path::new(&src).join("core").is_dir() {
        return Err(format!("library source for rustc {ver} not found at {src} (package rust-web-src)"));
    }
    let targets = output_of(Command::new(&rustc).env_clear().args(["--print", "target-list"])).unwrap_or_default();
    if !targets.lines().any(|l| l == "amdgcn-amd-amdhsa") {
        return Err(format!("{rustc} ({ver}) has no amdgcn-amd-amdhsa target"));
    }
    let clang = find_in_path(var, "clang-22").ok_or("clang-22 not found in PATH (package clang-22)")?;
    find_in_path(var, "ld.lld-22").ok_or("ld.lld-22 not found in PATH (package lld-22)")?;
    find_in_path(var, "llvm-as-22").ok_or("llvm-as-22 not found in PATH (package llvm-22)")?;
    Ok(Toolchain { route: "debian", cargo: vec![cargo], rustc: Some(rustc), src_root: Some(src), clang: Some(clang) })
}

/// Route 2: `rustup run nightly rustc --print sysroot` must name a sysroot whose
/// `lib/rustlib/src/rust/library/core` exists (the rust-src component).
pub fn detect_rustup(var: Var) -> Result<Toolchain, String> {
    let rustup = find_in_path(var, "rustup").ok_or("rustup not found in PATH")?;
    let mut cmd = Command::new(&rustup);
    cmd.args(["run", "nightly", "rustc", "--print", "sysroot"]);
    for v in ["PATH", "HOME", "RUSTUP_HOME", "CARGO_HOME"] {
        match var(v) {
            Some(val) => cmd.env(v, val),
            None => cmd.env_remove(v),
        };
    }
    let sysroot = output_of(&mut cmd).ok_or("`rustup run nightly rustc` failed (no nightly toolchain)")?;
    let lib = Path::new(&sysroot).join("lib/rustlib/src/rust/library");
    if !lib.join("core").is_dir() {
        return Err(format!(
            "{} missing: the rust-src component is not installed (rustup component add rust-src --toolchain nightly)",
            lib.display()
        ));
    }
    find_in_path(var, "llvm-as-22").ok_or("llvm-as-22 not found in PATH (package llvm-22), needed for the LDS shim")?;
    Ok(Toolchain {
        route: "rustup",
        cargo: vec![rustup, "run".into(), "nightly".into(), "cargo".into()],
        rustc: None,
        src_root: None,
        clang: None,
    })
}

/// RUSTFLAGS of the nested kernel build for `gfx` (every crate, `core` included).
pub fn nested_rustflags(tc: &Toolchain, gfx: &str, extra: &str) -> Vec<String> {
    let mut flags = vec!["-Zunstable-options".to_string(), format!("-Ctarget-cpu={gfx}"), "-Clinker-plugin-lto".into()];
    if let Some(clang) = &tc.clang {
        flags.extend([
            "-Clinker-flavor=gnu-lld-cc".to_string(),
            format!("-Clinker={clang}"),
            "-Clink-arg=--target=amdgcn-amd-amdhsa".into(),
            format!("-Clink-arg=-mcpu={gfx}"),
            "-Clink-arg=-nostdlib".into(),
            "-Clink-arg=-flto".into(),
            "-Clink-arg=-O3".into(),
        ]);
    }
    flags.extend(extra.split_whitespace().map(String::from));
    flags
}

/// Environment variables the nested cargo gets on top of the kept ones (PATH, HOME, ...).
pub fn nested_env(tc: &Toolchain) -> Vec<(&'static str, String)> {
    let mut env = Vec::new();
    if let Some(rustc) = &tc.rustc {
        env.push(("RUSTC", rustc.clone()));
        env.push(("RUSTC_BOOTSTRAP", "1".into()));
    }
    if let Some(src) = &tc.src_root {
        env.push(("__CARGO_TESTS_ONLY_SRC_ROOT", src.clone()));
    }
    if tc.clang.is_none() {
        // gpu-kernels/build.rs: rust-lld needs `--undefined-version` (not the clang driver's -Wl,).
        env.push(("KERNEL_LINKER_RUST_LLD", "1".into()));
    }
    env
}
