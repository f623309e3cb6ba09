#!/usr/bin/env python3
"""Session 13 probe (issue 12): does a socket read cost more CPU per byte into pinned
(cudaHostAlloc) memory than into ordinary memory? Session 12's probe timed the engine's
reads into its staging chunks at 0.30 s per GB against 0.23 into host memory. Here,
without the engine: PAIRS sender/receiver process pairs over loopback, each receiver
reading 2 MiB at a time into the destination below, for SECS; prints one JSON line per
kind with the receivers' CPU seconds per GB and the aggregate GB/s.

Kinds of destination:
  ordinary-hot   two 2 MiB halves of one ordinary 4 MiB buffer, alternating (staging's shape)
  ordinary-cold  2 MiB windows walking a 256 MiB ordinary buffer (the host-memory path's)
  pinned         two halves of a 4 MiB cudaHostAlloc buffer (torch pin_memory)
  pinned+h2d     as pinned, each filled half copied to the GPU on its own stream, and
                 synchronised before it is filled again (what the engine's receive does)
  registered-thp a 4 MiB mmap on a 2 MiB boundary, MADV_HUGEPAGE, cudaHostRegister'ed

    python3 issue12-s13-recv-into.py [PAIRS] [SECS]
"""
import json
import mmap
import os
import socket
import subprocess
import sys
import time

CHUNK = 2 << 20
KINDS = os.environ.get(
    "KINDS", "ordinary-hot,ordinary-cold,pinned,pinned+h2d,registered-thp").split(",")


def sender(port, start_at, secs):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = memoryview(bytearray(os.urandom(1 << 16)) * (CHUNK >> 16))
    while time.time() < start_at:
        time.sleep(0.0005)
    end = start_at + secs + 0.3
    try:
        while time.time() < end:
            s.sendall(buf)
    except OSError:
        pass
    s.close()


def destination(kind):
    """(list of 2 MiB memoryviews to fill in turn, per-window hook after filling)"""
    if kind == "ordinary-hot":
        b = bytearray(2 * CHUNK)
        return [memoryview(b)[i * CHUNK:(i + 1) * CHUNK] for i in range(2)], None
    if kind == "ordinary-cold":
        b = bytearray(128 * CHUNK)
        return [memoryview(b)[i * CHUNK:(i + 1) * CHUNK] for i in range(128)], None
    import torch
    if kind in ("pinned", "pinned+h2d"):
        t = torch.empty(2 * CHUNK, dtype=torch.uint8, pin_memory=True)
        views = [memoryview(t[i * CHUNK:(i + 1) * CHUNK].numpy()) for i in range(2)]
        if kind == "pinned":
            return views, None
        dev = torch.empty(2 * CHUNK, dtype=torch.uint8, device="cuda:0")
        streams = [torch.cuda.Stream() for _ in range(2)]
        halves = [t[i * CHUNK:(i + 1) * CHUNK] for i in range(2)]
        dhalves = [dev[i * CHUNK:(i + 1) * CHUNK] for i in range(2)]

        def after(i):
            j = i % 2
            with torch.cuda.stream(streams[j]):
                dhalves[j].copy_(halves[j], non_blocking=True)
            # The other half is filled next: its copy must have landed.
            streams[j ^ 1].synchronize()
        return views, after
    if kind == "registered-thp":
        m = mmap.mmap(-1, 4 * CHUNK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        import ctypes
        base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        off = (-base) % CHUNK
        m.madvise(mmap.MADV_HUGEPAGE, off, 2 * CHUNK)
        view = memoryview(m)[off:off + 2 * CHUNK]
        view[:] = b"\0" * (2 * CHUNK)
        torch.cuda.init()
        rc = torch.cuda.cudart().cudaHostRegister(base + off, 2 * CHUNK, 0)
        assert int(rc) == 0, f"cudaHostRegister: {rc}"
        return [view[i * CHUNK:(i + 1) * CHUNK] for i in range(2)], None
    raise ValueError(kind)


def receiver(kind, port_file, start_at, secs):
    views, after = destination(kind)
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    with open(port_file, "w") as f:
        f.write(str(ls.getsockname()[1]))
    c, _ = ls.accept()
    while time.time() < start_at + 0.1:
        time.sleep(0.0005)
    n, i = 0, 0
    t0, c0 = time.perf_counter(), time.thread_time()
    while time.perf_counter() - t0 < secs:
        v = views[i % len(views)]
        got = 0
        while got < CHUNK:
            r = c.recv_into(v[got:], CHUNK - got)
            if r == 0:
                break
            got += r
        n += got
        if after:
            after(i)
        i += 1
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    print(json.dumps({"kind": kind, "bytes": n, "wall": wall, "cpu": cpu}), flush=True)
    c.close()


def main(pairs, secs):
    for kind in KINDS * 2:
        start_at = time.time() + 8
        recvs, sends = [], []
        for p in range(pairs):
            pf = f"/tmp/recv-into-{os.getpid()}-{p}"
            if os.path.exists(pf):
                os.remove(pf)
            recvs.append((pf, subprocess.Popen(
                [sys.executable, __file__, "receiver", kind, pf, str(start_at), str(secs)],
                stdout=subprocess.PIPE, text=True)))
        for pf, _ in recvs:
            while not (os.path.exists(pf) and open(pf).read()):
                time.sleep(0.01)
            sends.append(subprocess.Popen(
                [sys.executable, __file__, "sender", open(pf).read(), str(start_at), str(secs)]))
        rows = [json.loads(p.communicate()[0]) for _, p in recvs]
        for s in sends:
            s.wait()
        b = sum(r["bytes"] for r in rows)
        print(json.dumps({
            "kind": kind, "pairs": pairs,
            "gbps": round(b / max(r["wall"] for r in rows) / 1e9, 2),
            "recv_cpu_s_per_gb": round(sum(r["cpu"] for r in rows) / (b / 1e9), 3),
        }), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "receiver":
        receiver(sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]))
    elif len(sys.argv) > 1 and sys.argv[1] == "sender":
        sender(int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 8,
             float(sys.argv[2]) if len(sys.argv) > 2 else 2.0)
