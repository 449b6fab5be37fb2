//! The checkout itself: setup.sh's GPU detection and ROCm-wheel route, the kernel toolchain
//! detection of gpu-executor/build.rs, a repository that needs nothing beside it, and the
//! architecture rules a tool can check.
mod architecture_rules;
mod kernel_toolchain;
mod repo_self_contained;
mod setup_detect;
