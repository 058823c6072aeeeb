#!/usr/bin/env bash
# cortex on an NVIDIA GPU, measured against llama.cpp's own tools, for a CUDA
# machine reached only by copying files: no Rust and no network there, at
# most 64 MiB per transfer, minutes of GPU time in all. Everything is built
# here, without a GPU; the GPU machine only unpacks and runs.
#
#   bash scripts/gpu-kit.sh module
#       Here: llama.cpp's CUDA backend module (libggml-cuda.so) from the
#       llama.cpp source cortex is built from, with pip's CUDA 13.0 toolkit
#       (no GPU needed: a stub libcuda.so.1 satisfies the link and the
#       module is marked to load the driver's at run time), for
#       CUDA_ARCHITECTURES (default 90: H100, H200). About 80 minutes on 2
#       cores the first time (ccache keeps the objects). Copied beside the
#       cortex binaries in target/release and target/debug.
#   bash scripts/gpu-kit.sh peers
#       Here: llama-batched-bench and llama-server from the llama-cpp-python
#       sdist's tools (its tools/, common/, vendor/ and scripts/ over the same
#       llama.cpp source), built with backends as modules so that on the GPU
#       machine they load the very libggml-cuda.so cortex loads.
#   bash scripts/gpu-kit.sh pack [DIR] [--before CORTEX] [--sized-only]
#       Here: cortex (release) with its llama.cpp libraries and CPU modules,
#       the CUDA module, the peers, the default model and the bench scripts,
#       as one xz stream cut into parts of at most 56 MiB in DIR (default
#       target/gpu-kit), one per transfer: a part and the working tree that
#       travels with it fit the 64 MiB a call carries. `--before` adds
#       another cortex binary (an earlier build) measured beside this one;
#       `--sized-only` leaves the default model out, for a kit that only
#       runs `bench --sized`: one part then (54 MiB), so one call.
#   bash scripts/gpu-kit.sh bench PARTS_DIR [options of bench_peers.py]
#       There (KIT_DIR: where to unpack, default /root/cortex-kit; KIT_DEVICE:
#       the device instead of the first GPU, `cpu` to try the run without
#       one): joins and unpacks the parts, checks that greedy output sampled
#       on the GPU equals output sampled on the host, then runs
#       scripts/bench_peers.py on the GPU (engine decode against
#       llama-batched-bench, whole jobs against llama-server) with the GPU's
#       utilisation. KIT/bench.json keeps the figures. Settings not yet
#       measured on a GPU go in as variants beside the defaults, e.g.
#       `--variant loops4:CORTEX_STEP_LOOPS=4 --timelines` (the job times
#       and each one's trace summary, against the default; with
#       `--sized NAME[:TYPE]` measures a model of a real shape instead of
#       the default one (llama3.1-8b, qwen2.5-7b, gemma3-4b, llama3.2-3b,
#       llama3.2-1b; Q4_K_M unless `:q8_0`), its random weights written
#       there in seconds by scripts/sized_model.py from the tokenizers and
#       templates the kit carries (no weights travel), every token count
#       fixed (`--fixed-counts`). With
#       `--engine-variants` the engine decode rows too, e.g. the decode
#       threads of a model wholly on the GPU, one a loop by default, against
#       every core, `t16:CORTEX_THREADS=16`). cortex's threads are its own
#       choice for the device unless `--cortex-threads N`. Where a step's
#       device time goes, by graph operation: `KIT/bin/cortex bench --batch
#       256 --no-prefix --profile-ops` there.
#
# With the `device` tool of this workplace, the parts travel in one call
# each to one machine kept warm (each within 30 s of the last): copy every
# part but the last somewhere outside the checkout, and run `bench` in the
# call that carries the last. A `--sized-only` kit is one call, carrying
# target/gpu-kit/kit.tar.xz.part-00, e.g. (the figures come back even if the
# call's time runs out, as bench_peers writes them after every measurement):
#   mkdir -p /root/parts && cp target/gpu-kit/kit.tar.xz.part-* /root/parts/ &&
#   timeout 420 bash scripts/gpu-kit.sh bench /root/parts --sized llama3.1-8b \
#       ... --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
# (about 420 s for the 8B's engine rows at B = 1, 64, 256 and three jobs in
# 2 rounds on an H200, docs/gpus.md). Nothing here is a test: it only
# measures, and nothing it builds is committed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
step=${1:?usage: bash scripts/gpu-kit.sh module|peers|pack|bench [...]}
shift

