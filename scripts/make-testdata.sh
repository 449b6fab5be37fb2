#!/usr/bin/env bash
# Regenerates the synthetic test models (random weights, fixed seeds) into testdata/reference/
# and checks them byte for byte against testdata/generated.sha256, the sha256 of the files that
# llama.cpp's reference outputs were recorded on. Idempotent: files that already match are kept.
#
#   scripts/make-testdata.sh [--force]
#
# Needs python3 (a venv with the pinned numpy + gguf of testdata/requirements.txt is made under
# target/testdata-venv, or $STRATA_TESTDATA_VENV) and the vocabulary source of the generators,
# SmolLM2-135M-Instruct (fetched and verified by `strata fetch smollm2-135m`; the strata binary is
# $STRATA_BIN, else target/release/strata, else built with cargo).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ref="$root/testdata/reference"
sums="$root/testdata/generated.sha256"
force=0
[ "${1:-}" = --force ] && force=1

if [ $force = 0 ] && (cd "$ref" && sha256sum --quiet --check "$sums" >/dev/null 2>&1); then
  echo "==> test models: all $(wc -l < "$sums") present and verified"
  exit 0
fi

venv="${STRATA_TESTDATA_VENV:-$root/target/testdata-venv}"
if ! "$venv/bin/python" -c 'import numpy, gguf' 2>/dev/null; then
  echo "==> test models: python venv with $(grep -v '^#' "$root/testdata/requirements.txt" | tr '\n' ' ')in $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$root/testdata/requirements.txt"
fi
py="$venv/bin/python"

strata="${STRATA_BIN:-$root/target/release/strata}"
if [ -x "$strata" ]; then
  vocab=$("$strata" fetch smollm2-135m)
else
  vocab=$(cd "$root" && cargo run --release -q -- fetch smollm2-135m)
fi

echo "==> test models: generating into $ref"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gen_moe="$ref/tiny-qwen3moe/make_tiny_moe.py"
gen_exp="$ref/tiny-qwen4exp/make_tiny_qwen4exp.py"
for dtype in f32 q8_0 mixed; do
  "$py" "$gen_moe" --out "$tmp/tiny-qwen3moe-v1024-$dtype.gguf" --dtype "$dtype" --vocab 1024 --vocab-src "$vocab" >/dev/null
done
"$py" "$gen_exp" --out "$tmp/tiny-qwen4exp-public-f32.gguf" --dtype f32 --vocab-src "$vocab" >/dev/null
"$py" "$gen_exp" --out "$tmp/tiny-qwen4exp-public-q8_0-split.gguf" --dtype q8_0 --split-ple --vocab-src "$vocab" >/dev/null
mv "$tmp"/tiny-qwen3moe-*.gguf "$ref/tiny-qwen3moe/"
mv "$tmp"/tiny-qwen4exp-*.gguf "$ref/tiny-qwen4exp/"

if ! (cd "$ref" && sha256sum --quiet --check "$sums"); then
  echo "make-testdata.sh: the generated models differ from the recorded references (sha256 above);" >&2
  echo "  check the numpy/gguf versions in $venv against testdata/requirements.txt" >&2
  exit 1
fi
echo "==> test models: $(wc -l < "$sums") generated and verified against testdata/generated.sha256"
