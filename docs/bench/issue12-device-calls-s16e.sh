#!/usr/bin/env bash
# Session 16 (2026-12-02), fourth device call of issue 12, nvidia-h200 (16 CPUs): the two
# changes of this session against main and each other, upstream 0.3.14 in the same rounds.
#   cur   main (6a1476a; the probe build of s16c, its probe off)
#   new   reno on same-host connections (MC_TCP_SAME_HOST_CC) + a caller's batch of
#         256 KiB or more in halves over two caller connections
#   split new with MC_TCP_SAME_HOST_CC=system: the halves alone
#   reno  cur with the probe's reno: reno alone
# Carry .devcarry/ and .gpucarry-s16/ (cur.xz, new.xz).
#
#   bash docs/bench/issue12-device-calls-s16e.sh
set -uo pipefail
H=$PWD/.gpucarry-s16; for f in cur new; do xz -dk "$H/$f.xz"; done
O="${OUT:-/tmp/s16-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/cmp" \
    OURS="cur=$H/cur new=$H/new split=$H/new@MC_TCP_SAME_HOST_CC=system reno=$H/cur@MC_PROBE_TCP_CC=reno" \
    CASES="serving-4peers serving-1peer write-64KiBx64 read-64KiBx64 write-4MiBx64 read-4MiBx64 lat-write-4KiB" \
    ROUNDS=2 DURATION=2 timeout 500 bash scripts/bench-compare.sh --gpu-host 2>"$O/compare.err"
grep -h '"error"' "$O/cmp/results.jsonl"; tail -n 2 "$O/compare.err"
(cd "$O/cmp" && tar czf "$O/cmp-logs.tgz" logs 2>/dev/null && rm -rf logs)
date -u
