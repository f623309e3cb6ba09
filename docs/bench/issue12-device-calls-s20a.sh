#!/usr/bin/env bash
# Session 20 (2026-12-02), first device call of issue 12, nvidia-h200 (16 CPUs).
# 1. 64 KiB x 64 reads (the goal short in 1 of 7 rounds of session 19): the probe wheel of
#    docs/bench/issue12-s20-probe.patch on c817f41 (.gpucarry-s20/site), one initiator process
#    against the same targets (docs/bench/issue12-s18-serving-knob.py), settings per phase:
#    MC_PROBE_MIN_SHARE (bytes: a lane gathers at least that much of a batch, so a 4 MiB
#    batch of small requests spreads over fewer lanes), MC_PROBE_SETTLE_ANY=1 (a lane reads
#    its group's replies itself even while requests are queued behind it),
#    MC_PROBE_LANE_LOWAT=1 (it waits for each whole reply in poll with SO_RCVLOWAT).
# 2. tests/gpu/gpu_transfer.py --rounds 3 with the same wheel (the probes unset: main's
#    code): the GPU row as the median of alternating rounds.
#
#   bash docs/bench/issue12-device-calls-s20a.sh
#
# Ran so, the two .jsonl files came back empty; their lines are in run.log, from which the raw
# files under docs/bench/ were taken. Part 2 measured same-host GPU IPC: gpu_transfer.py did
# not set MC_DISABLE_IPC=1 yet.
set -uo pipefail
H=$PWD/.gpucarry-s20
O="${OUT:-/tmp/s20-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
export PYTHONPATH=$H/site MC_LOG_LEVEL=warn
timeout 150 python3 docs/bench/issue12-s18-serving-knob.py --shapes read-64KiBx64 --rounds 5 --duration 2 \
    --settings=-,MC_PROBE_MIN_SHARE=524288,MC_PROBE_MIN_SHARE=1048576,MC_PROBE_SETTLE_ANY=1,MC_PROBE_LANE_LOWAT=1,MC_PROBE_SETTLE_ANY=1+MC_PROBE_LANE_LOWAT=1 \
    | tee "$O/reads64k.jsonl"
date -u
timeout 60 python3 docs/bench/issue12-s18-serving-knob.py --shapes write-64KiBx64 --rounds 4 --duration 2 \
    --settings=-,MC_PROBE_MIN_SHARE=524288 | tee "$O/writes64k.jsonl"
date -u
timeout 200 python3 tests/gpu/gpu_transfer.py main --rounds 3 --duration 3 | tee "$O/gpu-transfer.log"
date -u
