#!/usr/bin/env bash
# Asks every candidate chat model the same questions (greedy, with its chat template) and prints
# the answers and speeds as a markdown section: the evidence behind the default model
# (docs/models.md). Usage: scripts/compare-models.sh [MODEL_NAME ...] (default: the chat models
# of `strata fetch --list`). Each model is fetched on first use.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
strata="${STRATA_BIN:-$root/target/release/strata}"
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(qwen2.5-coder-0.5b smollm2-135m)
questions=(
  "What is the capital of France? Answer in one sentence."
  "What is 12 times 7?"
  "Why is the sky blue? Answer in two sentences."
  "Write a Python function that returns the reverse of a string."
  "Translate 'good morning' into Spanish."
  "Name three planets of the solar system."
  "Which is heavier, a kilogram of iron or a kilogram of feathers?"
)
for m in "${models[@]}"; do
  path=$("$strata" fetch "$m")
  echo "### $m"
  echo
  for q in "${questions[@]}"; do
    err=$(mktemp)
    answer=$("$strata" generate -m "$path" --chat -p "$q" -n 128 --temp 0 2>"$err")
    echo "**Q: $q**"
    echo
    printf '%s\n' "$answer" | sed 's/^/> /'
    echo
    echo "_$(grep -o '\[.*\]' "$err" | tail -1)_"
    echo
    rm -f "$err"
  done
  echo "\`strata bench -m $m --pp 128 --tg 32 --reps 3\`:"
  echo
  "$strata" bench -m "$path" --pp 128 --tg 32 --reps 3 2>/dev/null | sed 's/^/    /'
  echo
done
