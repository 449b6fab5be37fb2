//! Integration tests of the `server` crate (one binary): the token protocol and the HTTP server
//! against the fake engine (`src/bin/fake_engine.rs`).

mod anthropic;
mod auth;
mod bad_lines;
mod config;
mod faults;
mod http;
mod limits;
mod metrics;
mod protocol;
mod second_round;
mod status;
mod support;
mod tools;
mod web;
