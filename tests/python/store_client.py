"""A Mooncake Store client process for the store tests (``test_store_*.py``).

Run by the python of the implementation under test (upstream's venv or ours), so that the
test process itself never loads a ``mooncake.store``. It speaks JSON lines on stdin/stdout:
one command per line, one reply per line, in order. Standard library only (upstream's venv
has no numpy).

Commands (``{"op": ..., ...}``):

- ``new``: ``{"op": "new", "name": "s"}`` makes a ``MooncakeDistributedStore`` called ``s``
  (``"s"`` is made at start, so most tests never send it).
- ``engine``: ``{"op": "engine", "args": [hostname, metadata, protocol, device]}`` makes a
  ``mooncake.engine.TransferEngine`` and initialises it; the reply has ``rc`` and
  ``rpc_port``. An argument ``{"engine": true}`` anywhere in a later call stands for
  ``te.get_engine()`` and ``{"te": true}`` for the Python ``TransferEngine`` itself.
- ``alloc``: ``{"op": "alloc", "name": "K", "size": N}`` maps N bytes (anonymous mmap,
  page-aligned, zeroed); the reply has ``addr``. ``{"ptr": "K", "off": 4096}`` in any call
  argument stands for that region's address plus ``off``.
- ``fill`` / ``check`` / ``memset``: ``{"op": "fill", "name": "K", "off": o, "len": n,
  "seed": "key"}`` writes ``pattern(seed, n)`` at ``K+o``; ``check`` compares the same and
  replies ``match`` (and ``first_bad`` when it does not); ``memset`` writes ``byte``.
- ``call``: ``{"op": "call", "method": "put_from", "args": [...], "kwargs": {...},
  "store": "s"}`` calls a method of the store and replies ``{"ok": true, "value": ...}``.
  ``{"cfg": {"replica_num": 1, "preferred_segment": "$hostname"}}`` stands for a
  ``ReplicateConfig`` with those attributes (``"$hostname"`` = this store's
  ``get_hostname()``); ``{"bytes_of": seed, "len": n}`` for ``pattern(seed, n)`` as bytes.
  A ``bytes`` result comes back as ``{"bytes_len": n, "sha256": ..., "head_hex": ...}``
  (compare with :func:`digest`); a ReplicaDescriptor list as its length.
- ``put_loop``: ``{"op": "put_loop", "prefix": p, "slots": n, "size": s, "rounds": r,
  "cfg": {...}}`` fills n slots of s bytes (slot j holds ``pattern(f"{p}{j}", s)``),
  replies ``{"started": true}``, then for each round i puts keys ``f"{p}{i}-{j}"`` from the
  slots with one ``batch_put_from`` and at the end replies all return codes. With
  ``"keep_rounds": k`` it removes round i-k's keys after round i (the pool never fills); with ``"progress": path`` it writes the round it is starting into that file.
  Meant to be killed in the middle: nearly all its time is spent inside
  ``batch_put_from``.
- ``get_loop``: ``{"op": "get_loop", "key": k, "size": s, "progress": path}`` registers a
  buffer of s bytes, replies ``{"started": true}``, then reads ``k`` into it with
  ``get_into`` until a read fails (replying every code it saw), writing the count of reads
  done into ``progress``. Meant to be killed in the middle of a read.
- ``sleep``, ``quit``.

Any exception in a command is replied as ``{"ok": false, "exc": type, "msg": str}``; the
process goes on. A crash in native code ends the process: the test sees its exit status.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import sys
import time


def pattern(seed: str, length: int) -> bytes:
    """The deterministic bytes of ``seed`` (an object's key, or key plus a part name)."""
    return hashlib.shake_128(seed.encode()).digest(length) if length else b""


def digest(data: bytes) -> dict:
    """How a ``bytes`` result is described in a reply."""
    return {"bytes_len": len(data), "sha256": hashlib.sha256(data).hexdigest(), "head_hex": data[:16].hex()}


class Region:
    def __init__(self, size: int):
        self.size = size
        self.mm = mmap.mmap(-1, max(size, 1))
        self._anchor = ctypes.c_char.from_buffer(self.mm)
        self.addr = ctypes.addressof(self._anchor)


class Client:
    def __init__(self):
        self.stores = {}
        self.regions: dict[str, Region] = {}
        self.te = None
        self.new("s")

    # --- argument decoding -------------------------------------------------------------
    def new(self, name: str):
        from mooncake.store import MooncakeDistributedStore

        self.stores[name] = MooncakeDistributedStore()

    def decode(self, v, store):
        if isinstance(v, list):
            return [self.decode(x, store) for x in v]
        if isinstance(v, dict):
            if "ptr" in v:
                return self.regions[v["ptr"]].addr + int(v.get("off", 0))
            if "cfg" in v:
                from mooncake.store import ReplicateConfig

                cfg = ReplicateConfig()
                for k, x in v["cfg"].items():
                    setattr(cfg, k, store.get_hostname() if x == "$hostname" else x)
                return cfg
            if "bytes_of" in v:
                return pattern(v["bytes_of"], int(v["len"]))
            if v.get("engine"):
                return self.te.get_engine()
            if v.get("te"):
                return self.te
            return {k: self.decode(x, store) for k, x in v.items()}
        return v

    @staticmethod
    def encode(v):
        if isinstance(v, (bytes, bytearray, memoryview)):
            return digest(bytes(v))
        if isinstance(v, (list, tuple)):
            if v and not isinstance(v[0], (bool, int, float, str, bytes, list, tuple, dict, type(None))):
                return {"replicas": len(v)}  # ReplicaDescriptor objects: how many
            return [Client.encode(x) for x in v]
        if isinstance(v, dict):
            return {str(k): Client.encode(x) for k, x in v.items()}
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        return repr(v)

    # --- commands ------------------------------------------------------------------------
    def handle(self, cmd: dict) -> dict:
        op = cmd["op"]
        if op == "new":
            self.new(cmd["name"])
            return {"ok": True}
        if op == "engine":
            from mooncake.engine import TransferEngine

            self.te = TransferEngine()
            rc = self.te.initialize(*cmd["args"])
            return {"ok": True, "rc": rc, "rpc_port": self.te.get_rpc_port() if rc == 0 else None}
        if op == "alloc":
            r = Region(int(cmd["size"]))
            self.regions[cmd["name"]] = r
            return {"ok": True, "addr": r.addr}
        if op in ("fill", "check", "memset"):
            r = self.regions[cmd["name"]]
            off, n = int(cmd.get("off", 0)), int(cmd["len"])
            assert 0 <= off and off + n <= r.size, "outside the region"
            if op == "memset":
                ctypes.memset(r.addr + off, int(cmd["byte"]), n)
                return {"ok": True}
            want = pattern(cmd["seed"], n)
            if op == "fill":
                r.mm[off : off + n] = want
                return {"ok": True}
            got = r.mm[off : off + n]
            if got == want:
                return {"ok": True, "match": True}
            bad = next(i for i in range(n) if got[i] != want[i])
            return {"ok": True, "match": False, "first_bad": bad}
        if op == "bytes":  # a region's bytes, described (for guard checks)
            r = self.regions[cmd["name"]]
            off, n = int(cmd.get("off", 0)), int(cmd["len"])
            return {"ok": True, "value": digest(r.mm[off : off + n]), "all_byte": _all_one_byte(r.mm[off : off + n])}
        if op == "call":
            store = self.stores[cmd.get("store", "s")]
            method = getattr(store, cmd["method"])
            args = self.decode(cmd.get("args", []), store)
            kwargs = {k: self.decode(x, store) for k, x in cmd.get("kwargs", {}).items()}
            t0 = time.monotonic()
            value = method(*args, **kwargs)
            return {"ok": True, "value": self.encode(value), "secs": time.monotonic() - t0}
        if op == "put_loop":
            return self.put_loop(cmd)
        if op == "get_loop":
            return self.get_loop(cmd)
        if op == "sleep":
            time.sleep(float(cmd["secs"]))
            return {"ok": True}
        raise ValueError(f"unknown op {op!r}")

    def put_loop(self, cmd: dict) -> dict:
        store = self.stores[cmd.get("store", "s")]
        prefix, slots, size, rounds = cmd["prefix"], int(cmd["slots"]), int(cmd["size"]), int(cmd["rounds"])
        cfg = self.decode({"cfg": cmd.get("cfg", {})}, store)
        region = Region(slots * size)
        self.regions[f"loop:{prefix}"] = region  # kept: a freed mapping may come back at the same address
        for j in range(slots):
            region.mm[j * size : (j + 1) * size] = pattern(f"{prefix}{j}", size)
        rc = store.register_buffer(region.addr, region.size)
        assert rc == 0, f"register_buffer: {rc}"
        ptrs = [region.addr + j * size for j in range(slots)]
        progress = os.open(cmd["progress"], os.O_WRONLY | os.O_CREAT, 0o644) if cmd.get("progress") else None
        reply({"started": True})
        codes = []
        for r in range(rounds):
            if progress is not None:
                os.pwrite(progress, b"%12d" % r, 0)
            codes.append(store.batch_put_from([f"{prefix}{r}-{j}" for j in range(slots)], ptrs, [size] * slots, cfg))
            if cmd.get("keep_rounds") and r >= int(cmd["keep_rounds"]):
                for j in range(slots):
                    store.remove(f"{prefix}{r - int(cmd['keep_rounds'])}-{j}")
        return {"ok": True, "value": codes}

    def get_loop(self, cmd: dict) -> dict:
        store = self.stores[cmd.get("store", "s")]
        key, size = cmd["key"], int(cmd["size"])
        region = Region(size)
        self.regions[f"get_loop:{key}"] = region
        rc = store.register_buffer(region.addr, region.size)
        assert rc == 0, f"register_buffer: {rc}"
        progress = os.open(cmd["progress"], os.O_WRONLY | os.O_CREAT, 0o644)
        reply({"started": True})
        done = 0
        while True:
            n = store.get_into(key, region.addr, size)
            if n < 0:
                return {"ok": True, "value": {"reads": done, "failed_with": n}}
            done += 1
            os.pwrite(progress, b"%12d" % done, 0)


def _all_one_byte(data: bytes):
    return data[0] if data and data.count(data[:1]) == len(data) else None


def reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    try:
        client = Client()
    except Exception as e:  # import failure: say so on the protocol, then exit
        reply({"ok": False, "exc": type(e).__name__, "msg": str(e), "hello": True})
        return 1
    reply({"ok": True, "hello": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            reply({"ok": True})
            return 0
        try:
            out = client.handle(cmd)
        except Exception as e:
            out = {"ok": False, "exc": type(e).__name__, "msg": str(e)[:2000]}
        reply(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
