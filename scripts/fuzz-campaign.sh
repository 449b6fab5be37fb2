#!/usr/bin/env bash
# Long fuzz campaign (issue 14 item 1, docs/reliability.md "Measured runs"): builds every target
# exactly as `cargo fuzz run` does (cargo-fuzz's default build: release, debug assertions and
# overflow checks, AddressSanitizer + LeakSanitizer, cfg(fuzzing), fuzz/target/<triple>/release)
# and runs each one until it reaches 10 million executions or its time cap, on a scratch copy of
# its committed corpus (fuzz/corpus/<target> is not touched).
#
#   nice -n 19 scripts/fuzz-campaign.sh [TOTAL_SECONDS] [TARGET...]
#
# TOTAL_SECONDS (default 6300, $FUZZ_CAMPAIGN_SECS) is the CPU time of the whole campaign (one
# core). Targets run one after the other, cheap ones first; each gets an equal share of what is
# left (so time a cheap target does not need goes to the later ones), at most 3600 s. The cap
# is CPU time, not wall time, because the campaign runs under `nice -n 19` on a machine others
# build on: a watcher sends SIGINT (libFuzzer prints its final stats, exits 72) once the target
# has used its share; -max_total_time (3x the share) only bounds the wall time of a starved run.
# With explicit TARGETs, summary.tsv is appended to (a campaign resumed), else rewritten.
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
if [ $# -eq 0 ] || [ ! -e "$summary" ]; then
  printf 'target\truns\twall_s\tcpu_s\texec_per_wall_s\truns_per_cpu_s\tpeak_rss_mb\tcorpus_before\tcorpus_after\tnew_units\tartifacts\tresult\tcommand\n' >"$summary"
fi
hz=$(getconf CLK_TCK)
# CPU seconds (user + system, all threads) of a live process.
cpu_of() { awk -v hz="$hz" '{ sub(/^.*\) /, ""); printf "%d", ($12 + $13) / hz }' "/proc/$1/stat" 2>/dev/null || echo 0; }

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
  args=(-runs=$runs_goal -max_total_time=$((3 * cap)) -rss_limit_mb=2048 -timeout=10 -max_len=$max_len
    -artifact_prefix="$arts/" -print_final_stats=1 "$corpus")
  # The same run through cargo-fuzz (it adds -artifact_prefix=artifacts/<target>/ itself):
  cmd="cargo fuzz run $t campaign/$t.corpus -- ${args[*]:0:5} -print_final_stats=1"
  echo "==> $t: cap ${cap} CPU s, goal ${runs_goal} runs"
  s0=$(date +%s.%N)
  ( cd "$root/fuzz" && exec "$bin" "${args[@]}" ) >"$log" 2>&1 &
  pid=$!
  cpu=0
  stopped=""
  while kill -0 $pid 2>/dev/null; do
    sleep 2
    c=$(cpu_of $pid)
    [ "$c" -gt 0 ] && cpu=$c
    if [ -z "$stopped" ] && [ "$cpu" -ge "$cap" ]; then
      stopped="CPU cap"
      kill -INT $pid 2>/dev/null
    fi
  done
  wait $pid
  status=$?
  s1=$(date +%s.%N)
  rm -rf "/dev/shm/strata-fuzz-split-$pid" "${TMPDIR:-/tmp}/strata-fuzz-split-$pid"
  secs=$(echo "$s1 - $s0" | bc)
  used=$((used + cpu + 1))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
  newu=$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -1)
  after=$(ls "$corpus" | wc -l)
  narts=$(ls "$arts" | wc -l)
  per_cpu=$(( ${runs:-0} / (cpu > 0 ? cpu : 1) ))
  # libFuzzer exits 72 when interrupted (our CPU cap), after printing its final stats.
  if [ -n "$stopped" ] && [ $status -eq 72 ] && grep -q 'run interrupted' "$log"; then status=0; fi
  if [ $status -eq 0 ] && [ "$narts" -eq 0 ] && { grep -qE '^#[0-9]+[[:space:]]+DONE' "$log" || [ -n "$stopped" ]; }; then
    if [ -n "$stopped" ]; then result="ok (stopped at its CPU cap)"
    elif [ "${runs:-0}" -ge $runs_goal ]; then result="ok (10M runs)"
    else result="ok (wall-time limit)"; fi
  else
    result="FAIL(exit $status)"
  fi
  {
    echo
    echo "==== campaign summary: $t"
    echo "command:        $cmd"
    echo "binary:         $bin ${args[*]}"
    echo "git:            $(git -C "$root" rev-parse HEAD)"
    echo "CPU cap s:      $cap"
    echo "wall s:         $secs"
    echo "CPU s:          $cpu (runs per CPU s: $per_cpu)"
    echo "runs:           ${runs:-?}"
    echo "exec/s:         ${rate:-?}"
    echo "peak RSS MB:    ${rss:-?}"
    echo "corpus:         $before -> $after files (new units added: ${newu:-?})"
    echo "artifacts:      $narts $(ls "$arts" | tr '\n' ' ')"
    echo "result:         $result"
  } >>"$log"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "${runs:-?}" "$secs" "$cpu" "${rate:-?}" \
    "$per_cpu" "${rss:-?}" "$before" "$after" "${newu:-?}" "$narts" "$result" "$cmd" >>"$summary"
  echo "    $t: ${runs:-?} runs in ${secs} s wall, $cpu s CPU, ${rate:-?} exec/s, peak ${rss:-?} MB, corpus $before -> $after, $result"
done
echo "==> fuzz campaign done: ${used} CPU s of fuzzing; $summary"
