#!/usr/bin/env bash
# Session 22 (2026-12-02), third device call of issue 12 (16 CPUs). Carry .gpucarry-s22/
# (H.xz: the release transfer_engine_bench of 89ae84b with
# docs/bench/issue12-s22-caller-halves.patch: with MC_PROBE_CALLER_HALVES=1 a caller's batch of
# writes of 256 KiB or more goes in halves over two caller connections, both sent before
# either's statuses are waited for). One set of four target processes for both settings, a
# fresh initiator per run with the setting in its environment, 8 rounds, order rotated.
#
#   bash docs/bench/issue12-device-calls-s22c.sh
set -uo pipefail
H=$PWD/.gpucarry-s22; xz -dkf "$H/H.xz"
O="${OUT:-/tmp/s22-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
timeout 400 python3 docs/bench/issue12-s22-recv-spin.py --bench "$H/H" --initiator-var MC_PROBE_CALLER_HALVES \
    --settings=-,1 --cases serving-4peers,serving-1peer --rounds 8 --duration 2 | tee "$O/halves.jsonl"
date -u