# The llama.cpp source cortex is built from (llama-cpp-sys-2's).
llama_src() {
    local manifest
    manifest=$(cd "$root" && cargo metadata --format-version 1 --locked | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "llama-cpp-sys-2":
        print(p["manifest_path"])')
    echo "$(dirname "$manifest")/llama.cpp"
}

# pip's CUDA 13.0 toolkit (compiler, runtime, cuBLAS headers and libraries),
# laid out as CMake's FindCUDAToolkit expects, with a stub driver library.
cuda_toolkit() {
    local venv=$root/target/cuda-venv
    local toolkit
    if [[ ! -x $venv/bin/python ]]; then
        python3 -m venv "$venv"
    fi
    toolkit=$("$venv/bin/python" -c 'import os, nvidia; print(os.path.join(nvidia.__path__[0], "cu13"))' 2>/dev/null || true)
    if [[ -z $toolkit || ! -x $toolkit/bin/nvcc ]]; then
        echo "==> pip: the CUDA 13.0 toolkit into $venv" >&2
        "$venv/bin/pip" install -q nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 \
            nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85 \
            nvidia-cublas==13.0.2.14 >&2
        toolkit=$("$venv/bin/python" -c 'import os, nvidia; print(os.path.join(nvidia.__path__[0], "cu13"))')
    fi
    (
        cd "$toolkit/lib"
        for lib in cudart cublas cublasLt; do ln -sf "lib$lib.so.13" "lib$lib.so"; done
        mkdir -p stubs
        if [[ ! -f stubs/libcuda.so ]]; then
            # No symbols: the module resolves the driver's at run time, from
            # the real libcuda.so.1 it is marked to need.
            echo 'void cortex_cuda_stub(void) {}' >stubs/stub.c
            gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o stubs/libcuda.so stubs/stub.c
        fi
        cd "$toolkit"
        ln -sfn lib lib64
        mkdir -p nvvm/lib64
        ln -sf ../../lib/libnvvm.so.4 nvvm/lib64/libnvvm.so
    )
    echo "$toolkit"
}

need() {
    local missing=()
    for tool in "$@"; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    if ((${#missing[@]})); then
        local packages=("${missing[@]/ninja/ninja-build}")
        echo "==> installing ${packages[*]}" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
    fi
}

case $step in
module)
    source "$root/scripts/install-build-tools.sh"
    need ninja ccache patchelf
    toolkit=$(cuda_toolkit)
    src=$(llama_src)
    build=$root/target/backend-build/cuda
    echo "==> libggml-cuda.so for sm_${CUDA_ARCHITECTURES:-90} from $src in $build" >&2
    PATH=$toolkit/bin:$PATH cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF -DGGML_CPU=OFF \
        -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF \
        -DGGML_CUDA=ON -DGGML_CUDA_GRAPHS=ON -DGGML_CUDA_NCCL=OFF \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}" \
        -DCUDAToolkit_ROOT="$toolkit" -DCMAKE_CUDA_COMPILER="$toolkit/bin/nvcc" \
        -DCMAKE_LIBRARY_PATH="$toolkit/lib/stubs" \
        -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
        -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null
    PATH=$toolkit/bin:$PATH cmake --build "$build" --target ggml-cuda -j "$(nproc)" >&2
    module=$(find "$build" -name libggml-cuda.so -print -quit)
    # The linker may drop a needed library that gave it no symbol (the stub
    # gives none): ggml must load the driver with the module.
    readelf -d "$module" | grep -q 'NEEDED.*libcuda\.so\.1' || patchelf --add-needed libcuda.so.1 "$module"
    for profile in release debug; do
        if [[ -d $root/target/$profile ]]; then
            cp "$module" "$root/target/$profile/"
            echo "$root/target/$profile/libggml-cuda.so"
        fi
    done
    ;;
peers)
    source "$root/scripts/install-build-tools.sh"
    need ninja ccache patchelf
    sdist_dir=$(NO_INSTALL=1 NO_BUILD=1 bash "$root/scripts/build-peers.sh" "$root/target/peers")
    sdist_src=$(ls -d "$sdist_dir"/llama_cpp_python-*/vendor/llama.cpp | head -1)
    src=$root/target/peers/llama.cpp-with-tools
    rm -rf "$src"
    cp -a "$(llama_src)" "$src"
    for part in tools common vendor scripts; do
        rm -rf "${src:?}/$part"
        cp -a "$sdist_src/$part" "$src/$part"
    done
    build=$root/target/peers/build-cuda-modules
    echo "==> llama-batched-bench and llama-server over $src in $build" >&2
    # No CPU backend of their own: they load cortex's CPU modules and the
    # CUDA module from their directory, as cortex does.
    cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        -DGGML_BACKEND_DL=ON -DGGML_CPU=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
    cmake --build "$build" --target llama-batched-bench llama-server -j "$(nproc)" >&2
    # They find their libraries (and ggml its modules) beside themselves
    # wherever the directory goes, as cortex does; the build's own path
    # would not exist on the GPU machine.
    for file in "$build"/bin/*; do
        [[ -f $file && ! -L $file ]] && patchelf --set-rpath '$ORIGIN' "$file"
    done
    echo "$build/bin"
    ;;
pack)
    kit=$root/target/gpu-kit
    before=
    default_model=yes
    while (($#)); do
        case $1 in
        --before) before=${2:?--before needs a cortex binary}; shift 2 ;;
        --sized-only) default_model=; shift ;;
        *) kit=$1; shift ;;
        esac
    done
    cd "$root"
    echo "==> cargo build --release" >&2
    # Without the binary cargo links it again from this tree: an earlier
    # build of another checkout into this target directory may have left
    # its own there, which a fresh build would not replace.
    rm -f target/release/cortex
    cargo build --release --locked -p cortex-cli >&2
    [[ -f target/release/libggml-cuda.so ]] || { echo "no CUDA module: run 'bash scripts/gpu-kit.sh module' first" >&2; exit 1; }
    peers=$root/target/peers/build-cuda-modules/bin
    [[ -x $peers/llama-server ]] || { echo "no peers: run 'bash scripts/gpu-kit.sh peers' first" >&2; exit 1; }
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/kit/bin" "$stage/kit/peers" "$stage/kit/scripts"
    cp -a target/release/cortex "$stage/kit/bin/"
    # llama.cpp's libraries, the CPU modules and the CUDA module (no other
    # GPU module: it would only take room).
    for lib in target/release/lib*.so*; do
        case $lib in */libggml-vulkan.so) continue ;; esac
        cp -a "$lib" "$stage/kit/bin/"
    done
    if [[ -n $before ]]; then
        cp "$before" "$stage/kit/bin/cortex-before"
    fi
    cp -a "$peers"/llama-batched-bench "$peers"/llama-server "$peers"/lib*.so* "$stage/kit/peers/"
    if readelf -d "$stage/kit/peers/llama-server" | grep -E 'R(UN)?PATH' | grep -qv ORIGIN; then
        echo "the peers look for their libraries in the build directory: run 'bash scripts/gpu-kit.sh peers' again" >&2
        exit 1
    fi
    strip --strip-unneeded "$stage/kit/bin/"* "$stage/kit/peers/"* 2>/dev/null || true
    if [[ -n $default_model ]]; then
        model=$(target/release/cortex models pull 2>/dev/null | tail -1)
        cp "$model" "$stage/kit/model.gguf"
    fi
    cp scripts/bench_peers.py scripts/gpu-kit.sh scripts/gpu_check.py scripts/sized_model.py "$stage/kit/scripts/"
    # What `bench --sized` makes models of real shapes from there: the
    # tokenizers (Gemma 3's taken out of the gemma3-270m GGUF) and the chat
    # templates, a few MB; the weights are written there, at random.
    models_src=$(NO_INSTALL=1 NO_BUILD=1 bash scripts/build-peers.sh)/llama_cpp_python-*/vendor/llama.cpp/models
    mkdir -p "$stage/kit/sized/templates"
    cp $models_src/ggml-vocab-llama-bpe.gguf $models_src/ggml-vocab-qwen2.gguf "$stage/kit/sized/"
    cp $models_src/templates/meta-llama-Llama-3.*-Instruct.jinja $models_src/templates/Qwen-Qwen2.5-7B-Instruct.jinja \
        "$stage/kit/sized/templates/"
    gemma=$(target/release/cortex models pull gemma3-270m 2>/dev/null | tail -1)
    python3 scripts/sized_model.py --extract-vocab "$gemma" "$stage/kit/sized/ggml-vocab-gemma3.gguf" >/dev/null
    mkdir -p "$kit"
    rm -f "$kit"/kit.tar.xz.part-*
    echo "==> packing (xz) into parts of 56 MiB in $kit" >&2
    # The programs first, the model last: the first parts alone unpack to a
    # cortex that can say whether it sees the GPU.
    tar -C "$stage" -cf - kit/bin kit/peers kit/scripts kit/sized ${default_model:+kit/model.gguf} |
        xz -T0 -9e | split -b 56M -d - "$kit/kit.tar.xz.part-"
    ls -l "$kit"/kit.tar.xz.part-* >&2
    echo "$kit"
    ;;
