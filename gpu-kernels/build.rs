//! Assembles the LLVM-IR shim (LDS region, workgroup barrier) to bitcode and hands it to the
//! linker, where `-Clinker-plugin-lto` (set by gpu-executor/build.rs) joins it to the one LTO unit of
//! the kernels so its accessors are inlined and the flat pointers become `ds_*` accesses.
use std::{env, path::PathBuf, process::Command};

fn main() {
    println!("cargo:rerun-if-changed=lds_shim.ll");
    println!("cargo:rerun-if-env-changed=KERNEL_LLVM_AS");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("lds_shim.bc");
    let llvm_as = env::var("KERNEL_LLVM_AS").unwrap_or_else(|_| "llvm-as-22".into());
    let status = Command::new(&llvm_as)
        .args(["lds_shim.ll", "-o"])
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {llvm_as} (install llvm-22 or set KERNEL_LLVM_AS): {e}"));
    assert!(status.success(), "{llvm_as} failed on lds_shim.ll");
    println!("cargo:rustc-link-arg={}", out.display());
    // rustc's version script names `<kernel>.kd`, which only exist after LTO codegen.
    let flavor_rust_lld = env::var("KERNEL_LINKER_RUST_LLD").is_ok();
    if flavor_rust_lld {
        println!("cargo:rustc-link-arg=--undefined-version");
    } else {
        println!("cargo:rustc-link-arg=-Wl,--undefined-version");
    }
}
