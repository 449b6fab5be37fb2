//! Prompt reuse on the device (`models::prompt_reuse` has the body and the CPU runs): the
//! shared decoder's device session truncated, Flash-Next's device states restored from the
//! snapshot the previous request ended with. The software device always; a card when one opens.

use strata::Device;

use crate::models::prompt_reuse::{QWEN3MOE, QWEN4EXP, check_reuse, fixture, load};

fn on_devices(rel: &str, what: &str) {
    check_reuse(&load(&fixture(rel), Device::Emu), &format!("{what} emu"));
    match strata::gpu::device::open_device(strata::gpu::device::Device::Hip) {
        Ok(_) => check_reuse(&load(&fixture(rel), Device::Hip), &format!("{what} hip")),
        Err(e) => eprintln!("skipped hip: no card opens through HIP ({e})"),
    }
}

#[test]
fn gpu_prompt_reuse_qwen3moe() {
    on_devices(QWEN3MOE, "qwen3moe");
}

#[test]
fn gpu_prompt_reuse_qwen4exp() {
    on_devices(QWEN4EXP, "qwen4exp");
}
