#!/usr/bin/env bash
# Session 8 (2026-12-01), first device call of issue 12, nvidia-h200 (16 CPUs): where the CPU
# goes. `.gpucarry-s8/` carries the wheel unpacked (`site`, symbols kept), the bench binary
# (`bench`) and Debian's perf with its libraries (`perf.txz`). For host and device memory,
# write and read: GB/s, CPU seconds per GB of both processes, and a system-wide perf profile
# (cpu-clock; the VM has no hardware events); then the serving workload with 4 peers, profiled.
#
#   bash docs/bench/issue12-device-calls-s8.sh
set -uo pipefail
H=$PWD/.gpucarry-s8
O="${OUT:-/tmp/s8-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc; uname -r
tar xJf "$H/perf.txz" -C "$H"
export PERF="env LD_LIBRARY_PATH=$H/perf/lib $H/perf/perf"
$PERF --version; cat /proc/sys/kernel/perf_event_paranoid
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
report() {  # report DATA NAME
    $PERF report -i "$1" --stdio --no-children --sort comm,dso --percent-limit 0.5 -g none 2>/dev/null \
        | grep -v '^#' | grep -v '^$' | head -40 >"$O/$2-dso.txt"
    $PERF report -i "$1" --stdio --no-children --sort comm,sym --percent-limit 0.3 -g none 2>/dev/null \
        | grep -v '^#' | grep -v '^$' | head -70 >"$O/$2-sym.txt"
}
for op in write read; do
    for mem in cpu cuda; do
        timeout 60 python3 docs/bench/issue12-s8-gpu-profile.py $mem $op 3 /tmp/$mem-$op.data
        report /tmp/$mem-$op.data $mem-$op
    done
done
for op in write; do
    for mem in cpu cuda cpu cuda; do
        timeout 60 python3 docs/bench/issue12-s8-gpu-profile.py $mem $op 2
    done
done
echo "== serving, 4 peers"
segs=()
for i in 1 2 3 4; do
    "$H/bench" --mode=target --protocol=tcp --local_server_name=127.0.0.1 --buffer_size=1073741824 \
        </dev/null >/tmp/t$i.log 2>&1 &
done
for i in 1 2 3 4; do
    for _ in $(seq 100); do grep -q segment_id= /tmp/t$i.log && break; sleep 0.1; done
    segs+=("$(grep -oE 'segment_id=[0-9.]+:[0-9]+' /tmp/t$i.log | head -1 | cut -d= -f2)")
done
seglist="$(IFS=,; echo "${segs[*]}")"; echo "segments $seglist"
"$H/bench" --mode=initiator --protocol=tcp --local_server_name=127.0.0.1 --segment_id="$seglist" \
    --workload serving --buffer_size=1073741824 --duration=5 --json </dev/null >/tmp/init.out 2>/tmp/init.err &
ip=$!
sleep 1.5
$PERF record -a -g -e cpu-clock -F 499 -o /tmp/serving.data -- sleep 3 >/dev/null 2>&1
wait $ip
grep '^{' /tmp/init.out; tail -3 /tmp/init.err
report /tmp/serving.data serving4
kill $(jobs -p) 2>/dev/null
for f in "$O"/*-dso.txt; do echo "== $f"; head -25 "$f"; done
date -u
