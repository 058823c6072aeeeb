#!/usr/bin/env bash
# Builds one of llama.cpp's GPU backends as a module (libggml-vulkan.so,
# libggml-cuda.so) from the same llama.cpp source cortex is built from, and
# puts it beside the cortex binaries (target/debug and target/release, those
# that exist) or in DIR. cortex loads it from there at start (`cortex
# devices` lists it); cortex itself is not rebuilt.
#
# Usage: bash scripts/build-backend.sh vulkan|cuda [DIR]
#   LLAMA_SRC=PATH          the llama.cpp source (default: llama-cpp-sys-2's,
#                           found with cargo; give it where there is no cargo)
#   CUDA_ARCHITECTURES=90   cuda: the GPU architectures (default: this machine's)
#   BUILD_DIR=PATH          where CMake builds (default: target/backend-build/NAME)
#
# Vulkan on Debian 12: its Vulkan and SPIR-V headers are older than llama.cpp
# needs, so those two header packages are taken from Debian 13 (downloaded
# with apt-get and unpacked under target/vulkan-headers; nothing is
# installed from it). The shader compiler and loader are Debian 12's, and
# Mesa's software driver (lavapipe) is installed so the module runs on a
# machine without a GPU (name it with GGML_VK_VISIBLE_DEVICES=0).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
backend=${1:?usage: bash scripts/build-backend.sh vulkan|cuda [DIR]}
case $backend in
vulkan | cuda) ;;
*) echo "unknown backend $backend: vulkan or cuda" >&2; exit 2 ;;
esac

as_root() {
    if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

src=${LLAMA_SRC:-}
if [[ -z $src ]]; then
    manifest=$(cargo metadata --format-version 1 --locked 2>/dev/null | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "llama-cpp-sys-2":
        print(p["manifest_path"])')
    src=$(dirname "$manifest")/llama.cpp
fi
[[ -f $src/ggml/CMakeLists.txt ]] || { echo "no llama.cpp source at $src (set LLAMA_SRC)" >&2; exit 1; }

command -v cmake >/dev/null || { as_root apt-get update -qq; as_root apt-get install -y -qq cmake >/dev/null; }
options=()
case $backend in
vulkan)
    missing=()
    command -v glslc >/dev/null || missing+=(glslc)
    [[ -e /usr/lib/x86_64-linux-gnu/libvulkan.so ]] || missing+=(libvulkan-dev)
    ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || missing+=(mesa-vulkan-drivers)
    if ((${#missing[@]})); then
        echo "==> installing ${missing[*]}" >&2
        as_root apt-get update -qq
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    headers=$root/target/vulkan-headers
    if [[ ! -f $headers/usr/include/vulkan/vulkan.hpp || ! -d $headers/usr/share/cmake/SPIRV-Headers ]]; then
        echo "==> Vulkan and SPIR-V headers from Debian 13 into $headers" >&2
        apt_dir=$root/target/trixie-apt
        mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$headers"
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
            >"$apt_dir/sources.list"
        apt=(apt-get -q -o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache"
            -o APT::Sandbox::User=root)
        "${apt[@]}" update >/dev/null
        (cd "$apt_dir" && "${apt[@]}" download libvulkan-dev spirv-headers >/dev/null)
        for deb in "$apt_dir"/*.deb; do dpkg -x "$deb" "$headers"; done
    fi
    options+=(-DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR="$headers/usr/include"
        -DCMAKE_PREFIX_PATH="$headers/usr" -DCMAKE_CXX_FLAGS="-I$headers/usr/include")
    ;;
cuda)
    command -v nvcc >/dev/null || { echo "nvcc is not on PATH: install the CUDA toolkit" >&2; exit 1; }
    options+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-native}")
    ;;
esac

build=${BUILD_DIR:-$root/target/backend-build/$backend}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
echo "==> building libggml-$backend.so from $src in $build" >&2
# Only the module is built (and the ggml-base it links against, the same
# as the one cortex loads: same source, same ABI); llama.cpp's own programs
# are off (the source in the crate does not even carry them).
cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF -DGGML_CPU=OFF \
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_CURL=OFF "${options[@]}" >/dev/null
cmake --build "$build" --target "ggml-$backend" -j "$(nproc)" >&2
module=$(find "$build" -name "libggml-$backend.so" -print -quit)
[[ -n $module ]] || { echo "the build made no libggml-$backend.so" >&2; exit 1; }

if (($# > 1)); then
    destinations=("$2")
else
    destinations=()
    for profile in debug release; do
        [[ -d $root/target/$profile ]] && destinations+=("$root/target/$profile")
    done
    ((${#destinations[@]})) || destinations=("$root/target/debug")
fi
for dir in "${destinations[@]}"; do
    mkdir -p "$dir"
    cp "$module" "$dir/"
    echo "$dir/libggml-$backend.so"
done
