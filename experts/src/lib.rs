//! Routed experts of MoE models, for expert tiering (issue 12): where their bytes live
//! ([`source`]: served in place from the GGUF shards, mapped or in RAM) and which of them a
//! cache should hold ([`profile`]: the STRP v1 profile format of `--expert-profile`;
//! [`trace`]: routing traces; [`policy`]: residency policies and their simulator).
//! The VRAM cache, the CPU pool for misses and the per-layer handoff build on these.

pub mod counters;
pub mod plan;
pub mod policy;
pub mod profile;
pub mod source;
pub mod trace;

pub use profile::{Profile, ProfileError, Table};
pub use source::{
    ExpertError, ExpertMatrix, ExpertSource, ExpertView, RAM_HEADROOM, Residency, SourceOptions, mem_available,
    ram_budget,
};
