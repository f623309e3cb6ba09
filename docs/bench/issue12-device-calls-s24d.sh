#!/usr/bin/env bash
# Session 24 (2026-12-03), fourth device call of issue 12, nvidia-h200: the serving shape's
# memory ceiling with no sockets. docs/bench/issue12-s24-copy-ceiling.c, built here
# (cc -O2 -pthread -static) and carried as .gpucarry-s24/copy-ceiling: each thread copies
# 32 KiB pieces twice (source -> a ring kept in cache -> destination), as loopback TCP copies
# each payload byte, for 1-20 threads, 3 s each.
#
#   bash docs/bench/issue12-device-calls-s24d.sh
set -uo pipefail
O="${OUT:-/tmp/s24-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; lscpu | grep -E "Model name|^CPU\(s\)|L2|L3|NUMA node\(s\)"; free -g | head -2
timeout 200 .gpucarry-s24/copy-ceiling 3
date -u
