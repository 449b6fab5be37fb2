//! Load and fault testing of `strata server` (docs/reliability.md): a small HTTP/1.1
//! client that reads responses as they arrive (Server-Sent Events included, de-chunked, with
//! the time of the first token), the request mix of the load test, the load runner with its
//! checks (no failed request, service in arrival order, RSS flat after warm-up), and helpers to
//! run `strata server` as a child process and to sample a process's RSS.
//!
//! The client speaks only what `strata server` sends (HTTP/1.1, `Connection: close`, chunked
//! or sized bodies); it is test tooling, not a general HTTP client. Loopback only.

mod client;
mod process;
mod request;
mod runner;

pub use client::*;
pub use process::*;
pub use request::*;
pub use runner::*;
