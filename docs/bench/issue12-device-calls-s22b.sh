#!/usr/bin/env bash
# Session 22 (2026-12-02), second device call of issue 12, nvidia-h200 (16 CPUs). Carry
# .gpucarry-s22/ (P.xz: the release transfer_engine_bench of 89ae84b with
# docs/bench/issue12-s22-recv-spin.patch: a receive that would sleep for bytes a header
# promised first spins on non-blocking receives for the setting's µs). One set of four
# target processes for every setting (the driver writes the setting to the file the probe
# re-reads every 50 ms), a fresh initiator per run, 5 rounds, the settings' order rotated;
# the targets' CPU, runnable wait and sleeps per request sampled mid-run.
#
#   bash docs/bench/issue12-device-calls-s22b.sh
set -uo pipefail
H=$PWD/.gpucarry-s22; xz -dkf "$H/P.xz"
O="${OUT:-/tmp/s22-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
timeout 500 python3 docs/bench/issue12-s22-recv-spin.py --bench "$H/P" --settings 0,10,30,60 \
    --cases serving-4peers,serving-1peer,write-64KiBx64,lat-write-4KiB --rounds 5 --duration 2 \
    | tee "$O/recv-spin.jsonl"
date -u
