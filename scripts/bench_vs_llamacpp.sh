#!/usr/bin/env bash
# Side-by-side CPU speed of Strata and llama.cpp on the same model, threads and machine, in one
# run (the VM's noise is large: compare numbers from the same run only).
#   scripts/bench_vs_llamacpp.sh [MODEL.gguf] [THREADS]
# llama.cpp comes from PyPI's llama-cpp-python (built from source by pip: ~10-20 min on 2 cores,
# once, into a venv under ~/.cache/strata/bench-venv). Both sides measure the same thing:
# pp = one evaluation of 512 prompt tokens on an empty cache, tg = 128 single-token steps;
# 3 runs after a warm-up, min and median tokens/s, and peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-${STRATA_MODEL_DIR:-$HOME/.cache/strata/models}/gemma-3-270m-q4_k_m.gguf}"
threads="${2:-2}"
cargo build --release -q
strata=target/release/strata
[ -f "$model" ] || "$strata" tokenize -p warm-up >/dev/null
venv="$HOME/.cache/strata/bench-venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  CMAKE_ARGS="-DGGML_NATIVE=ON" "$venv/bin/pip" install -q llama-cpp-python==0.3.36
fi
echo "== strata ($threads threads)"
"$strata" bench -m "$model" --threads "$threads" --pp 512 --tg 128 --reps 3 --json
# llama.cpp twice: flash attention off (its default here) and on (its fastest prompt path).
for fa in 0 1; do
echo "== llama.cpp via llama-cpp-python ($threads threads, flash_attn=$fa)"
"$venv/bin/python" - "$model" "$threads" "$fa" <<'PY'
import json, resource, statistics, sys, time
import numpy as np
from llama_cpp import Llama
model, threads, fa = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
llm = Llama(model_path=model, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=threads, flash_attn=fa, verbose=False)
toks = [2] + [(i * 7919) % 200000 + 1000 for i in range(511)]
def pp():
    llm.reset(); t = time.perf_counter(); llm.eval(toks); return 512 / (time.perf_counter() - t)
def tg():
    llm.reset(); llm.eval(toks[:8]); t = time.perf_counter()
    for _ in range(128):
        llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
    return 128 / (time.perf_counter() - t)
pp(); tg()
p = [pp() for _ in range(3)]; g = [tg() for _ in range(3)]
print(json.dumps({"threads": threads, "flash_attn": fa, "pp_min": min(p), "pp_median": statistics.median(p),
                  "tg_min": min(g), "tg_median": statistics.median(g),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
PY
done
