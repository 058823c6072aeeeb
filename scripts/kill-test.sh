#!/usr/bin/env bash
# The long version of the end-to-end kill test: a job of ITEMS items (default
# 500) with default settings, KILLS kill -9s (default 100) of one or two
# workers at a time at random moments, then a clean worker. Prints the
# figures (kills, time, failed items, deaths, most attempts on one item) and
# fails if any item failed, was lost, or was generated twice.
# Usage: bash scripts/kill-test.sh [ITEMS] [KILLS]
set -euo pipefail
cd "$(dirname "$0")/.."
# The workspace build: the `cortex` binary the test drives, current.
cargo build --workspace --tests --quiet
CORTEX_KILL_ITEMS="${1:-500}" CORTEX_KILL_KILLS="${2:-100}" \
    cargo test --quiet -p cortex-tests --test e2e -- \
    kill_9_at_random_moments_loses_nothing_and_redoes_nothing_finished --exact --nocapture 2>&1 | grep -E "kill test|not completed|test result|panicked|assert"