bench)
    parts=${1:?usage: bash scripts/gpu-kit.sh bench PARTS_DIR [options of bench_peers.py]}
    shift
    work=${KIT_DIR:-/root/cortex-kit}
    if [[ ! -e $work/.unpacked ]]; then
        mkdir -p "$work"
        cat "$parts"/kit.tar.xz.part-* | xz -d | tar -C "$work" -xf -
        touch "$work/.unpacked"
    fi
    kit=$work/kit
    # The CUDA runtime and cuBLAS the module needs (13.x): where the machine
    # keeps them. The peers load cortex's CPU modules and the same CUDA
    # module from their own directory.
    cuda_libs=${CUDA_LIBS:-}
    if [[ -z $cuda_libs ]]; then
        for dir in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
            /opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib /usr/lib/x86_64-linux-gnu; do
            if [[ -e $dir/libcudart.so.13 && -e $dir/libcublas.so.13 ]]; then
                cuda_libs=$dir
                break
            fi
        done
    fi
    echo "CUDA libraries: ${cuda_libs:-not found}" >&2
    export LD_LIBRARY_PATH=${cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    for module in "$kit"/bin/libggml-cpu*.so "$kit"/bin/libggml-cuda.so "$kit"/bin/libggml-vulkan.so; do
        [[ -e $module ]] && ln -sf "$module" "$kit/peers/"
    done
    "$kit/bin/cortex" devices >&2
    # KIT_DEVICE=cpu tries the whole run on a machine without a GPU.
    device=${KIT_DEVICE:-$("$kit/bin/cortex" devices --json | python3 -c '
import json, sys
gpus = [d["name"] for d in json.load(sys.stdin)["devices"] if d["kind"] == "gpu"]
print(gpus[0].lower() if gpus else "")')}
    [[ -n $device ]] || { echo "cortex sees no GPU" >&2; exit 1; }
    # --sized NAME[:TYPE]: a model of a real shape, made here (seconds; no
    # weights travel), measured with every token count fixed.
    model=$kit/model.gguf
    rest=()
    sized=
    while (($#)); do
        case $1 in
        --sized) sized=${2:?--sized NAME[:q4_k_m|q8_0], e.g. llama3.1-8b}; shift 2 ;;
        *) rest+=("$1"); shift ;;
        esac
    done
    if [[ -z $sized && ! -f $model ]]; then
        echo "this kit has no default model (packed with --sized-only): measure with --sized NAME" >&2
        exit 2
    fi
    if [[ -n $sized ]]; then
        name=${sized%%:*}
        type=q4_k_m
        [[ $sized == *:* ]] && type=${sized#*:}
        model=$(python3 "$here/sized_model.py" "$name" --type "$type" --vocab-dir "$kit/sized" \
            --out "$work/sized/$name-$type.gguf")
        rest=(--fixed-counts "${rest[@]}")
    else
        python3 "$here/gpu_check.py" --cortex "$kit/bin/cortex" --model "$model" \
            --device "$device" --repeat "${CHECK_REPEAT:-4}" || echo "the check found differences (above)"
    fi
    compare=()
    [[ -x $kit/bin/cortex-before ]] && compare=(--compare "$kit/bin/cortex-before")
    exec python3 "$here/bench_peers.py" --cortex "$kit/bin/cortex" --peers "$kit/peers" \
        --model "$model" --device "$device" --threads "$(nproc)" \
        --json "$kit/bench.json" "${compare[@]}" "${rest[@]}"
    ;;
*)
    echo "unknown step $step: module, peers, pack or bench" >&2
    exit 2
    ;;
esac
