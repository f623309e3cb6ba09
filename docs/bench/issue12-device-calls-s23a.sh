#!/usr/bin/env bash
# Session 23 (2026-12-02), first device call of issue 12 (16 CPUs). Carry .gpucarry-s23/
# (S.xz: the release transfer_engine_bench of b63429e with
# docs/bench/issue12-s23-split-send.patch: with MC_PROBE_SPLIT_SEND=N, N helper threads; a
# caller's batch of writes of 256 KiB or more is cut in halves by bytes, the second half sent
# by a helper over another caller connection while the caller sends the first). One set of
# target processes for every setting, a fresh initiator per run, 5 rounds, order rotated.
#
#   bash docs/bench/issue12-device-calls-s23a.sh
set -uo pipefail
H=$PWD/.gpucarry-s23; xz -dkf "$H/S.xz"
O="${OUT:-/tmp/s23-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
timeout 420 python3 docs/bench/issue12-s22-recv-spin.py --bench "$H/S" --initiator-var MC_PROBE_SPLIT_SEND \
    --settings=-,4,10 --cases serving-4peers,serving-1peer --rounds 5 --duration 2 | tee "$O/split.jsonl"
date -u
