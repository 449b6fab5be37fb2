//! Strata engine: models, KV cache, sampling, serving; backends over the `cpu-kernels` crate
//! and (with `--features gpu`) the gfx11 kernels.
//!
//! Flow: [`fetch`] (default model) → [`model::Decoder::load`] (GGUF → hyperparameters and
//! weights) → [`engine::Engine`] (model + tokenizer) → [`cpu::Session`] per sequence
//! (KV cache, [`kv_cache`]) → [`sampler`]. [`cli`] is the command line.

pub mod cli;
pub mod engine;
pub mod fetch;
mod finite;
pub mod memory;
pub mod npy;
pub mod prompt_reuse;
pub mod residency;
pub mod run_options;
pub mod sampler;
pub mod spec;
pub mod text_stream;

// The architecture descriptions, the error type and the KV type are the `model` crate's.
pub use model::{self, error};
// The one deterministic RNG (its own crate, below every other).
pub use rng;
// Routed experts for expert tiering (sources, profiles, traces, policies): their own crate.
pub use experts;
// Synthetic model writers (`strata synth`, kernel tests' random blocks): their own crate.
pub use synth;
// The CPU executor (with its KV cache and f16 helpers): its own crate, over `model`.
pub use cpu_executor::{self as cpu, f16, kv_cache};
// The GPU executor: its settings, the device enum and the KFD topology reader always; the
// executor itself (`strata::gpu`) with `--features gpu`. Its own crate, over `model`.
#[cfg(feature = "gpu")]
pub use gpu_executor as gpu;
#[cfg(feature = "gpu")]
pub use gpu_executor::test_device;
pub use gpu_executor::{Device, kfd, options as gpu_options};
// The kernels' selftest and benchmark (entry points in every build): their own crate.
pub use kernel_tools;

pub use engine::{Engine, RunOptions};
pub use error::EngineError;
