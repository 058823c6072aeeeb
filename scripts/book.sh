#!/usr/bin/env bash
# Builds the book (docs/, an mdBook) into target/book, installing mdBook
# from the crates registry the first time on a machine, into the developer
# tools' cache ($CORTEX_TOOLS_DIR, else ~/.cache/cortex-dev/tools).
# Usage: bash scripts/book.sh     (the tests check its links: tidy/tests/tidy/)
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.5.4
tools=${CORTEX_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cortex-dev/tools}/mdbook-$version
if [[ ! -x $tools/bin/mdbook ]] || [[ $("$tools/bin/mdbook" --version) != "mdbook v$version" ]]; then
    echo "==> installing mdBook $version into $tools" >&2
    cargo install --quiet --locked --version "$version" --no-default-features --root "$tools" mdbook >&2
fi
"$tools/bin/mdbook" build docs >&2
echo "target/book/index.html"
