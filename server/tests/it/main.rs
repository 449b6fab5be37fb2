//! Integration tests of the `server` crate (one binary): the token protocol and the HTTP server
//! against the fake engine (`src/bin/fake_engine.rs`).

mod anthropic;
mod auth;
mod bad_lines;
mod faults;
mod http;
mod protocol;
mod support;
mod tools;
