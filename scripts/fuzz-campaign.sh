#!/usr/bin/env bash
# Long fuzz campaign (issue 14 item 1, docs/reliability.md "Measured runs"): builds every target
# exactly as `cargo fuzz run` does (cargo-fuzz's default build: release, debug assertions and
# overflow checks, AddressSanitizer + LeakSanitizer, cfg(fuzzing), fuzz/target/<triple>/release)
# and runs each one until it reaches 10 million executions or its time cap, on a scratch copy of
# its committed corpus (fuzz/corpus/<target> is not touched).
#
#   nice -n 19 scripts/fuzz-campaign.sh [TOTAL_SECONDS] [TARGET...]
#
# TOTAL_SECONDS (default 6300, $FUZZ_CAMPAIGN_SECS) is the fuzzing time of the whole campaign on
# one core. Targets run one after the other, cheap ones first; each gets an equal share of what
# is left (so time a cheap target does not need goes to the later ones), at most 3600 s.
#
# Output, in fuzz/campaign/ (gitignored):
#   <target>.log       libFuzzer's output, then a summary block (command, runs, time, exec/s,
#                      peak RSS, corpus before/after, crashes)
#   <target>.corpus/   the scratch corpus (seeds + what libFuzzer added)
#   <target>.artifacts/ crash, timeout, leak and OOM inputs, if any
#   summary.tsv        one line per target
# Needs cargo-fuzz (`cargo install cargo-fuzz`; 0.13.2 here).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
total=${1:-${FUZZ_CAMPAIGN_SECS:-6300}}
shift || true
triple=$(rustc -vV | sed -n 's/^host: //p')
out="$root/fuzz/campaign"
runs_goal=10000000

# target and -max_len (as scripts/fuzz-smoke.sh), cheapest first
all=(
  "expert_profile 4096" "serve_protocol 4096" "tokenizer_encode 4096" "http_request 4096"
  "tokenizer_chat 2048" "emulator_loader 8192" "gguf_split 8192" "gguf_reader 8192"
)
targets=()
if [ $# -gt 0 ]; then
  for want in "$@"; do
    for spec in "${all[@]}"; do [ "${spec%% *}" = "$want" ] && targets+=("$spec"); done
  done
else
  targets=("${all[@]}")
fi

mkdir -p "$out"
summary="$out/summary.tsv"
printf 'target\truns\tseconds\texec_per_s\tpeak_rss_mb\tcorpus_before\tcorpus_after\tnew_units\tartifacts\tresult\tcommand\n' >"$summary"

echo "==> fuzz campaign: cargo fuzz build ($(cargo fuzz --version)), $(git -C "$root" rev-parse --short HEAD)"
b0=$(date +%s)
(cd "$root/fuzz" && cargo fuzz build) || { echo "build failed"; exit 1; }
echo "==> built in $(($(date +%s) - b0)) s; fuzzing budget ${total} s for ${#targets[@]} targets"

used=0
i=0
n=${#targets[@]}
for spec in "${targets[@]}"; do
  set -- $spec
  t=$1 max_len=$2
  left=$((total - used))
  cap=$((left / (n - i)))
  [ $cap -gt 3600 ] && cap=3600
  [ $cap -lt 60 ] && cap=60
  i=$((i + 1))
  bin="$root/fuzz/target/$triple/release/$t"
  corpus="$out/$t.corpus"
  arts="$out/$t.artifacts"
  log="$out/$t.log"
  rm -rf "$corpus" "$arts"
  mkdir -p "$corpus" "$arts"
  cp "$root/fuzz/corpus/$t"/* "$corpus/"
  before=$(ls "$corpus" | wc -l)
  args=(-runs=$runs_goal -max_total_time=$cap -rss_limit_mb=2048 -timeout=10 -max_len=$max_len
    -artifact_prefix="$arts/" -print_final_stats=1 "$corpus")
  # The same run through cargo-fuzz (it adds -artifact_prefix=artifacts/<target>/ itself):
  cmd="cargo fuzz run $t campaign/$t.corpus -- ${args[*]:0:5} -print_final_stats=1"
  echo "==> $t: cap ${cap} s, goal ${runs_goal} runs"
  s0=$(date +%s.%N)
  ( cd "$root/fuzz" && exec "$bin" "${args[@]}" ) >"$log" 2>&1 &
  pid=$!
  wait $pid
  status=$?
  s1=$(date +%s.%N)
  rm -rf "/dev/shm/strata-fuzz-split-$pid" "${TMPDIR:-/tmp}/strata-fuzz-split-$pid"
  secs=$(echo "$s1 - $s0" | bc)
  used=$((used + ${secs%.*} + 1))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
  newu=$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -1)
  after=$(ls "$corpus" | wc -l)
  narts=$(ls "$arts" | wc -l)
  if [ $status -eq 0 ] && [ "$narts" -eq 0 ] && grep -qE '^#[0-9]+[[:space:]]+DONE' "$log"; then
    result=ok
  else
    result="FAIL(exit $status)"
  fi
  {
    echo
    echo "==== campaign summary: $t"
    echo "command:        $cmd"
    echo "binary:         $bin ${args[*]}"
    echo "git:            $(git -C "$root" rev-parse HEAD)"
    echo "time cap s:     $cap"
    echo "wall s:         $secs"
    echo "runs:           ${runs:-?}"
    echo "exec/s:         ${rate:-?}"
    echo "peak RSS MB:    ${rss:-?}"
    echo "corpus:         $before -> $after files (new units added: ${newu:-?})"
    echo "artifacts:      $narts $(ls "$arts" | tr '\n' ' ')"
    echo "result:         $result"
  } >>"$log"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "${runs:-?}" "$secs" "${rate:-?}" \
    "${rss:-?}" "$before" "$after" "${newu:-?}" "$narts" "$result" "$cmd" >>"$summary"
  echo "    $t: ${runs:-?} runs in ${secs} s, ${rate:-?} exec/s, peak ${rss:-?} MB, corpus $before -> $after, $result"
done
echo "==> fuzz campaign done: ${used} s of fuzzing; $summary"
