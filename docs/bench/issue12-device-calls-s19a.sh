#!/usr/bin/env bash
# Session 19 (2026-12-02), first device call of issue 12, nvidia-h200 (16 CPUs): session
# 18's call 7 A/B of docs/bench/issue12-s18f-probe.patch (a synchronous batch to a link with
# few requests in flight still goes out on its caller's thread when the engine has a slice
# out for every lane of its budget) was confounded by its separate processes per setting.
# Here in ONE initiator process against the same 4 targets (docs/bench/issue12-s18-serving-knob.py),
# MC_PROBE_ALL_BUSY=0 (main's rule) against unset (the clause on), 5 rounds, order rotated.
# The probe wheel is the patch applied to 3a90691 (.gpucarry-s19/site).
#
#   bash docs/bench/issue12-device-calls-s19a.sh
set -uo pipefail
H=$PWD/.gpucarry-s19
O="${OUT:-/tmp/s19-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
echo "cpuidle: $(cat /sys/devices/system/cpu/cpuidle/current_driver /sys/devices/system/cpu/cpuidle/current_governor 2>&1 | tr '\n' ' ')"
echo "sched: $(uname -r) nproc $(nproc) $(sysctl -n kernel.sched_schedstats 2>&1)"
export PYTHONPATH=$H/site MC_LOG_LEVEL=warn
timeout 240 python3 docs/bench/issue12-s18-serving-knob.py --var MC_PROBE_ALL_BUSY --values 0,- \
    --shapes serving-4peers,serving-1peer,write-64KiBx64 --rounds 5 --duration 2 \
    | tee "$O/all-busy.jsonl"
date -u
