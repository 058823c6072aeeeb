#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine: installs what the
# workspace build needs, builds llama.cpp's Vulkan backend module (run on
# Mesa's software driver), starts a PostgreSQL server on loopback for the
# queue's second driver, builds an S3-compatible server and installs
# Azurite for the object-store tests, then runs the format check, clippy,
# builds the book (docs/) and runs every test.
# Usage: bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# With what the tests drive too (curl, chromium).
FOR_TESTS=1
source scripts/install-build-tools.sh

# llama.cpp is compiled twice from a clean checkout (llama-cpp-sys-2's CMake
# build with every x86 CPU variant, and the Vulkan module): about 20 minutes
# on 2 cores. ccache keeps the objects between runs on one machine; with the
# checkout as its base directory, paths inside it count relative to it, so a
# fresh clone elsewhere hits the same entries.
export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
export CCACHE_BASEDIR=$PWD

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> the Vulkan backend module, and Mesa's software Vulkan driver to run it"
# The GPU code path (offload, KV on the device, logits read back) runs in the
# tests on lavapipe; see tests/tests/devices.rs.
bash scripts/build-backend.sh vulkan >/dev/null
export CORTEX_REQUIRE_VULKAN=1

echo "==> python env (the openai package, to validate output shapes)"
CORTEX_TEST_PYTHON=$(bash scripts/python-env.sh)
export CORTEX_TEST_PYTHON

echo "==> python env of the clients people use for tools (LangChain, instructor, LiteLLM)"
CORTEX_TEST_CLIENTS_PYTHON=$(bash scripts/clients-env.sh)
export CORTEX_TEST_CLIENTS_PYTHON CORTEX_REQUIRE_CLIENTS=1

echo "==> llama.cpp's source (its 70 chat templates, which the chat-template tests render)"
CORTEX_LLAMA_CPP_SOURCE=$(NO_INSTALL=1 NO_BUILD=1 bash scripts/build-peers.sh)/llama_cpp_python-0.3.36/vendor/llama.cpp
export CORTEX_LLAMA_CPP_SOURCE CORTEX_REQUIRE_LLAMA_CPP_SOURCE=1

echo "==> an S3-compatible server (s3s-fs), which the object-store tests start on loopback"
CORTEX_TEST_S3_SERVER=$(bash scripts/s3-server.sh)
export CORTEX_TEST_S3_SERVER CORTEX_REQUIRE_S3=1
echo "==> Azurite (Azure Storage's emulator), which the object-store tests start on loopback"
CORTEX_TEST_AZURITE=$(bash scripts/azurite.sh)
export CORTEX_TEST_AZURITE CORTEX_REQUIRE_AZURITE=1

echo "==> PostgreSQL on loopback (the queue's second driver)"
PG_DIR=$(mktemp -d /tmp/cortex-test-pg.XXXXXX)
trap 'bash scripts/postgres.sh stop "$PG_DIR" || true; rm -rf "$PG_DIR"' EXIT
CORTEX_TEST_POSTGRES=$(bash scripts/postgres.sh start "$PG_DIR" "${CORTEX_TEST_PG_PORT:-55439}")
export CORTEX_TEST_POSTGRES CORTEX_REQUIRE_POSTGRES=1
# The process tests restart it to check that workers reconnect.
export CORTEX_TEST_POSTGRES_DIR=$PG_DIR

echo "==> the book (docs/ with mdBook; tidy checks its links, a test parses its commands)"
bash scripts/book.sh >/dev/null

echo "==> cargo test"
# The serde feature of cortex-request is switched on so its round-trip tests run.
cargo test --workspace --locked --no-fail-fast --features cortex-request/serde
