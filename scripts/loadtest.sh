#!/usr/bin/env bash
# The load test of `strata server` on the default model (docs/reliability.md).
#   scripts/loadtest.sh                 # the full measurement: 32 clients x 300 s
#   scripts/loadtest.sh --ci            # the CI run: 8 clients x 30 s
#   scripts/loadtest.sh --clients 16 --seconds 60 --max-tokens 24   # any loadtest flag
# Builds the loadtest binary (cargo build --release -p server --bins; target/release/strata is
# used as built, e.g. by ./setup.sh), fetches the default model if missing, starts
# `strata server --port 0 -m MODEL` on loopback, runs the clients, prints the figures and writes
# the whole report (RSS samples included) to target/loadtest/report-<time>.json.
# Exit status: 0 pass, 1 a check failed (failed requests, order, RSS growth), 2 could not run.
set -eu
cd "$(dirname "$0")/.."
strata=target/release/strata
[ -x "$strata" ] || { echo "loadtest.sh: $strata missing: build it first (./setup.sh or cargo build --release)" >&2; exit 2; }
cargo build --release -p server --bins
model=$("$strata" fetch)
mkdir -p target/loadtest
out=target/loadtest/report-$(date +%Y%m%d-%H%M%S).json
echo "loadtest.sh: report -> $out" >&2
exec target/release/loadtest --strata "$strata" --json "$out" "$@" -- -m "$model"
