#!/usr/bin/env bash
# End to end: `strata server` starts the real engine (`strata --serve`) on the default model and
# the official `openai` Python client checks streaming and non-streaming chat and completions.
# Needs: target/release/strata built, the default model cached (any strata command fetches it),
# `pip install openai`.
set -euo pipefail
cd "$(dirname "$0")/.."
strata="$PWD/target/release/strata"
model="${STRATA_MODEL_DIR:-$HOME/.cache/strata/models}/gemma-3-270m-q4_k_m.gguf"
[ -f "$model" ] || "$strata" tokenize -p "fetch" >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
cfg="$dir/strata.json"
printf '{"engine":{"executable":"%s","args":["-m","%s","--threads","2"]},"tokenizer":"%s","model_name":"gemma3-270m","host":"127.0.0.1","port":%s}\n' \
  "$strata" "$model" "$model" "$port" > "$cfg"
"$strata" server --config "$cfg" > "$dir/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { echo "server exited early:"; cat "$dir/server.log"; exit 1; }
  sleep 0.5
done
if ! python3 server/tests/openai_client.py "http://127.0.0.1:$port/v1"; then
  echo "--- server log"; cat "$dir/server.log"; exit 1
fi
echo "openai e2e: ok"
