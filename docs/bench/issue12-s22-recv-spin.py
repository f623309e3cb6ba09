#!/usr/bin/env python3
"""Issue 12 (session 22): a TARGET-side setting, A/B against the SAME four target processes.

The probe build (docs/bench/issue12-s22-recv-spin.patch) reads its setting from the file
MC_PROBE_RECV_SPIN_FILE names, every 50 ms; this driver writes the file between runs. Each
run is a fresh initiator process of the same binary (transfer_engine_bench, the serving
shapes), the settings' order rotated per round. During the middle of each run it samples the
targets' threads (/proc/PID/task/TID/schedstat and status) to get, per request: the targets'
CPU time, their time runnable but not running, and their sleeps (voluntary switches).

    python3 issue12-s22-recv-spin.py --bench BIN --settings 0,20,50 --rounds 6 --duration 2

An INITIATOR-side setting instead: `--initiator-var NAME` passes each setting to the fresh
initiator as NAME=VALUE (`-`: unset); the targets stay the same processes.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

CASES = {  # name: (targets, the initiator's shape flags)
    "serving-4peers": (4, ["--workload=serving"]),
    "serving-1peer": (1, ["--workload=serving"]),
    "write-64KiBx64": (1, ["--operation=write", "--block_size=65536", "--batch_size=64", "--threads=1"]),
    "write-4MiBx64": (1, ["--operation=write", "--block_size=4194304", "--batch_size=64", "--threads=1"]),
    "lat-write-4KiB": (1, ["--workload=latency", "--operation=write"]),
}


def threads_of(pids):
    """Per (pid, tid): [CPU ns, runnable-waiting ns, voluntary, involuntary switches]."""
    snap = {}
    for pid in pids:
        base = f"/proc/{pid}/task"
        try:
            tids = os.listdir(base)
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"{base}/{tid}/schedstat") as f:
                    on, wait, _ = f.read().split()
                with open(f"{base}/{tid}/status") as f:
                    st = f.read()
            except OSError:
                continue
            snap[(pid, tid)] = [int(on), int(wait),
                                int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", st, re.M).group(1)),
                                int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", st, re.M).group(1))]
    return snap


def delta(s0, s1):
    """Totals over the window: threads in both snapshots by difference, new ones whole
    (threads that ended within the window are missed)."""
    tot = [0, 0, 0, 0]
    for k, v in s1.items():
        b = s0.get(k, [0, 0, 0, 0])
        for i in range(4):
            tot[i] += v[i] - b[i]
    return {"cpu_ns": tot[0], "wait_ns": tot[1], "vol": tot[2], "invol": tot[3],
            "ended": sum(1 for k in s0 if k not in s1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--settings", default="0,20,50")
    ap.add_argument("--cases", default="serving-4peers,serving-1peer")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--initiator-var", default=None)
    a = ap.parse_args()
    settings = a.settings.split(",")
    cases = a.cases.split(",")
    knob = tempfile.NamedTemporaryFile("w", delete=False, suffix=".spin").name
    with open(knob, "w") as f:
        f.write("0")
    env = dict(os.environ, MC_PROBE_RECV_SPIN_FILE=knob)
    targets, segs = [], []
    for i in range(4):
        p = subprocess.Popen([a.bench, "--mode=target", "--protocol=tcp", "--metadata_server=P2PHANDSHAKE",
                              "--local_server_name=127.0.0.1", "--buffer_size=536870912"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        targets.append(p)
        for line in p.stdout:
            if line.startswith("segment_id="):
                segs.append(line.strip().split("=", 1)[1])
                break
    pids = [p.pid for p in targets]
    try:
        # A first run opens every connection and warms the targets; its figures are dropped.
        subprocess.run([a.bench, "--mode=initiator", "--protocol=tcp", "--metadata_server=P2PHANDSHAKE",
                        "--local_server_name=127.0.0.1", "--segment_id=" + ",".join(segs),
                        "--workload=serving", "--buffer_size=536870912", "--duration=1"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        for rnd in range(1, a.rounds + 1):
            k = (rnd - 1) % len(settings)
            for s in settings[k:] + settings[:k]:
                ini_env = dict(os.environ)
                if a.initiator_var:
                    ini_env.pop(a.initiator_var, None)
                    if s != "-":
                        ini_env[a.initiator_var] = s
                else:
                    with open(knob, "w") as f:
                        f.write(s)
                time.sleep(0.25)
                for case in cases:
                    n, shape = CASES[case]
                    cmd = [a.bench, "--mode=initiator", "--protocol=tcp", "--metadata_server=P2PHANDSHAKE",
                           "--local_server_name=127.0.0.1", "--segment_id=" + ",".join(segs[:n]),
                           *shape, "--buffer_size=536870912",
                           f"--duration={a.duration}", "--json"]
                    ini = subprocess.Popen(cmd, env=ini_env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                           text=True)
                    t0 = time.monotonic()
                    time.sleep(0.3 * a.duration)
                    s0, w0 = threads_of(pids), time.monotonic()
                    time.sleep(0.55 * a.duration)
                    s1, w1 = threads_of(pids), time.monotonic()
                    out, _ = ini.communicate(timeout=60)
                    r = {"setting": s, "case": case, "round": rnd}
                    js = [l for l in out.splitlines() if l.startswith("{")]
                    if not js:
                        r["error"] = "no result"
                    else:
                        d = json.loads(js[-1])
                        rate = d["requests_per_s"]
                        win = w1 - w0
                        r.update(gbps=round(d["gb_per_s"], 3), p50_us=round(d["latency_p50_us"], 1),
                                 p99_us=round(d["latency_p99_us"], 1),
                                 ini_cpu_us_per_req=round(d["cpu_us_per_request"], 2))
                        per = rate * win
                        t = delta(s0, s1)
                        r["tgt_cpu_us_per_req"] = round(t["cpu_ns"] / 1e3 / per, 2)
                        r["tgt_wait_us_per_req"] = round(t["wait_ns"] / 1e3 / per, 2)
                        r["tgt_sleeps_per_req"] = round(t["vol"] / per, 3)
                        r["tgt_preempt_per_req"] = round(t["invol"] / per, 3)
                        r["tgt_cpus"] = round(t["cpu_ns"] / 1e9 / win, 2)
                        r["tgt_threads_ended"] = t["ended"]
                    print(json.dumps(r), flush=True)
    finally:
        for p in targets:
            p.terminate()
        for p in targets:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        os.unlink(knob)
    return 0


if __name__ == "__main__":
    sys.exit(main())
