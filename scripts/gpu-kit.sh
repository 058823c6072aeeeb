#!/usr/bin/env bash
# cortex on an NVIDIA GPU, measured against llama.cpp's own tools built there
# with CUDA, for a CUDA machine that may have no Rust toolchain and no
# network. Three steps:
#
#   bash scripts/gpu-kit.sh pack [KIT]
#       Here (Rust, network): builds cortex (release) and gathers in KIT
#       (default target/gpu-kit) what the GPU machine needs: cortex with its
#       llama.cpp libraries and CPU modules (bin/), the llama.cpp source it is
#       built from (for its CUDA module), the llama-cpp-python sdist (for the
#       peers), the default model, and these scripts. Copy KIT there.
#   bash scripts/gpu-kit.sh build [KIT]
#       There (nvcc, CMake): builds cortex's CUDA module from that source into
#       KIT/bin (scripts/build-backend.sh cuda; cortex is not rebuilt: it
#       loads the module at start), and llama-batched-bench and llama-server
#       with CUDA from the sdist (scripts/build-peers.sh).
#   bash scripts/gpu-kit.sh bench [KIT] [options of bench_peers.py]
#       There: cortex against the peers on the GPU in interleaved rounds:
#       engine decode at B = 1, 64, 256, and whole jobs (distinct, shared
#       prefix, mixed chat, extraction, short) scaled to 2,000+ items, with
#       the GPU's utilisation. KIT/bench.json keeps the figures.
#
# CUDA_ARCHITECTURES (e.g. 90 for an H100) builds for that GPU only (faster);
# the default is the GPU in the machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
step=${1:?usage: bash scripts/gpu-kit.sh pack|build|bench [KIT] [...]}
shift
kit=${1:-}
if [[ -n $kit && $kit != -* ]]; then shift; fi

case $step in
pack)
    root=$(cd "$here/.." && pwd)
    kit=${kit:-$root/target/gpu-kit}
    cd "$root"
    echo "==> cargo build --release" >&2
    cargo build --release --locked -p cortex-cli >&2
    mkdir -p "$kit/bin" "$kit/scripts"
    cp -a target/release/cortex target/release/lib*.so* "$kit/bin/"
    src=$(cargo metadata --format-version 1 --locked | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "llama-cpp-sys-2":
        print(p["manifest_path"])')
    rm -rf "$kit/llama.cpp"
    cp -a "$(dirname "$src")/llama.cpp" "$kit/llama.cpp"
    NO_BUILD=1 bash scripts/build-peers.sh >/dev/null
    cp "$(ls target/peers/llama_cpp_python-*.tar.gz | head -1)" "$kit/"
    model=$(target/release/cortex models pull 2>/dev/null | tail -1)
    cp "$model" "$kit/model.gguf"
    cp scripts/build-backend.sh scripts/build-peers.sh scripts/bench_peers.py scripts/gpu-kit.sh "$kit/scripts/"
    du -sh "$kit" >&2
    echo "$kit"
    ;;
build)
    kit=$(cd "${kit:-$here/..}" && pwd)
    LLAMA_SRC=$kit/llama.cpp BUILD_DIR=$kit/target/backend-build/cuda \
        bash "$kit/scripts/build-backend.sh" cuda "$kit/bin" >&2
    sdist=$(ls "$kit"/llama_cpp_python-*.tar.gz | head -1)
    NO_INSTALL=1 PEER_GPU=cuda LLAMA_CPP_PYTHON_SDIST=$sdist \
        bash "$kit/scripts/build-peers.sh" "$kit/target/peers"
    "$kit/bin/cortex" devices >&2
    ;;
bench)
    kit=$(cd "${kit:-$here/..}" && pwd)
    peers=$(NO_INSTALL=1 PEER_GPU=cuda bash "$kit/scripts/build-peers.sh" "$kit/target/peers")
    device=$("$kit/bin/cortex" devices --json | python3 -c '
import json, sys
gpus = [d["name"] for d in json.load(sys.stdin)["devices"] if d["kind"] == "gpu"]
print(gpus[0].lower() if gpus else "")')
    [[ -n $device ]] || { echo "cortex sees no GPU: run the build step first" >&2; exit 1; }
    exec python3 "$kit/scripts/bench_peers.py" --cortex "$kit/bin/cortex" --peers "$peers" \
        --model "$kit/model.gguf" --device "$device" --threads "$(nproc)" \
        --batches 1,64,256 --scale 32 --rounds 3 --json "$kit/bench.json" "$@"
    ;;
*)
    echo "unknown step $step: pack, build or bench" >&2
    exit 2
    ;;
esac
