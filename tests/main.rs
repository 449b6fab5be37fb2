
#[cfg(feature = "gpu")]
mod gpu_kernels;
mod models_qwen4exp;
mod models_util;
mod models_gemma3;
mod models_qwen3;
mod models_qwen3moe;
mod cli_commands;
mod cli_fetch;
