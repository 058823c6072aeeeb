#!/usr/bin/env bash
# The main job on a fresh Debian machine: installs the build tools when
# missing, builds the release binary, fetches the default model on first use,
# and runs the bundled example job, printing where the results are.
# Usage: bash scripts/run-example.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-build-tools.sh
cargo run --release --locked -p cortex-cli -- run examples/prompts.jsonl
