//! The root package's integration tests, one binary with a folder per concern: `models` (the
//! models against llama.cpp's recorded outputs and f64 references), `cli` (the `strata` binary
//! end to end), `setup` (setup.sh, the kernel toolchain, the repository itself) and, only with
//! `--features gpu`, `gpu` (kernels, ops, models and commands on the software device and HIP).
//! `support` holds the helpers they share.
mod cli;
#[cfg(feature = "gpu")]
mod gpu;
mod models;
mod setup;
mod support;
