//! The `strata` binary end to end on the CPU: its commands, bad input, the MTP and Flash-Next
//! options, the server's configuration and faults (the same on the software device: `gpu`).
mod cli_bad_input;
mod cli_bad_sizes;
mod cli_commands;
mod cli_default_model;
mod cli_gguf;
pub(crate) mod cli_mtp;
mod cli_plan;
pub(crate) mod cli_qwen4exp;
mod cli_serve_reuse;
mod cli_server_config;
pub(crate) mod server_faults;
