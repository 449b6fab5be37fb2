//! The Rust-built fixture (`tests/fixtures/rust_kernels.rs`) is compiled for gfx1100 at test
//! time rather than committed as a binary: Debian's rustc + its library source + clang-22,
//! linker-plugin LTO with the LLVM-IR shim of `tests/fixtures/shim/` (docs/kernels.md, the
//! same route the kernel crate takes). Built once per test binary, cached under
//! CARGO_TARGET_TMPDIR.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The fixture code object; panics with what to install when the toolchain is missing.
pub fn rust_kernels_elf() -> &'static [u8] {
    static ELF: OnceLock<Vec<u8>> = OnceLock::new();
    ELF.get_or_init(build)
}

fn rust_src() -> Option<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("/usr/src")
        .ok()?
        .flatten()
        .map(|e| e.path().join("library"))
        .filter(|p| {
            p.parent().and_then(|d| d.file_name()).is_some_and(|n| n.to_string_lossy().starts_with("rustc-"))
                && p.is_dir()
        })
        .collect();
    v.sort();
    v.pop()
}

fn build() -> Vec<u8> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shim = here.join("tests/fixtures/shim");
    let src = rust_src();
    if !Path::new("/usr/bin/rustc").exists() || src.is_none() || !shim.join("lds_shim.ll").exists() {
        panic!(
            "building the Rust fixture needs the kernel toolchain (apt-get install rustc-web cargo-web \
                rust-web-src clang-22 lld-22 llvm-22); run ./setup.sh --test once to install it"
        );
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rust-kernels-fixture");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    // Own workspace root, or cargo would find the project's workspace above the target dir.
    let manifest = std::fs::read_to_string(shim.join("Cargo.toml")).unwrap() + "\n[workspace]\n";
    write_if_changed(&dir.join("Cargo.toml"), manifest.as_bytes());
    write_if_changed(&dir.join("build.rs"), &std::fs::read(shim.join("build.rs")).unwrap());
    write_if_changed(&dir.join("lds_shim.ll"), &std::fs::read(shim.join("lds_shim.ll")).unwrap());
    write_if_changed(&dir.join("src/lib.rs"), &std::fs::read(here.join("tests/fixtures/rust_kernels.rs")).unwrap());
    let flags = [
        "-Zunstable-options",
        "-Ctarget-cpu=gfx1100",
        "-Clinker-flavor=gnu-lld-cc",
        "-Clinker=clang-22",
        "-Clink-arg=--target=amdgcn-amd-amdhsa",
        "-Clink-arg=-mcpu=gfx1100",
        "-Clink-arg=-nostdlib",
        "-Clinker-plugin-lto",
        "-Clink-arg=-flto",
        "-Clink-arg=-O3",
    ];
    let mut cmd = Command::new("/usr/bin/cargo");
    cmd.env_clear();
    for keep in ["PATH", "HOME", "TMPDIR", "LANG"] {
        if let Ok(v) = std::env::var(keep) {
            cmd.env(keep, v);
        }
    }
    let st = cmd
        .env("RUSTC", "/usr/bin/rustc")
        .env("RUSTC_BOOTSTRAP", "1")
        .env("__CARGO_TESTS_ONLY_SRC_ROOT", src.unwrap())
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
        .current_dir(&dir)
        .args([
            "build",
            "--quiet",
            "--release",
            "--target",
            "amdgcn-amd-amdhsa",
            "-Zbuild-std=core",
            "--target-dir",
            "target",
        ])
        .status()
        .expect("running /usr/bin/cargo");
    assert!(st.success(), "building the Rust fixture in {} failed", dir.display());
    std::fs::read(dir.join("target/amdgcn-amd-amdhsa/release/lds_stable.elf")).unwrap()
}

fn write_if_changed(p: &Path, data: &[u8]) {
    if std::fs::read(p).ok().as_deref() != Some(data) {
        std::fs::write(p, data).unwrap();
    }
}
