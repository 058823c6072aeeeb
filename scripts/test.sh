#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine: installs what the
# workspace build needs, starts a PostgreSQL server on loopback for the
# queue's second backend, then runs the format check, clippy and every test.
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

echo "==> PostgreSQL on loopback (the queue's second backend)"
PG_DIR=$(mktemp -d /tmp/cortex-test-pg.XXXXXX)
trap 'bash scripts/postgres.sh stop "$PG_DIR" || true; rm -rf "$PG_DIR"' EXIT
CORTEX_TEST_POSTGRES=$(bash scripts/postgres.sh start "$PG_DIR" "${CORTEX_TEST_PG_PORT:-55439}")
export CORTEX_TEST_POSTGRES CORTEX_REQUIRE_POSTGRES=1
# The process tests restart it to check that workers reconnect.
export CORTEX_TEST_POSTGRES_DIR=$PG_DIR

echo "==> cargo test"
# The serde feature of cortex-request is switched on so its round-trip tests run.
cargo test --workspace --locked --features cortex-request/serde
