# Smoke test of an installed wheel (xtask audit phase). Run as `python -I -c <this> mod1,mod2`
# from a directory outside the source tree. Imports the modules, then moves bytes over TCP
# between two engines in two processes (P2P handshake): write, then read back, both checked.
# Prints one JSON line: {"ok": true, ...} or {"ok": false, "error": ...}.
import ctypes
import hashlib
import importlib
import json
import subprocess
import sys

SIZE = 1 << 20
HOST = "127.0.0.1"

TARGET = r'''
import ctypes, hashlib, json, sys
from mooncake.engine import TransferEngine
e = TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, TransferEngine.last_error()
buf = ctypes.create_string_buffer(%d)
assert e.register_memory(ctypes.addressof(buf), len(buf)) == 0
print(json.dumps({"session_id": "127.0.0.1:%%d" %% e.get_rpc_port(), "buffer": ctypes.addressof(buf)}), flush=True)
for line in sys.stdin:
    if line.strip() == "sha256":
        print(hashlib.sha256(buf.raw).hexdigest(), flush=True)
    else:
        break
''' % SIZE


def main():
    modules = [m for m in sys.argv[1].split(",") if m]
    loaded = {}
    for m in modules:
        mod = importlib.import_module(m)
        loaded[m] = getattr(mod, "__file__", None) is not None
    from mooncake.engine import TransferEngine

    target = subprocess.Popen(
        [sys.executable, "-I", "-c", TARGET], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        hello = json.loads(target.stdout.readline())
        engine = TransferEngine()
        assert engine.initialize(HOST, "P2PHANDSHAKE", "tcp", "") == 0, TransferEngine.last_error()
        data = bytes((i * 131 + (i >> 8)) & 0xFF for i in range(SIZE))
        src = ctypes.create_string_buffer(data, SIZE)
        dst = ctypes.create_string_buffer(SIZE)
        for b in (src, dst):
            assert engine.register_memory(ctypes.addressof(b), SIZE) == 0
        rc = engine.transfer_sync_write(hello["session_id"], ctypes.addressof(src), hello["buffer"], SIZE)
        assert rc == 0, "write failed: %s" % TransferEngine.last_error()
        target.stdin.write("sha256\n")
        target.stdin.flush()
        want = hashlib.sha256(data).hexdigest()
        got = target.stdout.readline().strip()
        assert got == want, "target holds %s, wrote %s" % (got, want)
        rc = engine.transfer_sync_read(hello["session_id"], ctypes.addressof(dst), hello["buffer"], SIZE)
        assert rc == 0, "read failed: %s" % TransferEngine.last_error()
        assert dst.raw == data, "read back different bytes"
    finally:
        try:
            target.stdin.write("quit\n")
            target.stdin.flush()
        except OSError:
            pass
        target.wait(timeout=30)
    return {"ok": True, "imports": modules, "python": sys.version.split()[0], "bytes_moved": 2 * SIZE, "sha256": want}


try:
    result = main()
except Exception as e:  # reported, not raised: the caller reads one JSON line
    result = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
print(json.dumps(result))
sys.exit(0 if result["ok"] else 1)
