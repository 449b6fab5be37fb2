//! Strata engine: models, KV cache, sampling, serving; backends over the `cpu-kernels` crate
//! and (with `--features gpu`) the gfx11 kernels.
//!
//! Flow: [`fetch`] (default model) → [`model::Model::load`] (GGUF → hyperparameters and
//! weights) → [`engine::Engine`] (model + tokenizer) → [`cpu::Session`] per sequence
//! (KV cache, [`kv_cache`]) → [`sampler`]. [`cli`] is the command line.

pub mod cli;
pub mod cpu;
pub mod device;
pub mod engine;
pub mod experts;
pub mod f16;
pub mod fetch;
pub mod gpu_options;
pub mod kfd;
pub mod kv_cache;
pub mod npy;
pub mod sampler;
pub mod spec;
pub mod synth;
#[cfg(feature = "gpu")]
pub mod gpu;

// The architecture descriptions, the error type and the KV type are the `model` crate's.
pub use model::{self, error};
// The one deterministic RNG (its own crate, below every other).
pub use rng;

pub use engine::{Engine, RunOptions};
pub use error::EngineError;
