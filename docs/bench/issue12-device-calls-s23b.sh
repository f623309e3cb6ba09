#!/usr/bin/env bash
# Session 23 (2026-12-02), second device call of issue 12 (16 CPUs). Carry .gpucarry-s23/
# (rb: docs/bench/issue12-s23-recv-batched.c built statically here). The serving shape's
# model over loopback, the engine's framing (A) against headers first (B), 5 rounds, alternated.
#
#   bash docs/bench/issue12-device-calls-s23b.sh
set -uo pipefail
H=$PWD/.gpucarry-s23
O="${OUT:-/tmp/s23-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
for round in 1 2 3 4 5; do
  for r in 4 1; do
    if [ $((round % 2)) = 1 ]; then modes="A B"; else modes="B A"; fi
    for m in $modes; do "$H/rb" $m 10 $r 2 | sed "s/^{/{\"round\": $round, /"; done
  done
done | tee "$O/model.jsonl"
date -u
