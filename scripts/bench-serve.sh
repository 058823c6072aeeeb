#!/usr/bin/env bash
# Online serving, printed (nothing is asserted): streamed chats from 1, 16
# and 64 concurrent clients (tests/python/serve_load.py, the official
# `openai` client) against `cortex serve`, then against llama.cpp's own
# `llama-server` (the same model, threads, 64 slots, continuous batching)
# driven by the same script. Prints throughput and time-to-first-token
# percentiles per row; with --with-batch also cortex with a 2,000-item batch
# job running in the same server.
# Usage: bash scripts/bench-serve.sh [--cortex target/debug/cortex] [--max-tokens 64] [--with-batch]
# llama-server is built once into target/peers (scripts/build-peers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

cortex=target/debug/cortex
max_tokens=64
with_batch=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --cortex) cortex=$2; shift 2 ;;
        --max-tokens) max_tokens=$2; shift 2 ;;
        --with-batch) with_batch=1; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
python=$(bash scripts/python-env.sh)
peers=$(bash scripts/build-peers.sh)
model=$("$cortex" models pull default | tail -1)
threads=$(nproc)
work=$(mktemp -d)
server=
cleanup() { [[ -n $server ]] && kill "$server" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_health() {
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
        sleep 0.2
    done
    echo "server on port $1 did not start" >&2; exit 1
}
rows() {
    local label=$1 url=$2
    for clients in 1 16 64; do
        per_client=$(( clients == 1 ? 4 : (clients == 16 ? 2 : 1) ))
        printf '%-28s ' "$label"
        "$python" tests/python/serve_load.py "$url" "$clients" "$max_tokens" "$per_client"
    done
}

echo "model: $model   threads: $threads   max_tokens: $max_tokens"
p=$(port)
CORTEX_DATA_DIR=$work/cortex CORTEX_MODEL=$model CORTEX_THREADS=$threads \
    "$cortex" serve --port "$p" --parallel 64 --batch-parallel 0 2>"$work/cortex.log" &
server=$!
wait_health "$p"
rows "cortex serve" "http://127.0.0.1:$p"
kill "$server"; wait "$server" 2>/dev/null || true; server=

if [[ $with_batch == 1 ]]; then
    p=$(port)
    "$python" - "$work/batch.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(2000):
        f.write(json.dumps({"custom_id": f"b{i}", "prompt": f"Note {i}: the weather today", "max_tokens": 64}) + "\n")
PY
    CORTEX_DATA_DIR=$work/batch CORTEX_MODEL=$model "$cortex" submit "$work/batch.jsonl" >/dev/null
    CORTEX_DATA_DIR=$work/batch CORTEX_MODEL=$model CORTEX_THREADS=$threads \
        "$cortex" serve --port "$p" --parallel 64 2>"$work/cortex-batch.log" &
    server=$!
    wait_health "$p"
    sleep 5
    rows "cortex serve + batch job" "http://127.0.0.1:$p"
    kill "$server"; wait "$server" 2>/dev/null || true; server=
fi

p=$(port)
"$peers/llama-server" -m "$model" -np 64 -c $((64 * 512)) -t "$threads" -tb "$threads" \
    --host 127.0.0.1 --port "$p" --no-webui >/dev/null 2>"$work/llama.log" &
server=$!
wait_health "$p"
rows "llama-server -np 64" "http://127.0.0.1:$p"
