//! The `strata` binary: parse the command line and hand over to `strata::cli::run`.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = strata::cli::Cli::parse();
    match strata::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", strata::cli::error_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
