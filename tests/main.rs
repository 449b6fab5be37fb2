
#[cfg(feature = "gpu")]
mod gpu_kernels;
mod models_qwen4exp;
#[cfg(feature = "gpu")]
mod gpu_device;
#[cfg(feature = "gpu")]
mod gpu_calibrate;
#[cfg(feature = "gpu")]
mod gpu_model;
#[cfg(feature = "gpu")]
mod gpu_model_ordered;
#[cfg(feature = "gpu")]
mod gpu_expert_cache;
mod gpu_expert_handoff;
#[cfg(feature = "gpu")]
mod gpu_flash_next;
#[cfg(feature = "gpu")]
mod gpu_flash_next_ordered;
#[cfg(feature = "gpu")]
mod gpu_flash_next_cache;
#[cfg(feature = "gpu")]
mod gpu_flash_next_mtp;
#[cfg(feature = "gpu")]
mod gpu_flash_next_prompt;
#[cfg(feature = "gpu")]
mod gpu_expert_cache_auto;
#[cfg(feature = "gpu")]
mod gpu_ops;
#[cfg(feature = "gpu")]
mod gpu_ops_attention;
mod gpu_ops_flash_moe;
mod gpu_ops_gdn;
mod gpu_ops_gr;
mod gpu_ops_moe_sorted;
mod gpu_ops_ple;
mod gpu_ops_qsa;
#[cfg(feature = "gpu")]
mod gpu_selftest;
mod models_util;
mod support;
mod models_gemma3;
mod models_cpu_gemm;
mod models_qwen3;
mod models_qwen3moe;
mod spec_mtp;
mod cli_mtp;
mod cli_commands;
mod cli_bad_input;
mod cli_bad_sizes;
mod cli_gguf;
mod cli_default_model;
mod repo_self_contained;
mod cli_server_config;
mod server_faults;
mod experts_source;
mod residency;
mod cli_plan;
mod spec_decoding;
#[cfg(feature = "gpu")]
mod cli_emu;
#[cfg(feature = "gpu")]
mod cli_gpu;
#[cfg(feature = "gpu")]
mod cli_ordered;
mod cli_qwen4exp;
mod kernel_toolchain;
mod setup_detect;
#[cfg(feature = "gpu")]
mod hip_debian;
#[cfg(feature = "gpu")] mod emu_race;
