#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine: installs what the
# workspace build needs, then runs the format check, clippy and every test.
# Usage: bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/install-build-tools.sh

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> python env (the openai package, to validate output shapes)"
CORTEX_TEST_PYTHON=$(bash scripts/python-env.sh)
export CORTEX_TEST_PYTHON

echo "==> cargo test"
# The serde feature of cortex-request is switched on so its round-trip tests run.
cargo test --workspace --locked --features cortex-request/serde
