#!/usr/bin/env bash
# End-to-end check of `strata server` with the official `openai` Python client.
# Usage: server/tests/openai_e2e.sh STRATA_BINARY [extra `strata server` flags, e.g. -m model.gguf]
# Starts the server on a free port, waits for /health, runs openai_client.py, stops the server.
# Exit code: the client's (non-zero on any failed check or if the server never became healthy).
set -u
bin=${1:?usage: openai_e2e.sh STRATA_BINARY [server flags...]}
shift
here=$(cd "$(dirname "$0")" && pwd)
python3 -c "import openai" 2>/dev/null || python3 -m pip install --quiet openai || exit 1
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
"$bin" server --port "$port" "$@" >"$log" 2>&1 &
pid=$!
trap 'kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 300); do
    if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then
        break
    fi
    if ! kill -0 $pid 2>/dev/null; then
        echo "openai_e2e: server exited:" >&2; cat "$log" >&2; exit 1
    fi
    sleep 0.5
done
python3 "$here/openai_client.py" "http://127.0.0.1:$port/v1"
rc=$?
[ $rc -eq 0 ] || { echo "openai_e2e: server log:" >&2; cat "$log" >&2; }
exit $rc
