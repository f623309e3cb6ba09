#!/usr/bin/env bash
# Session 8 (2026-12-01), fifth device call of issue 12, nvidia-h200 (16 CPUs): a
# system-wide perf profile (cpu-clock) of the serving workload with 4 peers, writes, ours
# (`.gpucarry-s8/bench`, 15bdd9b, symbols kept), to see where the 16 CPUs go.
#
#   bash docs/bench/issue12-device-calls-s8e.sh
set -uo pipefail
H=$PWD/.gpucarry-s8
O="${OUT:-/tmp/s8-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
tar xJf "$H/perf.txz" -C /tmp
PERF="env LD_LIBRARY_PATH=/tmp/perf/lib /tmp/perf/perf"
segs=()
for i in 1 2 3 4; do
    "$H/bench" --mode=target --protocol=tcp --local_server_name=127.0.0.1 --buffer_size=1073741824 \
        </dev/null >/tmp/t$i.log 2>&1 &
done
for i in 1 2 3 4; do
    for _ in $(seq 100); do grep -q segment_id= /tmp/t$i.log && break; sleep 0.1; done
    segs+=("$(grep -oE 'segment_id=[0-9.]+:[0-9]+' /tmp/t$i.log | head -1 | cut -d= -f2)")
done
seglist="$(IFS=,; echo "${segs[*]}")"
for run in plain profiled; do
    "$H/bench" --mode=initiator --protocol=tcp --local_server_name=127.0.0.1 --segment_id="$seglist" \
        --workload serving --operation=write --buffer_size=1073741824 --duration=5 --json \
        </dev/null >/tmp/init.out 2>/tmp/init.err &
    ip=$!
    if [ $run = profiled ]; then
        sleep 1.5
        $PERF record -a -g -e cpu-clock -F 499 -o /tmp/serving.data -- sleep 3 >/dev/null 2>&1
    fi
    wait $ip
    echo "== $run"; grep '^{' /tmp/init.out
done
{
    echo "== by thread"
    $PERF report -i /tmp/serving.data --stdio --no-children --sort comm --percent-limit 0.3 -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -60
    echo "== by symbol"
    $PERF report -i /tmp/serving.data --stdio --no-children --sort dso,sym --percent-limit 0.25 -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -120
    for c in bench te-lane te-recv te-tcp-conn; do
        echo "-- comm prefix $c"
        $PERF report -i /tmp/serving.data --stdio --no-children --sort comm,sym --percent-limit 0.15 -g none 2>/dev/null \
            | grep -v '^#' | grep -E "^ +[0-9.]+% +$c" | head -40
    done
    echo "== callers of the top kernel symbols (initiator submitters)"
    $PERF report -i /tmp/serving.data --stdio --no-children --comm bench --sort sym -G --percent-limit 2 2>/dev/null | grep -v '^$' | head -150
} >"$O/profile.txt" 2>&1
kill $(jobs -p) 2>/dev/null
head -80 "$O/profile.txt"
date -u
