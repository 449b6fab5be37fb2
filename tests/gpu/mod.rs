//! Everything that needs `--features gpu` (the one `cfg` of this folder is on its `mod` line in
//! main.rs): the gfx11 kernels and `GpuOps` against CPU references, the device boundary and the
//! HIP loader, the GPU backend's models against the CPU backend, the expert cache and handoff,
//! and the `strata` binary on `--device emu|hip`. The bodies run on the software RDNA3 device
//! always and on a card when one is present.
mod cli_emu;
mod cli_gpu;
mod cli_mtp_emu;
mod cli_ordered;
mod cli_qwen4exp_emu;
mod emu_race;
mod gpu_calibrate;
mod gpu_device;
mod gpu_expert_cache;
mod gpu_expert_cache_auto;
mod gpu_expert_handoff;
mod gpu_kernels;
mod gpu_model;
mod gpu_model_ordered;
mod gpu_ops;
mod gpu_ops_attention;
mod gpu_ops_gdn;
mod gpu_ops_gr;
mod gpu_ops_moe_sorted;
mod gpu_ops_ple;
mod gpu_ops_qsa;
mod gpu_ops_qwen4exp_moe;
mod gpu_prompt_reuse;
mod gpu_qwen4exp;
mod gpu_qwen4exp_cache;
mod gpu_qwen4exp_mtp;
mod gpu_qwen4exp_ordered;
mod gpu_qwen4exp_prompt;
mod gpu_selftest;
mod hip_debian;
mod server_faults_emu;
