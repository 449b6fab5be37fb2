//! Run the HTTP server on its own, as `strata server` does:
//! `cargo run -p server --example serve -- --config strata.json` (any `ServerConfig` flag works).
//! Useful with `--engine <path to target/release/fake_engine>` to try clients without a model.

use clap::Parser;

#[derive(Parser)]
#[command(about = "Strata's OpenAI-compatible HTTP server (standalone)")]
struct Cli {
    #[command(flatten)]
    server: server::ServerConfig,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    server::run_server(Cli::parse().server).await
}
