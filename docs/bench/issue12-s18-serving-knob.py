#!/usr/bin/env python3
"""Issue 12 (session 18): A/B of a host-memory setting in ONE initiator process against the
SAME target processes, so that two settings are not told apart by their processes (call 7
of session 18 compared two processes per setting with `scripts/bench-compare.sh`, and
batches its change could not reach moved 1.16-1.86x between them).

A probe wheel reads the setting from the environment variable --var at each use (per batch
or per call); this process sets it between phases, when no transfer is running. Targets:
tests/interop/upstream_peer.py bench-target with the same wheel, started once and kept.
Shapes: `serving-1peer` / `serving-4peers` (10 threads, each a synchronous batch of 32
writes of 32 KiB at a time, to one target or rotating over four, as
transfer_engine_bench's serving shape), `write-64KiBx64` (one thread, batches of 64 x
64 KiB). The settings of a round run in a rotated order; one JSON line per figure, with
the process's CPU time per request.

    PYTHONPATH=<unzipped wheel> python3 issue12-s18-serving-knob.py --var MC_PROBE_ALL_BUSY \
        --values 0,- [--shapes serving-4peers,serving-1peer,write-64KiBx64] [--rounds 3] [--duration 2]

A value of `-` leaves the variable unset (the build's default). Session 20 added the shapes
`read-*` (reads: `read-64KiBx64` as `write-64KiBx64`, larger batches of small reads, the serving
shapes) and `--settings`, several variables per
setting: `--settings=-,MC_PROBE_A=1,MC_PROBE_A=1+MC_PROBE_B=2` (each setting's variables set,
every variable named in any setting unset otherwise).
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "..", "..", "tests", "interop", "upstream_peer.py")
sys.path.insert(0, os.path.dirname(PEER))
import upstream_peer as up  # noqa: E402

SIZE = 1 << 30
SHAPES = {
    # name: (threads, targets, requests per batch, bytes per request)
    "serving-1peer": (10, 1, 32, 32 << 10),
    "serving-4peers": (10, 4, 32, 32 << 10),
    "write-64KiBx64": (1, 1, 64, 64 << 10),
    "read-64KiBx64": (1, 1, 64, 64 << 10),
    "read-64KiBx256": (1, 1, 256, 64 << 10),
    "read-16KiBx512": (1, 1, 512, 16 << 10),
    "read-serving-1peer": (10, 1, 32, 32 << 10),
    "read-serving-4peers": (10, 4, 32, 32 << 10),
}


def start_target():
    p = subprocess.Popen([sys.executable, PEER, "bench-target", "--size", str(SIZE)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    info = json.loads(p.stdout.readline())
    return p, info["session_id"], info["buffer"]


def run_shape(engine, buf, targets, shape, duration):
    threads, ntargets, reqs, block = SHAPES[shape]
    peers = targets[:ntargets]
    call = engine.batch_transfer_sync_read if shape.startswith("read") else engine.batch_transfer_sync_write
    lat, count, errors = [], [0] * threads, []
    stop = threading.Event()
    barrier = threading.Barrier(threads + 1)

    def worker(t):
        locs = [buf.addr + (t * reqs + j) * block for j in range(reqs)]
        mine = []
        barrier.wait()
        n = 0
        while not stop.is_set():
            _, seg, base = peers[(t + n) % len(peers)]
            remotes = [base + (t * reqs + j) * block for j in range(reqs)]
            t0 = time.perf_counter_ns()
            rc = call(seg, locs, remotes, [block] * reqs)
            mine.append(time.perf_counter_ns() - t0)
            if rc != 0:
                errors.append(f"thread {t}: rc {rc}")
                stop.set()
            n += 1
        count[t] = n
        lat.extend(mine)

    ths = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in ths:
        th.start()
    cpu0 = os.times()
    barrier.wait()
    t0 = time.perf_counter()
    stop.wait(duration)
    stop.set()
    for th in ths:
        th.join()
    secs = time.perf_counter() - t0
    cpu1 = os.times()
    if errors:
        raise SystemExit("; ".join(errors))
    lat.sort()
    n = sum(count) * reqs

    def pct(p):
        return round(lat[min(len(lat) - 1, int(p / 100 * len(lat)))] / 1000, 1)

    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {"gbps": round(n * block / secs / 1e9, 3), "batch_p50_us": pct(50),
            "batch_p99_us": pct(99), "cpu_us_per_request": round(cpu / n * 1e6, 2)}


def parse_settings(a):
    """[(label, {var: value})]: from --settings, else --var and --values."""
    if a.settings:
        out = []
        for setting in a.settings.split(","):
            pairs = [] if setting == "-" else [kv.split("=", 1) for kv in setting.split("+")]
            out.append((setting, dict(pairs)))
        return out
    return [(v, {} if v == "-" else {a.var: v}) for v in a.values.split(",")]


def main(a):
    settings = parse_settings(a)
    names = {k for _, env in settings for k in env} | ({a.var} if a.var else set())
    shapes = a.shapes.split(",")
    for s in shapes:
        if s not in SHAPES:
            raise SystemExit(f"unknown shape {s!r}: one of {', '.join(SHAPES)}")
    targets = [start_target() for _ in range(4)]
    ns = argparse.Namespace(host="127.0.0.1", metadata="P2PHANDSHAKE", protocol="tcp", device="")
    engine, _ = up.make_engine(ns)
    per_slot = max(t * r * b for t, _, r, b in SHAPES.values())
    buf = up.Buffer(per_slot)
    buf.clear(0x5A)
    up.register(engine, buf)
    for _, seg, base in targets:
        # Opens each segment (handshake, descriptor) outside the timed phases.
        up.check_rc("warm-up write", engine.batch_transfer_sync_write(seg, [buf.addr], [base], [4096]))
    cases = [(s, v) for s in shapes for v in settings]
    try:
        for r in range(a.rounds):
            k = r % len(cases)
            for shape, (label, env) in cases[k:] + cases[:k]:
                for name in names:
                    os.environ.pop(name, None)
                os.environ.update(env)
                time.sleep(0.2)
                out = run_shape(engine, buf, targets, shape, a.duration)
                key = a.var if not a.settings else "setting"
                print(json.dumps({"round": r, "shape": shape, key: label, **out}), flush=True)
    finally:
        for p, _, _ in targets:
            p.stdin.write("quit\n")
            p.stdin.flush()
            p.wait(timeout=30)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--var")
    ap.add_argument("--values", default="-")
    ap.add_argument("--settings", help="comma-separated; each `-` or VAR=V[+VAR=V...]")
    ap.add_argument("--shapes", default="serving-4peers,serving-1peer,write-64KiBx64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=2.0)
    main(ap.parse_args())
