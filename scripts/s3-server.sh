#!/usr/bin/env bash
# The S3-compatible server the object-store tests start on loopback:
# s3s-fs (an S3 server over a local folder, from the s3s project), built
# once per machine from crates.io into the developer tools' cache
# ($CORTEX_TOOLS_DIR, else ~/.cache/cortex-dev/tools), which every checkout
# shares. Prints the binary's path.
# Usage: bash scripts/s3-server.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=${CORTEX_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cortex-dev/tools}/s3s-fs-0.14.1
binary=$root/bin/s3s-fs
if [ ! -x "$binary" ]; then
    echo "==> s3s-fs 0.14.1 (S3 over a folder) into $root" >&2
    # Its own build folder; the workspace's is left alone.
    CARGO_TARGET_DIR=$PWD/target/tools-build cargo install --quiet --locked \
        --root "$root" --features binary s3s-fs@0.14.1 >&2
fi
echo "$binary"
