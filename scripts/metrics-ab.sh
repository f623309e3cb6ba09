#!/usr/bin/env bash
# The metrics-overhead A/B of issue 14: the 4 KiB latency cases (1 thread, batch 1,
# loopback) with metrics off (A: `--features no-metrics`, batches record nothing) and on
# (B: the release build), paired in the same run (off first in odd rounds, on first in even
# ones), pinned to CPUS. The table's B/A columns are on/off ratios.
#
#   scripts/metrics-ab.sh [ROUNDS]
#
# Environment: OFF_BIN / ON_BIN (prebuilt binaries; else both are built here with cargo),
# CPUS (taskset list, default 0-15), DURATION, KEEP (as scripts/bench-ab.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-7}"
if [ -z "${OFF_BIN:-}" ] || [ -z "${ON_BIN:-}" ]; then
    BINS="$(mktemp -d)"
    trap 'rm -rf "$BINS"' EXIT
    cargo build --release -p transfer-engine-bench --features no-metrics
    cp "${CARGO_TARGET_DIR:-target}/release/transfer_engine_bench" "$BINS/off"
    cargo build --release -p transfer-engine-bench
    cp "${CARGO_TARGET_DIR:-target}/release/transfer_engine_bench" "$BINS/on"
    OFF_BIN="$BINS/off" ON_BIN="$BINS/on"
fi
CASES="write 4096 1,read 4096 1" taskset -c "${CPUS:-0-15}" \
    scripts/bench-ab.sh "$OFF_BIN" "$ON_BIN" "$ROUNDS"
