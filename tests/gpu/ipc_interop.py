#!/usr/bin/env python3
"""nvlink_intra interop with upstream's CUDA 13 wheel (0.3.14), both ways, bytes verified.

Run by run_ipc_on_device.sh with the carried folder as argument: `up/` holds upstream's
wheel and `libs/` its missing libraries (../shared/tools/carry-upstream-for-gpu-host.sh);
our wheel is unzipped in `site/`. Each engine runs in its own process (both import
`mooncake.engine`): a target on cuda:0 registers a 64 MiB tensor, an initiator on cuda:1
(cuda:0 on a one-GPU host) reads it, writes a new pattern and the target's bytes are compared.

    python3 ipc_interop.py main CARRIED_DIR
"""
import hashlib
import json
import os
import subprocess
import sys
import time

MiB = 1 << 20
SIZE = 64 * MiB


def env_for(impl, here):
    env = dict(os.environ)
    if impl == "up":
        env["PYTHONPATH"] = os.path.join(here, "up")
        env["LD_LIBRARY_PATH"] = os.path.join(here, "libs") + ":/usr/local/cuda-13.0/targets/x86_64-linux/lib"
    else:
        env["PYTHONPATH"] = os.path.join(here, "site")
    return env


def pattern(torch, n, seed, device):
    i = torch.arange(n, device=device, dtype=torch.int64)
    return ((i * 131 + seed * 7 + (i >> 8) + (i >> 16)) & 0xFF).to(torch.uint8)


def sha(t):
    return hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()


def target(protocol):
    import torch
    from mooncake.engine import TransferEngine
    torch.cuda.set_device(0)
    t = pattern(torch, SIZE, 3, "cuda:0")
    torch.cuda.synchronize()
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
    assert e.register_memory(t.data_ptr(), SIZE, "cuda:0") == 0
    print(json.dumps({"session": f"127.0.0.1:{e.get_rpc_port()}", "addr": t.data_ptr()}), flush=True)
    for line in sys.stdin:
        if line.startswith("sha"):
            torch.cuda.synchronize()
            print(sha(t), flush=True)
        else:
            break


def initiator(protocol, session, addr):
    import torch
    from mooncake.engine import TransferEngine
    dev = f"cuda:{1 if torch.cuda.device_count() > 1 else 0}"
    torch.cuda.set_device(dev)
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
    local = torch.zeros(SIZE, dtype=torch.uint8, device=dev)
    e.register_memory(local.data_ptr(), SIZE, dev)
    t0 = time.perf_counter()
    rc = e.transfer_sync_read(session, local.data_ptr(), addr, SIZE)
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    ok_read = rc == 0 and torch.equal(local, pattern(torch, SIZE, 3, dev))
    src = pattern(torch, SIZE, 9, dev)
    torch.cuda.synchronize()
    rc2 = e.transfer_sync_write(session, src.data_ptr(), addr, SIZE)
    reps, t1 = 0, time.perf_counter()
    while time.perf_counter() - t1 < 1.0 and rc2 == 0:
        rc2 = e.transfer_sync_write(session, src.data_ptr(), addr, SIZE)
        reps += 1
    gbps = reps * SIZE / (time.perf_counter() - t1) / 1e9
    print(json.dumps({"read_rc": rc, "read_ok": ok_read, "first_read_s": dt, "write_rc": rc2,
                      "write_gbps": gbps, "write_sha": sha(src)}), flush=True)


def pair(here, tgt_impl, tgt_proto, ini_impl, ini_proto, extra_tgt_env, extra_ini_env):
    tenv = env_for(tgt_impl, here)
    tenv.update(extra_tgt_env)
    ienv = env_for(ini_impl, here)
    ienv.update(extra_ini_env)
    tp = subprocess.Popen([sys.executable, __file__, "target", tgt_proto], env=tenv,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = tp.stdout.readline()
        info = json.loads(line)
        ip = subprocess.run([sys.executable, __file__, "initiator", ini_proto, info["session"], str(info["addr"])],
                            env=ienv, capture_output=True, text=True, timeout=60)
        res = {}
        for l in ip.stdout.splitlines():
            if l.startswith("{"):
                res = json.loads(l)
        tp.stdin.write("sha\n")
        tp.stdin.flush()
        tsha = tp.stdout.readline().strip()
        ok = res.get("read_ok") and res.get("write_rc") == 0 and tsha == res.get("write_sha")
        name = (f"{tgt_impl} target ({tgt_proto}, {extra_tgt_env}) <- {ini_impl} initiator "
                f"({ini_proto}, {extra_ini_env})")
        print(("PASS " if ok else "FAIL ") + name + " " + json.dumps(res), flush=True)
        print("  initiator stderr tail:\n" + ip.stderr[-2000:], flush=True)
        tp.stdin.write("quit\n")
        tp.stdin.flush()
    except Exception as ex:  # report and go on to the other direction
        print(f"FAIL {tgt_impl} target <- {ini_impl} initiator: {ex!r}", flush=True)
    finally:
        tp.kill()
        _, err = tp.communicate(timeout=30)
        print("  target stderr tail:\n" + err[-1200:], flush=True)


def main(here):
    nv = {"MC_INTRANODE_NVLINK": "1"}
    # Upstream target asked for nvlink_intra (protocol argument, then also MC_INTRANODE_NVLINK);
    # our initiator with protocol tcp (IPC is chosen per request when the peer offers it).
    for up_env in ({}, nv):
        pair(here, "up", "nvlink_intra", "ours", "tcp", up_env, {})
    # Our target advertising nvlink_intra (MC_INTRANODE_NVLINK, as upstream); upstream initiator.
    for up_env in ({}, nv):
        pair(here, "ours", "tcp", "up", "nvlink_intra", nv, up_env)


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "main":
        main(sys.argv[2])
    elif role == "target":
        target(sys.argv[2])
    else:
        initiator(sys.argv[2], sys.argv[3], int(sys.argv[4]))
