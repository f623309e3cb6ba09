"""Two upstream Mooncake processes over the soft NIC (protocol "rdma"): the initiator
WRITEs a pattern into the target's registered buffer, the target checks it and fills
the buffer with another pattern, the initiator READs that back and checks it.
Prints one line per check; run it under run-in-ns.sh with the soft NIC first on
LD_LIBRARY_PATH. LEN (bytes, default 1 MiB) and ITERS (timed WRITEs) from the env.
"""
import ctypes
import os
import subprocess
import sys
import time

from mooncake.engine import TransferEngine

N = int(os.environ.get("LEN", str(1 << 20)))
HCAS = os.environ.get("SOFTNIC_HCAS", "soft_0")


def pattern(seed):
    block = bytes(((i * 131 + seed) & 0xFF) for i in range(4096))
    return (block * (N // 4096 + 1))[:N]


def engine():
    e = TransferEngine()
    rc = e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", HCAS)
    assert rc == 0, f"initialize returned {rc}"
    return e


def target():
    e = engine()
    buf = ctypes.create_string_buffer(N)
    addr = ctypes.addressof(buf)
    assert e.register_memory(addr, N) == 0
    print(f"127.0.0.1:{e.get_rpc_port()} {addr}", flush=True)
    sys.stdin.readline()
    print("target sees written bytes:", buf.raw == pattern(7), flush=True)
    ctypes.memmove(addr, pattern(9), N)
    print("filled", flush=True)
    sys.stdin.readline()


def initiator():
    t = subprocess.Popen([sys.executable, __file__, "target"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    seg, raddr = t.stdout.readline().split()
    raddr = int(raddr)
    e = engine()
    src = ctypes.create_string_buffer(pattern(7), N)
    sa = ctypes.addressof(src)
    assert e.register_memory(sa, N) == 0
    rc = e.transfer_sync_write(seg, sa, raddr, N)  # the first one sets up the endpoints
    iters = int(os.environ.get("ITERS", "0"))
    t0 = time.time()
    for _ in range(iters):
        rc |= e.transfer_sync_write(seg, sa, raddr, N)
    if iters:
        dt = time.time() - t0
        print(f"timed: {iters} x {N} B WRITE, {N * iters / dt / 1e9:.3f} GB/s, "
              f"{dt / iters * 1e3:.2f} ms each", flush=True)
    print("write rc", rc, flush=True)
    t.stdin.write("\n")
    t.stdin.flush()
    print(t.stdout.readline().strip(), flush=True)
    t.stdout.readline()
    dst = ctypes.create_string_buffer(N)
    da = ctypes.addressof(dst)
    assert e.register_memory(da, N) == 0
    rc = e.transfer_sync_read(seg, da, raddr, N)
    print("read rc", rc, flush=True)
    print("initiator sees read bytes:", dst.raw == pattern(9), flush=True)
    t.stdin.write("\n")
    t.stdin.flush()
    t.wait()


if __name__ == "__main__":
    target() if sys.argv[1:] == ["target"] else initiator()
