#!/usr/bin/env python3
"""Session 12 probe (issue 12): can the H200 host's copy engines move host->device and
device->host at once as fast as each alone? Two processes on one GPU (as the loopback test
runs target and initiator), pinned host buffers, 2 MiB copies on 4 streams each, started
together, 2 s each. Prints one JSON line per process per mode.

    python3 issue12-s12-dma-both-ways.py            # all three modes
"""
import json
import subprocess
import sys
import time

CHUNK, STREAMS, SECS = 2 << 20, 4, 2.0


def worker(direction, start_at, mode):
    import torch
    dev = torch.device("cuda:0")
    streams = [torch.cuda.Stream() for _ in range(STREAMS)]
    host = torch.empty(CHUNK * STREAMS, dtype=torch.uint8, pin_memory=True)
    d = torch.empty(CHUNK * STREAMS, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    while time.time() < start_at:
        time.sleep(0.0005)
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < SECS:
        for s in range(STREAMS):
            hs, ds = host[s * CHUNK:(s + 1) * CHUNK], d[s * CHUNK:(s + 1) * CHUNK]
            with torch.cuda.stream(streams[s]):
                if direction == "h2d":
                    ds.copy_(hs, non_blocking=True)
                else:
                    hs.copy_(ds, non_blocking=True)
        n += STREAMS
        if n % (16 * STREAMS) == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    print(json.dumps({"mode": mode, "dir": direction, "chunk": CHUNK,
                      "gbps": round(n * CHUNK / dt / 1e9, 2)}), flush=True)


def main():
    for mode, dirs in (("h2d alone", ["h2d"]), ("d2h alone", ["d2h"]), ("both", ["h2d", "d2h"])):
        start_at = time.time() + 10
        ps = [subprocess.Popen([sys.executable, __file__, "worker", d, str(start_at), mode])
              for d in dirs]
        for p in ps:
            p.wait()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], float(sys.argv[3]), sys.argv[4])
    else:
        main()
