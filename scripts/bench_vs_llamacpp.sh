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
# llama.cpp is PyPI's llama-cpp-python 0.3.36, built from source by pip once (~10-20 min on 2
# cores) into ~/.cache/strata/bench-venv with GGML_NATIVE=ON, except on CPUs that report AMX:
# there the VM does not grant the AMX tile state (ldtilecfg faults, llama.cpp crashes on its
# first evaluation), so the build lists the native ISA extensions explicitly, minus AMX.
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
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
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

venv="$HOME/.cache/strata/bench-venv"
if ! "$venv/bin/python" -c "import llama_cpp, numpy" 2>/dev/null; then
  python3 -m venv "$venv"
  if grep -qw amx_tile /proc/cpuinfo; then
    flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    for f in avx_vnni:GGML_AVX_VNNI avx512f:GGML_AVX512 avx512vbmi:GGML_AVX512_VBMI avx512_vnni:GGML_AVX512_VNNI avx512_bf16:GGML_AVX512_BF16; do
      grep -qw "${f%%:*}" /proc/cpuinfo && flags+=" -D${f##*:}=ON"
    done
    flags+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  else
    flags="-DGGML_NATIVE=ON"
  fi
  echo "== building llama-cpp-python 0.3.36 ($flags): 10-20 min, once" >&2
  CMAKE_ARGS="$flags" "$venv/bin/pip" install -q numpy llama-cpp-python==0.3.36
fi

echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), strata $(git rev-parse --short HEAD)"
exec python3 scripts/bench_vs_llamacpp.py --strata "$strata" --python "$venv/bin/python" \
  --rounds "$rounds" --threads "$threads" --pp "$pp" --tg "$tg" --cpu-gemm "$gemm" --models "${paths[@]}"
