#!/usr/bin/env bash
# Session 21 (2026-12-02), fifth device call of issue 12, nvidia-h200 (16 CPUs): call 3 found
# sends out of device memory faster in 512 KiB pieces than in whole 2 MiB chunks. Does the
# serving shape (a caller's batch of 32 x 32 KiB writes in one sendmsg) move more with at most
# MC_PROBE_SEND_CAP bytes a sendmsg? The wheel of 050a76f + docs/bench/issue12-s21e-probe.patch
# (read at each send), carried unzipped as .gpucarry-s21/site-cap;
# docs/bench/issue12-s18-serving-knob.py (one initiator, four targets kept), 5 rounds.
#
#   bash docs/bench/issue12-device-calls-s21e.sh
set -uo pipefail
H=$PWD/.gpucarry-s21
O="${OUT:-/tmp/s21-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_LOG_LEVEL=warn PYTHONPATH=$H/site-cap
timeout 400 python3 docs/bench/issue12-s18-serving-knob.py \
    --settings=-,MC_PROBE_SEND_CAP=262144,MC_PROBE_SEND_CAP=131072,MC_PROBE_SEND_CAP=65536 \
    --shapes serving-4peers,serving-1peer,write-64KiBx64 --rounds 5 --duration 2 2>&1 \
    | grep -E '^\{|Error|error'
date -u
