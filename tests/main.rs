mod cli_bad_input;
mod cli_bad_sizes;
mod cli_commands;
mod cli_default_model;
#[cfg(feature = "gpu")]
mod cli_emu;
mod cli_gguf;
#[cfg(feature = "gpu")]
mod cli_gpu;
mod cli_mtp;
#[cfg(feature = "gpu")]
mod cli_ordered;
mod cli_plan;
mod cli_qwen4exp;
mod cli_server_config;
#[cfg(feature = "gpu")]
mod emu_race;
mod experts_source;
#[cfg(feature = "gpu")]
mod gpu_calibrate;
#[cfg(feature = "gpu")]
mod gpu_device;
#[cfg(feature = "gpu")]
mod gpu_expert_cache;
#[cfg(feature = "gpu")]
mod gpu_expert_cache_auto;
mod gpu_expert_handoff;
#[cfg(feature = "gpu")]
mod gpu_flash_next;
#[cfg(feature = "gpu")]
mod gpu_flash_next_cache;
#[cfg(feature = "gpu")]
mod gpu_flash_next_mtp;
#[cfg(feature = "gpu")]
mod gpu_flash_next_ordered;
#[cfg(feature = "gpu")]
mod gpu_flash_next_prompt;
#[cfg(feature = "gpu")]
mod gpu_kernels;
#[cfg(feature = "gpu")]
mod gpu_model;
#[cfg(feature = "gpu")]
mod gpu_model_ordered;
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
#[cfg(feature = "gpu")]
mod hip_debian;
mod kernel_toolchain;
mod models_cpu_gemm;
mod models_gemma3;
mod models_qwen3;
mod models_qwen3moe;
mod models_qwen4exp;
mod models_util;
mod repo_self_contained;
mod residency;
mod server_faults;
mod setup_detect;
mod spec_decoding;
mod spec_mtp;
mod support;
