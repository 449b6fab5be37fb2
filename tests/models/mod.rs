//! The engine on the CPU: each architecture against llama.cpp's recorded outputs and f64
//! references, llama.cpp's own requantizations of a real model, the expert source, weight residency and speculative decoding; `models_util`
//! (reference data, fetched models, random-weight models) is shared with the other folders.
mod experts_source;
mod models_cpu_gemm;
mod models_gemma3;
pub(crate) mod models_qwen3;
mod models_qwen3moe;
pub(crate) mod models_qwen4exp;
mod models_requant;
pub(crate) mod models_util;
pub(crate) mod prompt_reuse;
mod residency;
mod spec_decoding;
mod spec_mtp;
