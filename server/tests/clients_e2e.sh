#!/usr/bin/env bash
# End-to-end check of `strata server` with the official `openai` and `anthropic` Python clients.
# Usage: server/tests/clients_e2e.sh STRATA_BINARY [extra `strata server` flags, e.g. -m model.gguf]
# Starts the server on a free port, waits for /health, runs openai_client.py and
# anthropic_client.py (tool calls included; CLIENT_ARGS=--no-tools for a model whose template
# has none), then the CI load test (the `loadtest` binary next to STRATA_BINARY, `--ci`: 8
# clients x 30 s, docs/reliability.md; LOADTEST=0 skips it), stops the server; then starts one
# with --api-key and runs each client's key checks (--api-key KEY --auth-only: a wrong key is a
# 401 AuthenticationError, the right one works; AUTH=0 skips it).
# Exit code: non-zero if a client failed a check or the server never became healthy.
set -u
bin=${1:?usage: clients_e2e.sh STRATA_BINARY [server flags...]}
shift
here=$(cd "$(dirname "$0")" && pwd)
python3 -c "import openai, anthropic" 2>/dev/null || python3 -m pip install --quiet openai anthropic || exit 1
# start_server VAR_PID VAR_PORT VAR_LOG [flags...]: `strata server` on a free port, healthy.
start_server() {
    local -n _pid=$1 _port=$2 _log=$3
    shift 3
    _port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    _log=$(mktemp)
    "$bin" server --port "$_port" "$@" >"$_log" 2>&1 &
    _pid=$!
    for _ in $(seq 1 300); do
        if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$_port/health', timeout=2)" 2>/dev/null; then
            return 0
        fi
        if ! kill -0 "$_pid" 2>/dev/null; then
            echo "clients_e2e: server exited:" >&2; cat "$_log" >&2; return 1
        fi
        sleep 0.5
    done
    echo "clients_e2e: server never became healthy:" >&2; cat "$_log" >&2; return 1
}
pid='' kpid='' log='' klog=''
trap 'for p in $pid $kpid; do kill -INT $p 2>/dev/null; wait $p 2>/dev/null; done; rm -f "$log" "$klog"' EXIT
start_server pid port log "$@" || exit 1
rc=0
# shellcheck disable=SC2086 # CLIENT_ARGS is a list of flags
python3 "$here/openai_client.py" "http://127.0.0.1:$port/v1" ${CLIENT_ARGS:-} || rc=1
# shellcheck disable=SC2086
python3 "$here/anthropic_client.py" "http://127.0.0.1:$port" ${CLIENT_ARGS:-} || rc=1
if [ "${LOADTEST:-1}" != 0 ]; then
    loadtest="$(dirname "$bin")/loadtest"
    if [ -x "$loadtest" ]; then
        "$loadtest" --ci --url "http://127.0.0.1:$port" --server-pid $pid || rc=1
    else
        echo "clients_e2e: $loadtest missing (cargo build --release -p server --bins)" >&2
        rc=1
    fi
fi
[ $rc -eq 0 ] || { echo "clients_e2e: server log:" >&2; cat "$log" >&2; }
if [ "${AUTH:-1}" != 0 ]; then
    kill -INT "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=''
    key="e2e-$RANDOM$RANDOM"
    if start_server kpid kport klog --api-key "$key" "$@"; then
        krc=0
        python3 "$here/openai_client.py" "http://127.0.0.1:$kport/v1" --api-key "$key" --auth-only || krc=1
        python3 "$here/anthropic_client.py" "http://127.0.0.1:$kport" --api-key "$key" --auth-only || krc=1
        [ $krc -eq 0 ] || { rc=1; echo "clients_e2e: server log (--api-key):" >&2; cat "$klog" >&2; }
    else
        rc=1
    fi
fi
exit $rc
