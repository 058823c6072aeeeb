#!/usr/bin/env bash
# Azurite, Microsoft's Azure Storage emulator (from the npm registry), which
# the object-store tests start on loopback for az:// URLs: installed
# once per machine into the developer tools' cache ($CORTEX_TOOLS_DIR, else
# ~/.cache/cortex-dev/tools; Debian's npm first, when missing). Prints the
# path of its blob server.
# Usage: bash scripts/azurite.sh
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${CORTEX_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cortex-dev/tools}/azurite-3.37.0
binary=$prefix/node_modules/.bin/azurite-blob
if ! command -v npm >/dev/null 2>&1; then
    echo "==> installing npm (and node) for Azurite" >&2
    if [[ $(id -u) -eq 0 ]]; then sudo=(); else sudo=(sudo); fi
    "${sudo[@]}" apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq npm >/dev/null
fi
if [ ! -x "$binary" ]; then
    echo "==> Azurite 3.37.0 into $prefix" >&2
    npm install --silent --no-audit --no-fund --prefix "$prefix" azurite@3.37.0 >&2
fi
echo "$binary"
