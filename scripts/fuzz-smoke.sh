#!/usr/bin/env bash
# CI smoke test of the fuzz targets (fuzz/, docs/reliability.md): builds every target and runs
# each one for a short, bounded time on a copy of its committed corpus (fuzz/corpus/<target>;
# the tree is not touched). Fails on any crash, panic, timeout (a unit over 10 s) or
# out-of-memory (over 2 GB), printing how to reproduce it.
#
#   scripts/fuzz-smoke.sh [SECONDS_PER_TARGET]      default 10 ($FUZZ_SMOKE_SECS)
#
# Build: cargo-fuzz's instrumentation (libFuzzer, sancov coverage, cfg(fuzzing), debug
# assertions and overflow checks) applied with plain cargo, so CI needs no cargo-fuzz, but
# without AddressSanitizer, at opt-level 1 and 16 codegen units to keep a cold build short.
# The long runs in docs/reliability.md use `cargo fuzz run` (ASan + LeakSanitizer, opt-level
# 3). Target dir: fuzz/target/smoke. The tokenizer targets read the synthetic models of
# testdata/reference (scripts/make-testdata.sh) and the cached test models when present.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-${FUZZ_SMOKE_SECS:-10}}
triple=$(rustc -vV | sed -n 's/^host: //p')
target_dir="$root/fuzz/target/smoke"

# target and -max_len, as in the long runs
targets=(
  "gguf_reader 8192" "gguf_split 8192" "tokenizer_encode 4096" "tokenizer_chat 2048"
  "serve_protocol 4096" "http_request 4096" "emulator_loader 8192" "expert_profile 4096"
)

t0=$(date +%s)
echo "==> fuzz smoke: building ${#targets[@]} targets ($target_dir)"
(
  cd "$root/fuzz"
  RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-simplifycfg-branch-fold-threshold=0 \
--cfg fuzzing -Cdebug-assertions" \
  CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
    cargo build --quiet --release --bins --target "$triple" --target-dir "$target_dir"
)
t1=$(date +%s)
echo "==> fuzz smoke: built in $((t1 - t0)) s; running each target ${secs} s"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
for spec in "${targets[@]}"; do
  set -- $spec
  t=$1 max_len=$2
  bin="$target_dir/$triple/release/$t"
  mkdir -p "$tmp/corpus/$t" "$tmp/artifacts"
  cp "$root/fuzz/corpus/$t"/* "$tmp/corpus/$t/"
  log="$tmp/$t.log"
  status=0
  "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len="$max_len" \
    -artifact_prefix="$tmp/artifacts/$t-" -print_final_stats=1 "$tmp/corpus/$t" >"$log" 2>&1 &
  pid=$!
  wait $pid || status=$?
  rm -rf "/dev/shm/strata-fuzz-split-$pid" "${TMPDIR:-/tmp}/strata-fuzz-split-$pid"
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
  if [ $status -ne 0 ] || [ -z "$done_line" ]; then
    failed=1
    echo "FAIL $t (exit $status):"
    grep -E 'panicked|ERROR|SUMMARY|Slowest|out-of-memory|timeout' -A4 "$log" | head -30 || tail -30 "$log"
    for a in "$tmp/artifacts/$t-"*; do
      [ -e "$a" ] || continue
      mkdir -p "$root/fuzz/artifacts/$t"
      cp "$a" "$root/fuzz/artifacts/$t/"
      echo "  input kept: fuzz/artifacts/$t/$(basename "$a")"
      echo "  reproduce:  cd fuzz && cargo fuzz run $t artifacts/$t/$(basename "$a")"
    done
  else
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    cov=$(echo "$done_line" | sed -n 's/.*cov: \([0-9]*\) ft: \([0-9]*\).*/cov \1 ft \2/p')
    printf 'ok   %-17s %8s runs  %6s exec/s  %s\n' "$t" "$runs" "$rate" "$cov"
  fi
done
echo "==> fuzz smoke: $((t1 - t0)) s build + $(($(date +%s) - t1)) s runs"
exit $failed
