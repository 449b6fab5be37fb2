#!/usr/bin/env bash
# Prints the python of a venv holding llama.cpp (PyPI's llama-cpp-python 0.3.36, built from
# source by pip, ~10-20 min on 2 cores, once), numpy and gguf-py: the peer of the benchmarks and the
# quantizer of the real-weight tests. The venv is ~/.cache/strata/bench-venv
# ($STRATA_LLAMACPP_VENV); all build output goes to stderr.
#
# GGML_NATIVE=ON (and without the multimodal part), except on CPUs that report AMX: there the VM does not grant the AMX tile state
# (ldtilecfg faults, llama.cpp crashes on its first evaluation), so the build lists the native
# ISA extensions explicitly, minus AMX.
set -euo pipefail
venv="${STRATA_LLAMACPP_VENV:-$HOME/.cache/strata/bench-venv}"
if ! "$venv/bin/python" -c "import llama_cpp, numpy, gguf" 2>/dev/null; then
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
  flags+=" -DLLAVA_BUILD=OFF"   # the multimodal library (mtmd): not used here
  echo "==> building llama-cpp-python 0.3.36 ($flags) into $venv: 10-20 min, once" >&2
  CMAKE_ARGS="$flags" "$venv/bin/pip" install -q --disable-pip-version-check numpy gguf==0.19.0 llama-cpp-python==0.3.36 >&2
fi
echo "$venv/bin/python"
