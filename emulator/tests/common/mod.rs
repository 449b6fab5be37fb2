//! Shared helpers of the ISA tests: wrap a kernel body in `.amdhsa_kernel` boilerplate,
//! assemble it with llvm-mc-22 and link it with ld.lld-22 (at test time), run it on the device.
//!
//! Test kernel ABI (so the same .s could run on a real gfx1100): kernarg s[0:1] points to
//! { out: u64, in: u64 }. The prologue leaves s[0:1] = out, s[2:3] = in, v1 = lane * 4,
//! v2/v3/v4 = in[lane], in[32 + lane], in[64 + lane]. The epilogue stores v5 to out[lane].
#![allow(dead_code)]
use emulator::{Device, EmuError, LaunchStats};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

static N: AtomicUsize = AtomicUsize::new(0);

pub const PROLOGUE: &str = "
  s_load_b128 s[0:3], s[0:1], 0x0
  s_waitcnt lgkmcnt(0)
  v_lshlrev_b32 v1, 2, v0
  global_load_b32 v2, v1, s[2:3]
  global_load_b32 v3, v1, s[2:3] offset:128
  global_load_b32 v4, v1, s[2:3] offset:256
  s_waitcnt vmcnt(0)
";
pub const EPILOGUE: &str = "
  global_store_b32 v1, v5, s[0:1]
  s_endpgm
";

/// Assemble a full kernel named `k` from `body`; None (with a loud message) without llvm-mc-22.
pub fn assemble_raw(body: &str, extra_directives: &str, lds: u32) -> Option<Vec<u8>> {
    let args = "      - { .offset: 0, .size: 8, .value_kind: global_buffer, .address_space: global }\n      - { .offset: 8, .size: 8, .value_kind: global_buffer, .address_space: global }";
    assemble_with_args(body, extra_directives, lds, args, 16)
}

/// Like `assemble_raw` with a custom `.args` list (YAML lines) and kernarg size.
pub fn assemble_with_args(
    body: &str,
    extra_directives: &str,
    lds: u32,
    args: &str,
    kernarg_size: u32,
) -> Option<Vec<u8>> {
    if Command::new("llvm-mc-22").arg("--version").output().is_err() {
        eprintln!("\n*** SKIPPED: llvm-mc-22 not found; install llvm-22 and lld-22 to run the ISA tests ***\n");
        return None;
    }
    // default: keep f32/f16 denormals (like Rust kernels); a test may ask for flushing
    let denorm = if extra_directives.contains("denorm_mode") {
        ""
    } else {
        "  .amdhsa_float_denorm_mode_32 3\n  .amdhsa_float_denorm_mode_16_64 3"
    };
    let src = format!(
        r#"
.amdgcn_target "amdgcn-amd-amdhsa--gfx1100"
.text
.globl k
.p2align 8
.type k,@function
k:
{body}
.rodata
.p2align 6
.amdhsa_kernel k
  .amdhsa_user_sgpr_kernarg_segment_ptr 1
  .amdhsa_next_free_vgpr 64
  .amdhsa_next_free_sgpr 64
  .amdhsa_wavefront_size32 1
  .amdhsa_group_segment_fixed_size {lds}
{denorm}
{extra_directives}
.end_amdhsa_kernel
.amdgpu_metadata
---
amdhsa.version: [1, 2]
amdhsa.kernels:
  - .name: k
    .symbol: k.kd
    .kernarg_segment_size: {kernarg_size}
    .group_segment_fixed_size: {lds}
    .private_segment_fixed_size: 0
    .kernarg_segment_align: 8
    .wavefront_size: 32
    .sgpr_count: 64
    .vgpr_count: 64
    .max_flat_workgroup_size: 1024
    .args:
{args}
...
.end_amdgpu_metadata
"#
    );
    let dir =
        std::env::temp_dir().join(format!("emu-isa-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&dir).unwrap();
    let (s, o, e) = (dir.join("k.s"), dir.join("k.o"), dir.join("k.elf"));
    std::fs::write(&s, src).unwrap();
    let r = Command::new("llvm-mc-22")
        .args(["-triple=amdgcn-amd-amdhsa", "-mcpu=gfx1100", "-filetype=obj", "-o"])
        .arg(&o)
        .arg(&s)
        .output()
        .unwrap();
    assert!(r.status.success(), "llvm-mc-22 failed:\n{}\n{body}", String::from_utf8_lossy(&r.stderr));
    let r = Command::new("ld.lld-22").args(["-shared", "-o"]).arg(&e).arg(&o).output().expect("ld.lld-22");
    assert!(r.status.success(), "ld.lld-22 failed: {}", String::from_utf8_lossy(&r.stderr));
    let bytes = std::fs::read(&e).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Some(bytes)
}

/// Run a code object's kernel `k` with one workgroup of `threads` work-items.
pub fn run_elf(
    elf: &[u8],
    input: &[u32],
    out_words: usize,
    threads: u32,
    lds_dyn: u32,
) -> Result<(Vec<u32>, LaunchStats), EmuError> {
    let dev = Device::new();
    let m = dev.load_module(elf)?;
    let f = m.function("k")?;
    let mut inp = input.to_vec();
    inp.resize(inp.len().max(96), 0);
    let pin = dev.malloc(inp.len() * 4)?;
    dev.memcpy_htod(pin, &inp.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?;
    let pout = dev.malloc(out_words * 4)?;
    let mut ka = pout.to_le_bytes().to_vec();
    ka.extend_from_slice(&pin.to_le_bytes());
    let st = dev.launch(&f, [1, 1, 1], [threads, 1, 1], lds_dyn, &ka)?;
    let mut out = vec![0u8; out_words * 4];
    dev.memcpy_dtoh(&mut out, pout)?;
    Ok((out.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect(), st))
}

/// Prologue + body + epilogue, one wave; returns out[0..32] (None when the tools are missing).
pub fn run(body: &str, input: &[u32]) -> Option<Vec<u32>> {
    let elf = assemble_raw(&format!("{PROLOGUE}{body}{EPILOGUE}"), "", 0)?;
    Some(run_elf(&elf, input, 32, 32, 0).unwrap_or_else(|e| panic!("{e}\n{body}")).0)
}

/// Inputs: three per-lane vectors a, b, c.
pub fn abc(a: impl Fn(usize) -> u32, b: impl Fn(usize) -> u32, c: impl Fn(usize) -> u32) -> Vec<u32> {
    (0..32).map(a).chain((0..32).map(b)).chain((0..32).map(c)).collect()
}
pub fn f(x: f32) -> u32 {
    x.to_bits()
}
pub fn ff(x: u32) -> f32 {
    f32::from_bits(x)
}
pub mod fixture;
pub mod objdump;
