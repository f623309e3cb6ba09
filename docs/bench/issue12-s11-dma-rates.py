# How fast do N streams of pinned<->device copies of a given size go on this host?
import sys, time, torch
dev = torch.device("cuda:0")
TOTAL = 4 << 30
def run(direction, chunk, nstreams, pinned=True):
    streams = [torch.cuda.Stream() for _ in range(nstreams)]
    hosts = [torch.empty(chunk * 2, dtype=torch.uint8, pin_memory=pinned) for _ in range(nstreams)]
    devbuf = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    n = TOTAL // chunk
    slots = (64 << 20) // chunk
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(n):
        s = i % nstreams
        h = hosts[s][(i // nstreams % 2) * chunk:][:chunk]
        d = devbuf[(i % slots) * chunk:][:chunk]
        with torch.cuda.stream(streams[s]):
            if direction == "h2d":
                d.copy_(h, non_blocking=True)
            else:
                h.copy_(d, non_blocking=True)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    print(f"{direction} chunk={chunk>>10}K streams={nstreams} {TOTAL/dt/1e9:.1f} GB/s  issue {dt/n*1e6:.1f} us/copy", flush=True)
for d in ["h2d", "d2h"]:
    for chunk in [128 << 10, 1 << 20, 4 << 20, 16 << 20]:
        for ns in [1, 16]:
            run(d, chunk, ns)
