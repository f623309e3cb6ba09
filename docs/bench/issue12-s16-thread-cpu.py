"""Per-thread CPU of processes over an interval, summed by thread kind (the name without
its digits), and the host's busy share from /proc/stat. Since session 18 also, from each
thread's /proc schedstat, the time its threads were runnable but waited for a CPU (in CPUs'
worth, like the CPU column) and the scheduler's slices per second.

    python3 issue12-s16-thread-cpu.py SECONDS PID...
"""
import os
import re
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def threads(pids):
    out = {}
    for pid in pids:
        base = f"/proc/{pid}/task"
        try:
            tids = os.listdir(base)
        except OSError:
            continue
        for tid in tids:
            try:
                raw = open(f"{base}/{tid}/stat").read()
            except OSError:
                continue
            comm = raw[raw.index("(") + 1 : raw.rindex(")")]
            f = raw[raw.rindex(")") + 2 :].split()
            try:
                sched = [int(x) for x in open(f"{base}/{tid}/schedstat").read().split()]
            except (OSError, ValueError):
                sched = [0, 0, 0]
            out[(pid, tid)] = (comm, int(f[11]) + int(f[12]), sched[1], sched[2])
    return out


def host():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f), f[3] + f[4]


def main():
    secs, pids = float(sys.argv[1]), sys.argv[2:]
    a, (ta, ia) = threads(pids), host()
    time.sleep(secs)
    b, (tb, ib) = threads(pids), host()
    kinds = {}
    for key, (comm, t, wait, slices) in b.items():
        before = a.get(key, (comm, t, wait, slices))
        d, dw, ds = t - before[1], wait - before[2], slices - before[3]
        kind = f"{key[0]}:{re.sub(r'[0-9]+', '#', comm)}"
        n, s, w, k = kinds.get(kind, (0, 0, 0, 0))
        kinds[kind] = (n + 1, s + d, w + dw, k + ds)
    print(f"host busy {1 - (ib - ia) / max(tb - ta, 1):.3f} of all CPUs over {secs}s")
    for kind, (n, s, w, k) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        if s:
            print(f"{kind:40s} threads {n:3d}  CPUs {s / TICK / secs:6.2f}"
                  f"  runnable-waiting {w / 1e9 / secs:6.2f}  slices/s {k / secs:9.0f}")


main()
