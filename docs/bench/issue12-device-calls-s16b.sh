#!/usr/bin/env bash
# Session 16 (2026-12-02), first device call of issue 12, nvidia-h200 (16 CPUs).
# A: is grp's failure in the 4-peer serving shape real (groups of writes read on the lane,
#    docs/bench/issue12-s15-write-groups-on-lane.patch)? 3 rounds of the cases it touches,
#    upstream 0.3.14, `cur` (main, 6a1476a) and `grp` (cur + the patch), every log under $OUT.
# B: where the 16 CPUs go in serving with 4 peers now (cur with symbols): context switches
#    and migrations per request (perf stat), a cpu-clock profile by thread and symbol.
# Carry .devcarry/ and .gpucarry-s16/ (cur-sym.xz, grp.xz: release bench binaries; perf.txz).
#
#   bash docs/bench/issue12-device-calls-s16b.sh
set -uo pipefail
H=$PWD/.gpucarry-s16; for f in cur-sym grp; do xz -dk "$H/$f.xz"; done
O="${OUT:-/tmp/s16-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/cmp" \
    OURS="cur=$H/cur-sym grp=$H/grp" \
    CASES="serving-4peers serving-1peer read-64KiBx64 write-64KiBx64" \
    ROUNDS=3 DURATION=2 timeout 330 bash scripts/bench-compare.sh --gpu-host 2>"$O/compare.err"
grep -h '"error"' "$O/cmp/results.jsonl"; tail -n 2 "$O/compare.err"
(cd "$O/cmp" && tar czf "$O/cmp-logs.tgz" logs 2>/dev/null && rm -rf logs)
date -u
tar xJf "$H/perf.txz" -C /tmp
PERF="env LD_LIBRARY_PATH=/tmp/perf/lib /tmp/perf/perf"
B=$H/cur-sym
segs=()
for i in 1 2 3 4; do
    "$B" --mode=target --protocol=tcp --local_server_name=127.0.0.1 --buffer_size=1073741824 \
        </dev/null >/tmp/t$i.log 2>&1 &
    for _ in $(seq 100); do grep -q segment_id= /tmp/t$i.log && break; sleep 0.1; done
    segs+=("$(grep -oE 'segment_id=[0-9.]+:[0-9]+' /tmp/t$i.log | head -1 | cut -d= -f2)")
done
run() { # duration
    "$B" --mode=initiator --protocol=tcp --local_server_name=127.0.0.1 \
        --segment_id="$(IFS=,; echo "${segs[*]}")" --operation=write --block_size=32768 \
        --batch_size=32 --threads=10 --buffer_size=1073741824 --duration="$1" --json \
        </dev/null 2>/dev/null | grep '^{'
}
echo "plain: $(run 2)"
run 5 >/tmp/s.out & ip=$!; sleep 1.5
$PERF stat -a -e context-switches,cpu-migrations,cpu-clock -- sleep 2 2>&1 | grep -E 'context|migr|cpu-clock|elapsed'
wait $ip; echo "with perf stat: $(cat /tmp/s.out)"
run 5 >/tmp/s.out & ip=$!; sleep 1.5
$PERF record -a -e cpu-clock -F 999 -o /tmp/p.data -- sleep 3 >/dev/null 2>&1
wait $ip; echo "profiled: $(cat /tmp/s.out)"
kill $(jobs -p) 2>/dev/null; wait 2>/dev/null
date -u
timeout 150 $PERF report -i /tmp/p.data --stdio --no-children --sort comm,dso,sym --percent-limit 0.1 \
    2>/dev/null | grep -v '^#' | grep -v '^$' >"$O/profile-serving4.txt"
head -60 "$O/profile-serving4.txt"
date -u
