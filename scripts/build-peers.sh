#!/usr/bin/env bash
# Builds llama.cpp's own `llama-batched-bench` and `llama-server` (and
# `llama-quantize`, which scripts/sized_model.py --via-quantize runs) from the
# llama.cpp source that ships inside the `llama-cpp-python` sdist, the best
# way for this machine: Release, OpenMP, GGML_NATIVE=ON (every instruction
# this CPU has: AVX-512, VNNI, ...). For measuring only: nothing of it is
# committed and no test needs it.
#
# Usage: bash scripts/build-peers.sh [DIR]    (default: target/peers)
# Prints the directory holding the two binaries.
#   PEER_CPU=x86-64-v3          build for AVX2 instead (cortex's build before
#                               its CPU backend became run-time variants)
#   PEER_CPU=alderlake          build for AVX2 with AVX-VNNI (256-bit VNNI, no
#                               AVX-512: Alder Lake, Sierra Forest)
#   PEER_GPU=cuda               build with CUDA too (CUDA_ARCHITECTURES=90, ...)
#   LLAMA_CPP_PYTHON_SDIST=F    the sdist file, where nothing can be downloaded
#   NO_BUILD=1                  only fetch and unpack the source
#   BUILD_TYPE=RelWithDebInfo   builds that type instead (to measure what -O2 -g costs).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -n ${NO_INSTALL:-} ]] || source scripts/install-build-tools.sh

version=0.3.36
dir=${1:-target/peers}
build_type=${BUILD_TYPE:-Release}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
src=$dir/llama_cpp_python-$version/vendor/llama.cpp
if [[ ! -d $src ]]; then
    if [[ -n ${LLAMA_CPP_PYTHON_SDIST:-} ]]; then
        cp "$LLAMA_CPP_PYTHON_SDIST" "$dir/"
    else
        # pip prepares the sdist's metadata with its build backend; give it one.
        python3 -m venv "$dir/venv"
        "$dir/venv/bin/python" -m pip install -q scikit-build-core
        "$dir/venv/bin/python" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
            "llama-cpp-python==$version" -d "$dir" >&2
    fi
    tar -xzf "$dir/llama_cpp_python-$version.tar.gz" -C "$dir"
fi
[[ -z ${NO_BUILD:-} ]] || { echo "$dir"; exit 0; }
cpu=${PEER_CPU:-native}
# Some virtual machines offer AMX in CPUID but do not save its tile data
# (Linux's ARCH_GET_XCOMP_SUPP lacks XTILEDATA): an AMX kernel there dies
# of SIGILL, so a native build leaves AMX out (as cortex passes over
# llama.cpp's AMX variant there).
amx_unusable() {
    grep -qw amx_tile /proc/cpuinfo || return 1
    local probe
    probe=$(mktemp -d)
    cat >"$probe/amx.c" <<'C'
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    unsigned long supported = 0;
    return syscall(SYS_arch_prctl, 0x1022, &supported) == 0 && (supported & (1UL << 18)) ? 0 : 1;
}
C
    cc "$probe/amx.c" -o "$probe/amx" && ! "$probe/amx"
    local unusable=$?
    rm -rf "$probe"
    return $unusable
}
case $cpu in
native)
    cpu_options=(-DGGML_NATIVE=ON)
    if amx_unusable; then
        echo "==> AMX is offered but its tile data is not saved here: building without it" >&2
        cpu_options+=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
            -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
    fi
    ;;
x86-64-v3) cpu_options=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DGGML_BMI2=ON -DCMAKE_C_FLAGS=-march=x86-64-v3 -DCMAKE_CXX_FLAGS=-march=x86-64-v3) ;;
alderlake) cpu_options=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DCMAKE_C_FLAGS=-march=alderlake -DCMAKE_CXX_FLAGS=-march=alderlake) ;;
*) echo "PEER_CPU is native, x86-64-v3 or alderlake" >&2; exit 2 ;;
esac
gpu_options=()
suffix=$cpu
if [[ ${PEER_GPU:-} == cuda ]]; then
    gpu_options=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-native}")
    suffix=$cpu-cuda
fi
out=$dir/build-$build_type-$suffix
if [[ ! -x $out/bin/llama-server || ! -x $out/bin/llama-batched-bench || ! -x $out/bin/llama-quantize ]]; then
    echo "==> building llama-batched-bench, llama-server and llama-quantize ($build_type, $suffix) in $out" >&2
    cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE="$build_type" "${cpu_options[@]}" "${gpu_options[@]}" \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
    cmake --build "$out" --target llama-batched-bench llama-server llama-quantize -j "$(nproc)" >&2
fi
echo "$out/bin"
