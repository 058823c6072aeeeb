#!/usr/bin/env bash
# Builds llama.cpp's own `llama-batched-bench` and `llama-server` from the
# llama.cpp source that ships inside the `llama-cpp-python` sdist, the way
# llama.cpp builds them by default (Release, OpenMP, GGML_NATIVE=OFF) at the
# SIMD level cortex is built for (x86-64-v3: AVX2, FMA, F16C, BMI2).
# For measuring only: nothing of it is committed and no test needs it.
#
# Usage: bash scripts/build-peers.sh [DIR]    (default: target/peers)
# Prints the directory holding the two binaries.
# BUILD_TYPE=RelWithDebInfo builds that type instead (to measure what -O2 -g costs).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-build-tools.sh

version=0.3.36
dir=${1:-target/peers}
build_type=${BUILD_TYPE:-Release}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
src=$dir/llama_cpp_python-$version/vendor/llama.cpp
if [[ ! -d $src ]]; then
    # pip prepares the sdist's metadata with its build backend; give it one.
    python3 -m venv "$dir/venv"
    "$dir/venv/bin/python" -m pip install -q scikit-build-core
    "$dir/venv/bin/python" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
        "llama-cpp-python==$version" -d "$dir" >&2
    tar -xzf "$dir/llama_cpp_python-$version.tar.gz" -C "$dir"
fi
out=$dir/build-$build_type
if [[ ! -x $out/bin/llama-server || ! -x $out/bin/llama-batched-bench ]]; then
    echo "==> building llama-batched-bench and llama-server ($build_type) in $out" >&2
    cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE="$build_type" \
        -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
        -DCMAKE_C_FLAGS=-march=x86-64-v3 -DCMAKE_CXX_FLAGS=-march=x86-64-v3 \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
    cmake --build "$out" --target llama-batched-bench llama-server -j "$(nproc)" >&2
fi
echo "$out/bin"
