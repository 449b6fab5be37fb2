//! The kernel toolchain detection of gpu-executor/build.rs (the `kernel-toolchain` crate), route 2 (rustup nightly +
//! rust-src) in particular, which cannot be exercised end to end here: this machine's nightly
//! has no rust-src and static.rust-lang.org is unreachable. A stand-in `rustup` script in a
//! temporary PATH plays both cases (component present / missing); the real rustup, when
//! installed, must give a consistent answer. Nothing here changes the process environment.
use kernel_toolchain as toolchain;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use toolchain::{INSTALL_HELP, Toolchain, detect_rustup, detect_toolchain, nested_env, nested_rustflags};

/// A temporary directory removed on drop.
struct Tmp(PathBuf);
impl Tmp {
    fn new(tag: &str) -> Tmp {
        let p = std::env::temp_dir().join(format!("strata-toolchain-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Tmp(p)
    }
}
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_exe(path: &Path, script: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, script).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A fake environment: `bin` (with a stand-in `rustup` printing `sysroot`, and `llvm-as-22`)
/// is the whole PATH.
fn fake_rustup(tag: &str, with_rust_src: bool, with_llvm_as: bool) -> (Tmp, HashMap<&'static str, String>) {
    let t = Tmp::new(tag);
    let bin = t.0.join("bin");
    let sysroot = t.0.join("sysroot");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(sysroot.join("lib/rustlib")).unwrap();
    if with_rust_src {
        std::fs::create_dir_all(sysroot.join("lib/rustlib/src/rust/library/core")).unwrap();
    }
    // Answers exactly the query build.rs makes, fails on anything else.
    write_exe(
        &bin.join("rustup"),
        &format!(
            "#!/bin/sh\nif [ \"$*\" = \"run nightly rustc --print sysroot\" ]; then echo {}; else exit 1; fi\n",
            sysroot.display()
        ),
    );
    if with_llvm_as {
        write_exe(&bin.join("llvm-as-22"), "#!/bin/sh\nexit 0\n");
    }
    let mut env = HashMap::new();
    env.insert("PATH", bin.display().to_string());
    (t, env)
}

fn var<'a>(env: &'a HashMap<&'static str, String>) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| env.get(k).cloned()
}

#[test]
fn route2_detected_with_rust_src() {
    let (t, mut env) = fake_rustup("ok", true, true);
    env.insert("KERNEL_ROUTE", "rustup".into());
    let tc = detect_toolchain(&var(&env)).expect("route 2 with rust-src");
    let rustup = t.0.join("bin/rustup").display().to_string();
    assert_eq!(
        tc,
        Toolchain {
            route: "rustup",
            cargo: vec![rustup, "run".into(), "nightly".into(), "cargo".into()],
            rustc: None,
            src_root: None,
            clang: None
        }
    );
    // Route 2 links with nightly's own rust-lld: no clang-driver flags, the gpu-kernels
    // build script is told to pass `--undefined-version` directly, no RUSTC/RUSTC_BOOTSTRAP
    // or library-source override (rustup's cargo finds rust-src itself).
    let flags = nested_rustflags(&tc, "gfx1100", "-Cfoo=1");
    assert_eq!(flags, ["-Zunstable-options", "-Ctarget-cpu=gfx1100", "-Clinker-plugin-lto", "-Cfoo=1"]);
    assert_eq!(nested_env(&tc), vec![("KERNEL_LINKER_RUST_LLD", "1".to_string())]);
}

#[test]
fn route2_names_the_missing_rust_src_component() {
    let (t, mut env) = fake_rustup("nosrc", false, true);
    env.insert("KERNEL_ROUTE", "rustup".into());
    let e = detect_toolchain(&var(&env)).expect_err("no rust-src");
    assert!(e.starts_with("route 2 (rustup nightly + rust-src): "), "{e}");
    assert!(e.contains("rust-src component is not installed"), "{e}");
    assert!(e.contains("rustup component add rust-src --toolchain nightly"), "{e}");
    assert!(e.contains(&t.0.join("sysroot/lib/rustlib/src/rust/library").display().to_string()), "{e}");
    assert!(!e.contains("route 1"), "KERNEL_ROUTE=rustup must not try route 1: {e}");
}

#[test]
fn route2_needs_llvm_as_and_a_nightly() {
    let (_t, env) = fake_rustup("noas", true, false);
    let e = detect_rustup(&var(&env)).expect_err("no llvm-as-22");
    assert!(e.contains("llvm-as-22 not found") && e.contains("llvm-22"), "{e}");

    // A rustup without a nightly toolchain (the stand-in fails every other query too).
    let (t, env) = fake_rustup("nonightly", true, true);
    write_exe(&t.0.join("bin/rustup"), "#!/bin/sh\necho 'error: toolchain nightly is not installed' >&2\nexit 1\n");
    let e = detect_rustup(&var(&env)).expect_err("no nightly");
    assert!(e.contains("no nightly toolchain"), "{e}");

    let empty = Tmp::new("empty");
    let env: HashMap<&'static str, String> = [("PATH", empty.0.display().to_string())].into();
    assert_eq!(detect_rustup(&var(&env)).expect_err("no rustup"), "rustup not found in PATH");
}

#[test]
fn no_route_lists_both_reasons_and_the_install_help_names_both_routes() {
    let empty = Tmp::new("none");
    let env: HashMap<&'static str, String> =
        [("PATH", empty.0.display().to_string()), ("KERNEL_CARGO", empty.0.join("no-cargo").display().to_string())]
            .into();
    let e = detect_toolchain(&var(&env)).expect_err("nothing installed");
    assert!(e.contains("route 1 (system rustc + clang-22):") && e.contains("no-cargo not found"), "{e}");
    assert!(e.contains("route 2 (rustup nightly + rust-src): rustup not found in PATH"), "{e}");
    for needle in [
        "apt-get install rustc-web cargo-web rust-web-src clang-22 lld-22 llvm-22",
        "rustup component add rust-src --toolchain nightly",
        "without `--features gpu`",
    ] {
        assert!(INSTALL_HELP.contains(needle), "install help lacks {needle:?}");
    }
}

/// The real rustup of this machine (when there is one): route 2 is accepted exactly when its
/// nightly has the rust-src component. Here (nightly without rust-src, no network) this checks
/// the rejection; on a machine with rust-src, the acceptance.
#[test]
fn route2_on_the_real_rustup_agrees_with_its_sysroot() {
    let real = |k: &str| std::env::var(k).ok();
    let Some(rustup) = toolchain::find_in_path(&real, "rustup") else {
        println!("no rustup on this machine: skipped");
        return;
    };
    let out =
        std::process::Command::new(&rustup).args(["run", "nightly", "rustc", "--print", "sysroot"]).output().unwrap();
    let r = detect_rustup(&real);
    if !out.status.success() {
        assert!(r.is_err(), "no nightly, yet route 2 was accepted");
        return;
    }
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let has_src = Path::new(&sysroot).join("lib/rustlib/src/rust/library/core").is_dir();
    let has_as = toolchain::find_in_path(&real, "llvm-as-22").is_some();
    println!("nightly sysroot {sysroot}: rust-src {has_src}, llvm-as-22 {has_as}: {r:?}");
    match (has_src, has_as) {
        (true, true) => assert_eq!(r.expect("route 2").route, "rustup"),
        (false, _) => assert!(r.expect_err("no rust-src").contains("rust-src component is not installed")),
        (true, false) => assert!(r.expect_err("no llvm-as").contains("llvm-as-22")),
    }
}
