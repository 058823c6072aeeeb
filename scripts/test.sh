#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine: installs what the
# workspace build needs, then runs the format check, clippy and every test.
# Usage: bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v clang >/dev/null 2>&1 || missing+=(clang)
# bindgen (llama-cpp-sys-2) loads libclang at build time.
ldconfig -p 2>/dev/null | grep -q 'libclang[-.0-9]*\.so' || missing+=(libclang-dev)
if ((${#missing[@]})); then
    echo "==> installing ${missing[*]}"
    if [[ $(id -u) -eq 0 ]]; then sudo=(); else sudo=(sudo); fi
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> cargo test"
# The serde feature of cortex-request is switched on so its round-trip tests run.
cargo test --workspace --locked --features cortex-request/serde
