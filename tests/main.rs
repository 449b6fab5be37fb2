
#[cfg(feature = "gpu")]
mod gpu_kernels;
mod models_qwen4exp;
