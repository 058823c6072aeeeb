#!/usr/bin/env bash
# cortex against llama.cpp's own tools on this machine, back to back in one
# run: llama-batched-bench vs `cortex bench` at B = 1, 16, 64, then whole jobs
# through `cortex run` vs llama-server (-np 16 and -np 64) driven by
# concurrent HTTP clients. Prints every time, the ratios and peak memory.
#
# Usage: bash scripts/bench-peers.sh [options of scripts/bench_peers.py]
#   e.g. --jobs distinct,prefix --batches 1,16,64 --json figures.json
# The peers are built once into target/peers (scripts/build-peers.sh); they are
# for measuring only and never committed. Every job, 3 rounds: about 80 minutes on
# 2 cores (--jobs picks some: distinct,prefix,chat,classify,short,extract,summarise).
set -euo pipefail
cd "$(dirname "$0")/.."
peers=$(bash scripts/build-peers.sh)
echo "==> cargo build --release" >&2
cargo build --release --locked -p cortex-cli >&2
model=$(target/release/cortex models pull 2>/dev/null)
exec python3 scripts/bench_peers.py --cortex target/release/cortex --peers "$peers" --model "$model" "$@"
