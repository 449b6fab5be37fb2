#!/usr/bin/env bash
# Strata against llama.cpp on the CPU, side by side in one run (the VM's noise is large: compare
# figures from the same run only). docs/performance.md keeps only figures from this command.
#
#   scripts/bench_vs_llamacpp.sh [--rounds N] [--threads T] [--pp P] [--tg G] [--cpu-gemm M[,M]] [MODEL...]
#
# Models: names `strata fetch --list` knows or GGUF paths; default the three of issue 16
# (gemma3-270m, smollm2-135m, qwen2.5-coder-0.5b), fetched on first use. Defaults: 5 rounds,
# 2 threads, pp 512, tg 128. Each round runs Strata (with `--cpu-gemm llama`, the default
# kernels, and `tiles`, unless --cpu-gemm names one), llama.cpp with flash attention off, on,
# and off with --no-mmap (scripts/bench_vs_llamacpp.py says how each is measured).
#
# llama.cpp is PyPI's llama-cpp-python 0.3.36, built from source once by scripts/llamacpp-venv.sh
# (~10-20 min on 2 cores; it says how AMX machines are handled).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5 threads=2 pp=512 tg=128 gemm=llama,tiles models=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --pp) pp=$2; shift 2 ;;
    --tg) tg=$2; shift 2 ;;
    --cpu-gemm) gemm=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) models+=("$1"); shift ;;
  esac
done
[ ${#models[@]} -gt 0 ] || models=(gemma3-270m smollm2-135m qwen2.5-coder-0.5b)

cargo build --release -q -p strata
strata="${CARGO_TARGET_DIR:-target}/release/strata"
paths=()
for m in "${models[@]}"; do
  if [ -f "$m" ]; then paths+=("$m"); else paths+=("$("$strata" fetch "$m")"); fi
done

python=$(scripts/llamacpp-venv.sh)

echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), strata $(git rev-parse --short HEAD)"
exec python3 scripts/bench_vs_llamacpp.py --strata "$strata" --python "$python" \
  --rounds "$rounds" --threads "$threads" --pp "$pp" --tg "$tg" --cpu-gemm "$gemm" --models "${paths[@]}"
