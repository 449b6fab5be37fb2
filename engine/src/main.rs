//! The `strata` binary: parse the command line and hand over to `strata::cli::run`.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, FromArgMatches};

fn main() -> std::process::ExitCode {
    let cli = parse();
    match strata::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", strata::cli::error_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Parses the command line. A negative number reaches the option's own parser, so `-n -1`
/// says what the option takes instead of clap's `unexpected argument '-1'`.
fn parse() -> strata::cli::Cli {
    let cmd = negative_numbers_are_values(strata::cli::Cli::command());
    let matches = cmd.try_get_matches().unwrap_or_else(|e| explain_negative(e).exit());
    strata::cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn negative_numbers_are_values(cmd: clap::Command) -> clap::Command {
    cmd.allow_negative_numbers(true).mut_subcommands(negative_numbers_are_values)
}

/// Unsigned options fail on a negative value with the integer parser's "invalid digit found in
/// string"; say instead what the option accepts.
fn explain_negative(e: clap::Error) -> clap::Error {
    let negative = matches!(e.get(ContextKind::InvalidValue), Some(ContextValue::String(v)) if v.starts_with('-'));
    if e.kind() != ErrorKind::ValueValidation || !negative {
        return e;
    }
    let text = e
        .render()
        .to_string()
        .replace("invalid digit found in string", "a negative number, but this option takes a whole number >= 0");
    clap::Error::raw(ErrorKind::ValueValidation, text.trim_start_matches("error: "))
}
