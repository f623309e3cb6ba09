#!/usr/bin/env bash
# Session 23 (2026-12-03), third device call of issue 12 (16 CPUs). Carry .gpucarry-s23/
# (R.xz: the release transfer_engine_bench with runs of writes, headers first,
# `MC_TCP_WRITE_RUNS`; S.xz: main's b63429e with the split-send probe, unset here, as the
# old build's reference). One set of target processes per binary; a fresh initiator per
# run; with R, runs off (0) and on (-) alternate, order rotated per round.
#
#   bash docs/bench/issue12-device-calls-s23c.sh
set -uo pipefail
H=$PWD/.gpucarry-s23; xz -dkf "$H/R.xz"; xz -dkf "$H/S.xz"
O="${OUT:-/tmp/s23-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
timeout 330 python3 docs/bench/issue12-s22-recv-spin.py --bench "$H/R" --initiator-var MC_TCP_WRITE_RUNS \
    --settings=0,- --cases serving-4peers,serving-1peer,write-64KiBx64,lat-write-4KiB --rounds 5 --duration 2 | tee "$O/runs.jsonl"
date -u
timeout 120 python3 docs/bench/issue12-s22-recv-spin.py --bench "$H/S" --initiator-var MC_PROBE_SPLIT_SEND \
    --settings=- --cases serving-4peers,serving-1peer --rounds 3 --duration 2 | tee "$O/old.jsonl"
date -u
