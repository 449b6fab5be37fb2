//! Strata engine: models, KV cache, sampling, serving; backends over the `cpu-kernels` crate
//! and (with `--features gpu`) the gfx11 kernels.
#[cfg(feature = "gpu")]
pub mod gpu;
