#!/usr/bin/env python3
"""One Transfer Engine peer driven by the published upstream wheel (`mooncake.engine`).

Run it with the upstream venv's python (scripts/setup-upstream.sh prints the path). Every
engine is created with ``initialize(host, METADATA, PROTOCOL, DEVICE)`` (``--metadata``,
default "P2PHANDSHAKE"; ``--protocol``, default "tcp"; ``--device``, default ""); with
protocol tcp ``MC_FORCE_TCP=1`` is set here unless the caller set it, so only the TCP
transport is installed. In P2P mode the session id of an engine is
``"<host>:<get_rpc_port()>"`` (any port in the hostname is ignored upstream); with a
metadata store (``http://...``, ``etcd://...``) it is ``--host`` verbatim.

Output contract
---------------
stdout carries only this script's JSON lines (one object per line, flushed at once). The
engine's own output (glog on stderr, anything a C++ library writes to fd 1) goes to stderr:
fd 1 is redirected to stderr before the engine is imported, and the JSON is written to a
private duplicate of the original stdout. Diagnostics go to stderr.

Exit status: 0 success; 1 a transfer returned non-zero, a verification failed, or the engine
failed to start (the last JSON line then has ``"ok": false`` and ``"error"``); 2 usage error.

Data pattern
------------
``pattern(seed)`` is the infinite byte sequence

    byte[i] = (i*131 + seed*7 + (i >> 8) + (i >> 16)) & 0xff        for i = 0, 1, 2, ...

where i is the byte offset from the start of the buffer (not from the start of a request),
and seed is a non-negative integer. Consecutive bytes differ (131 is odd), the sequence is
not periodic at 256 (the ``i >> 8`` term) nor at 65536 (the ``i >> 16`` term), so a block
landing at the wrong offset is detected. In Rust, with i and seed as u64:
``(i.wrapping_mul(131) + seed.wrapping_mul(7) + (i >> 8) + (i >> 16)) as u8``.

Modes
-----
target --size N --pattern-seed S
    Allocates N bytes (anonymous mmap, page aligned), fills them with pattern(S), registers
    them, and prints ``{"mode": "target", "session_id": "127.0.0.1:15123", "buffer": ADDR,
    "size": N, "rpc_port": P, "pid": PID, "ok": true}``. Then serves commands on stdin, one
    per line, each answered by one line on stdout:
        dump OFFSET LEN         -> the sha256 hex digest of buffer[OFFSET:OFFSET+LEN]
        check OFFSET LEN SEED   -> "ok", or "mismatch at OFFSET" (first bad byte, absolute
                                   offset) when buffer[OFFSET:OFFSET+LEN] != pattern(SEED)
                                   over the same offsets
        ping                    -> "pong"
        notifies                -> a JSON list [{"name": .., "msg": ..}, ...] of the
                                   notifications received since the last ``notifies``
                                   (``get_notifies()`` drains them)
        quit                    -> exits 0
    anything else -> "error: ...". It exits 0 when stdin closes, or on SIGTERM/SIGINT.
    With ``--wait signal`` it ignores stdin and waits only for SIGTERM/SIGINT (for callers
    that start it with stdin=/dev/null).

initiator --peer SESSION --peer-buffer ADDR --size N --seed S [--expect-peer-seed P]
    Against a target's buffer [ADDR, ADDR+N):
      1. transfer_sync_read of the whole range; prints its sha256 as "peer_original_sha256"
         (checked against pattern(P) when --expect-peer-seed is given);
      2. batch: local buffer filled with pattern(S+1) and cut into --blocks equal blocks;
         batch_transfer_sync_write sends local block j to peer block (K-1-j) (reversed, so a
         request that ignored its address would be caught); a single transfer_sync_read of
         the whole range checks the reversed layout; then batch_transfer_sync_read of the same
         mapping into a cleared buffer must give pattern(S+1) back;
      3. unaligned: a small transfer_sync_write/read at odd local/peer offsets;
      4. single: transfer_sync_write of pattern(S) over the whole range, cleared local
         buffer, transfer_sync_read, compare.
    After success the peer holds exactly pattern(S) over [0, N): its sha256 is printed as
    "final_peer_sha256" (compare with the target's ``dump 0 N``).
    --check-reject additionally checks that a write and a read that run past the end of the
    peer's registered buffer, and a write to an unknown peer, return non-zero (and reports
    how long each took). N must be >= 2 * --blocks and >= 64.

notify --peer SESSION --peer-buffer ADDR --size N --seed S --name NAME --msg MSG
    Probe and notify against a target: ``send_probe(peer)`` must return 0 and
    ``send_probe`` to an unknown peer non-zero; ``get_first_buffer_address(peer)`` is
    reported (and must equal ADDR); then ``transfer_sync(peer, .., WRITE,
    notify=TransferNotify(NAME, MSG))`` writes pattern(S) over [ADDR, ADDR+N), which also
    sends the notification. Prints ``{"mode": "notify", "ok": true, "probe_rc": 0,
    "probe_unknown_rc": RC, "first_buffer_address": A, "write_rc": 0, ...}``.

bench-target --size N
    Like target but the buffer is filled with 0xCC (pages faulted in) instead of a pattern,
    and there is no pattern-related command.

bench-initiator --peer SESSION --peer-buffer ADDR --peer-size N --block-size B
                --batch-size K --duration D --op read|write [--threads T]
    Each of T threads (default 1) loops batch_transfer_sync_{write,read} of K requests of B
    bytes for D seconds; thread t uses local and peer offsets ((t*K + j) * B) mod the usable
    size, so the peer buffer should hold at least T*K*B bytes (offsets wrap otherwise).
    Prints {"gbps": bytes/1e9/elapsed, "req_per_s": ..., "batch_p50_us": ..., ...}.
    Several targets: --peer A,B,... with --peer-buffer ADDR_A,ADDR_B,... (same order); batch
    n of thread t goes to target (t + n) mod count, as our bench's --segment_id=A,B,... does.
    --latency: single transfer_sync_{write,read} of --block-size bytes (default 4096 in this
    mode), one at a time, for D seconds after --warmup transfers; prints p50/p90/p99/max/mean
    in microseconds.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import mmap
import os
import signal
import sys
import threading
import time

# ---------------------------------------------------------------------------------------
# stdout discipline: JSON goes to a private copy of fd 1; fd 1 itself becomes stderr so that
# nothing the C++ engine prints can corrupt the protocol. Done before mooncake is imported.
# ---------------------------------------------------------------------------------------
_OUT = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
os.dup2(2, 1)
sys.stdout = sys.stderr


def emit_line(text: str) -> None:
    _OUT.write(text + "\n")
    _OUT.flush()


def emit(obj: dict) -> None:
    emit_line(json.dumps(obj, sort_keys=False))


def log(msg: str) -> None:
    print(f"upstream_peer[{os.getpid()}]: {msg}", file=sys.stderr, flush=True)


class Failure(Exception):
    """A transfer or verification failed; reported as {"ok": false, "error": ...}."""


# ---------------------------------------------------------------------------------------
# Pattern
# ---------------------------------------------------------------------------------------
_CHUNK = 1 << 16  # the pattern's structure repeats per 64 KiB chunk up to an additive constant
_BASE_ROWS = bytes((c * 131) & 0xFF for c in range(256))
_ADD_TABLES = [bytes((x + k) & 0xFF for x in range(256)) for k in range(256)]
_chunk_cache: dict[int, bytes] = {}


def _chunk0(seed: int) -> bytes:
    """pattern(seed) for offsets [0, 65536)."""
    key = seed & 0xFF
    c = _chunk_cache.get(key)
    if c is None:
        # i = b*256 + c: byte = 131c + 7*seed + b   (i>>8 = b, i>>16 = 0)
        c = b"".join(_BASE_ROWS.translate(_ADD_TABLES[(b + seed * 7) & 0xFF]) for b in range(256))
        _chunk_cache[key] = c
    return c


def pattern_bytes(seed: int, offset: int, length: int) -> bytes:
    """pattern(seed)[offset:offset+length] (see the module docstring)."""
    out = bytearray()
    base = _chunk0(seed)
    pos = offset
    end = offset + length
    while pos < end:
        # i = a*65536 + b*256 + c: byte = 131c + 7*seed + b + a (mod 256), i.e. chunk0 + a
        a = pos >> 16
        chunk = base.translate(_ADD_TABLES[a & 0xFF])
        lo = pos & (_CHUNK - 1)
        hi = min(_CHUNK, lo + (end - pos))
        out += chunk[lo:hi]
        pos += hi - lo
    return bytes(out)


def fill_pattern(mv: memoryview, seed: int, offset: int, length: int, buf_offset: int | None = None) -> None:
    """Write pattern(seed)[offset:offset+length] into mv[buf_offset:...] (default buf_offset=offset)."""
    dst = offset if buf_offset is None else buf_offset
    step = 1 << 24
    done = 0
    while done < length:
        n = min(step, length - done)
        mv[dst + done : dst + done + n] = pattern_bytes(seed, offset + done, n)
        done += n


def first_mismatch(mv: memoryview, seed: int, offset: int, length: int, buf_offset: int | None = None) -> int | None:
    """Absolute pattern offset of the first byte that differs, or None."""
    src = offset if buf_offset is None else buf_offset
    step = 1 << 24
    done = 0
    while done < length:
        n = min(step, length - done)
        want = pattern_bytes(seed, offset + done, n)
        got = mv[src + done : src + done + n]
        if got != want:
            for k in range(n):
                if got[k] != want[k]:
                    return offset + done + k
        done += n
    return None


def sha256_of(mv: memoryview, offset: int, length: int) -> str:
    return hashlib.sha256(mv[offset : offset + length]).hexdigest()


def pattern_sha256(seed: int, offset: int, length: int) -> str:
    h = hashlib.sha256()
    step = 1 << 24
    done = 0
    while done < length:
        n = min(step, length - done)
        h.update(pattern_bytes(seed, offset + done, n))
        done += n
    return h.hexdigest()


# ---------------------------------------------------------------------------------------
# Engine and memory
# ---------------------------------------------------------------------------------------
class Buffer:
    """Page-aligned anonymous memory with its address and a memoryview."""

    def __init__(self, size: int):
        if size <= 0:
            raise ValueError("size must be positive")
        self.size = size
        self.mm = mmap.mmap(-1, size)
        self._anchor = ctypes.c_char.from_buffer(self.mm)  # keeps the export alive
        self.addr = ctypes.addressof(self._anchor)
        self.mv = memoryview(self.mm)

    def clear(self, byte: int = 0) -> None:
        ctypes.memset(self.addr, byte, self.size)


def make_engine(args):
    if args.protocol == "tcp":
        os.environ.setdefault("MC_FORCE_TCP", "1")
    from mooncake.engine import TransferEngine  # imported late: after the fd-1 redirect

    engine = TransferEngine()
    rc = engine.initialize(args.host, args.metadata, args.protocol, args.device)
    if rc != 0:
        raise Failure(f"initialize({args.host!r}, {args.metadata!r}, {args.protocol!r}, {args.device!r}) returned {rc}")
    # P2P: peers address it as host:rpc_port. With a metadata store (http://, etcd://) the
    # segment name is the hostname verbatim.
    if args.metadata == "P2PHANDSHAKE":
        session_id = f"{args.host}:{engine.get_rpc_port()}"
    else:
        session_id = args.host
    return engine, session_id


def register(engine, buf: Buffer) -> None:
    rc = engine.register_memory(buf.addr, buf.size)
    if rc != 0:
        raise Failure(f"register_memory({buf.addr:#x}, {buf.size}) returned {rc}")


def check_rc(what: str, rc: int) -> None:
    if rc != 0:
        raise Failure(f"{what} returned {rc}")


# ---------------------------------------------------------------------------------------
# Waiting for the end (target modes)
# ---------------------------------------------------------------------------------------
class _Stop(Exception):
    pass


def _on_signal(signum, _frame):
    raise _Stop(signal.Signals(signum).name)


def serve(buf: Buffer, wait: str, with_pattern: bool, engine=None) -> str:
    """Serve stdin commands (or wait for a signal); returns why it stopped."""
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        if wait == "signal":
            while True:
                signal.pause()
        for raw in sys.stdin:
            parts = raw.split()
            if not parts:
                continue
            cmd = parts[0]
            try:
                if cmd == "dump" and len(parts) == 3:
                    off, ln = int(parts[1], 0), int(parts[2], 0)
                    if off < 0 or ln < 0 or off + ln > buf.size:
                        emit_line(f"error: range {off}+{ln} outside buffer of {buf.size}")
                    else:
                        emit_line(sha256_of(buf.mv, off, ln))
                elif cmd == "check" and len(parts) == 4 and with_pattern:
                    off, ln, seed = int(parts[1], 0), int(parts[2], 0), int(parts[3], 0)
                    if off < 0 or ln < 0 or off + ln > buf.size:
                        emit_line(f"error: range {off}+{ln} outside buffer of {buf.size}")
                    else:
                        bad = first_mismatch(buf.mv, seed, off, ln)
                        emit_line("ok" if bad is None else f"mismatch at {bad}")
                elif cmd == "ping":
                    emit_line("pong")
                elif cmd == "notifies" and len(parts) == 1 and engine is not None:
                    emit_line(json.dumps([{"name": n.name, "msg": n.msg} for n in engine.get_notifies()]))
                elif cmd == "quit":
                    return "quit"
                else:
                    emit_line(f"error: unknown command {raw.strip()!r}")
            except ValueError as e:
                emit_line(f"error: {e}")
        return "stdin closed"
    except _Stop as e:
        return str(e)


def run_target(args) -> int:
    buf = Buffer(args.size)
    if args.mode == "target":
        fill_pattern(buf.mv, args.pattern_seed, 0, args.size)
    else:
        buf.clear(0xCC)
    engine, session_id = make_engine(args)
    register(engine, buf)
    out = {
        "mode": args.mode,
        "ok": True,
        "session_id": session_id,
        "buffer": buf.addr,
        "size": buf.size,
        "rpc_port": engine.get_rpc_port(),
        "pid": os.getpid(),
    }
    if args.mode == "target":
        out["pattern_seed"] = args.pattern_seed
    emit(out)
    why = serve(buf, args.wait, with_pattern=args.mode == "target", engine=engine)
    log(f"stopping: {why}")
    return 0


# ---------------------------------------------------------------------------------------
# Initiator (correctness)
# ---------------------------------------------------------------------------------------
def run_initiator(args) -> int:
    n, k, peer, paddr = args.size, args.blocks, args.peer, args.peer_buffer
    if k < 1 or n < 2 * k or n < 64:
        raise Failure(f"--size {n} too small for --blocks {k} (need size >= 2*blocks and >= 64)")
    engine, session_id = make_engine(args)
    buf = Buffer(n)
    register(engine, buf)
    result = {"mode": "initiator", "ok": False, "session_id": session_id, "peer": peer, "size": n, "seed": args.seed}
    timings = {}

    def timed(name, fn, *a):
        t0 = time.perf_counter()
        rc = fn(*a)
        timings[name] = round(time.perf_counter() - t0, 6)
        return rc

    try:
        # 1. the peer's original contents
        buf.clear()
        check_rc("transfer_sync_read (original)", timed("read_original", engine.transfer_sync_read, peer, buf.addr, paddr, n))
        result["peer_original_sha256"] = sha256_of(buf.mv, 0, n)
        if args.expect_peer_seed is not None:
            bad = first_mismatch(buf.mv, args.expect_peer_seed, 0, n)
            if bad is not None:
                raise Failure(f"peer's original data differs from pattern({args.expect_peer_seed}) at offset {bad}")
            result["peer_original_matches_seed"] = args.expect_peer_seed

        # 2. batch, reversed block mapping, seed S+1
        bs = n // k
        bseed = args.seed + 1
        buf.clear()
        fill_pattern(buf.mv, bseed, 0, bs * k)
        locs = [buf.addr + j * bs for j in range(k)]
        remotes = [paddr + (k - 1 - j) * bs for j in range(k)]
        lens = [bs] * k
        check_rc(f"batch_transfer_sync_write ({k} x {bs})", timed("batch_write", engine.batch_transfer_sync_write, peer, locs, remotes, lens))
        buf.clear()
        check_rc("transfer_sync_read (batch layout)", engine.transfer_sync_read(peer, buf.addr, paddr, bs * k))
        for j in range(k):  # peer block p holds pattern block k-1-p (pattern offsets of the local block)
            p = k - 1 - j
            bad = first_mismatch(buf.mv, bseed, j * bs, bs, buf_offset=p * bs)
            if bad is not None:
                raise Failure(f"after batch write, peer block {p} (local block {j}) differs at pattern offset {bad}")
        buf.clear()
        check_rc(f"batch_transfer_sync_read ({k} x {bs})", timed("batch_read", engine.batch_transfer_sync_read, peer, locs, remotes, lens))
        bad = first_mismatch(buf.mv, bseed, 0, bs * k)
        if bad is not None:
            raise Failure(f"batch read-back differs at offset {bad}")

        # 3. unaligned small transfer
        loff, poff = 7, 13
        ln = min(4099, n - max(loff, poff) - 1)
        useed = args.seed + 2
        buf.clear()
        fill_pattern(buf.mv, useed, 0, ln, buf_offset=loff)
        check_rc("transfer_sync_write (unaligned)", engine.transfer_sync_write(peer, buf.addr + loff, paddr + poff, ln))
        buf.clear()
        check_rc("transfer_sync_read (unaligned)", engine.transfer_sync_read(peer, buf.addr + loff + 1, paddr + poff, ln))
        bad = first_mismatch(buf.mv, useed, 0, ln, buf_offset=loff + 1)
        if bad is not None:
            raise Failure(f"unaligned read-back differs at offset {bad}")

        # 4. single write / read of the whole range with seed S (the final state)
        buf.clear()
        fill_pattern(buf.mv, args.seed, 0, n)
        check_rc("transfer_sync_write", timed("write", engine.transfer_sync_write, peer, buf.addr, paddr, n))
        buf.clear()
        check_rc("transfer_sync_read", timed("read", engine.transfer_sync_read, peer, buf.addr, paddr, n))
        bad = first_mismatch(buf.mv, args.seed, 0, n)
        if bad is not None:
            raise Failure(f"read-back differs from pattern({args.seed}) at offset {bad}")
        result["final_peer_sha256"] = sha256_of(buf.mv, 0, n)

        if args.check_reject:
            rej = {}
            # Past the end of the peer's registered buffer (the bytes at paddr+n are not registered).
            tail = 64
            for name, fn in (("write_past_end", engine.transfer_sync_write), ("read_past_end", engine.transfer_sync_read)):
                t0 = time.perf_counter()
                rc = fn(peer, buf.addr, paddr + n - tail // 2, tail)
                rej[name] = {"rc": rc, "seconds": round(time.perf_counter() - t0, 6)}
                if rc == 0:
                    raise Failure(f"{name}: out-of-bounds transfer returned 0")
            t0 = time.perf_counter()
            rc = engine.transfer_sync_write(f"{args.host}:1", buf.addr, paddr, tail)
            rej["write_unknown_peer"] = {"rc": rc, "seconds": round(time.perf_counter() - t0, 6)}
            if rc == 0:
                raise Failure("write to an unknown peer returned 0")
            # The peer must still be usable after the rejections, and its data unchanged.
            buf.clear()
            check_rc("transfer_sync_read (after rejects)", engine.transfer_sync_read(peer, buf.addr, paddr, n))
            bad = first_mismatch(buf.mv, args.seed, 0, n)
            if bad is not None:
                raise Failure(f"after rejected transfers the peer data differs at offset {bad}")
            result["reject"] = rej

        result["ok"] = True
        result["blocks"] = k
        result["block_size"] = bs
        result["seconds"] = timings
        emit(result)
        return 0
    except Failure as e:
        result["error"] = str(e)
        result["seconds"] = timings
        emit(result)
        log(f"FAILED: {e}")
        return 1


# ---------------------------------------------------------------------------------------
# Probe and notify
# ---------------------------------------------------------------------------------------
def run_notify(args) -> int:
    from mooncake.engine import TransferNotify, TransferOpcode

    engine, session_id = make_engine(args)
    n, peer, paddr = args.size, args.peer, args.peer_buffer
    result = {"mode": "notify", "ok": False, "session_id": session_id, "peer": peer}
    try:
        result["probe_rc"] = engine.send_probe(peer)
        check_rc("send_probe", result["probe_rc"])
        result["probe_unknown_rc"] = engine.send_probe(f"{args.host}:1")
        if result["probe_unknown_rc"] == 0:
            raise Failure("send_probe to an unknown peer returned 0")
        # Opens the segment (fetches the peer's descriptor) as a side effect.
        result["first_buffer_address"] = engine.get_first_buffer_address(peer)
        if result["first_buffer_address"] != paddr:
            raise Failure(f"get_first_buffer_address = {result['first_buffer_address']:#x}, expected {paddr:#x}")
        buf = Buffer(n)
        register(engine, buf)
        fill_pattern(buf.mv, args.seed, 0, n)
        note = TransferNotify(args.name, args.msg)
        result["write_rc"] = engine.transfer_sync(peer, buf.addr, paddr, n, TransferOpcode.Write, note)
        check_rc("transfer_sync(WRITE, notify)", result["write_rc"])
        result["ok"] = True
        emit(result)
        return 0
    except Failure as e:
        result["error"] = str(e)
        emit(result)
        log(f"FAILED: {e}")
        return 1


# ---------------------------------------------------------------------------------------
# Bench initiator
# ---------------------------------------------------------------------------------------
def run_bench_initiator(args) -> int:
    engine, session_id = make_engine(args)
    op = args.op
    peer, paddr, psize = args.peer, args.peer_buffer, args.peer_size
    base = {"mode": "bench-initiator", "session_id": session_id, "peer": peer, "op": op, "threads": args.threads}
    peers = [p.strip() for p in peer.split(",")]
    paddrs = [parse_int(a) for a in str(paddr).split(",")]
    if len(paddrs) != len(peers) or not all(peers):
        raise Failure(f"--peer lists {len(peers)} targets and --peer-buffer {len(paddrs)} addresses")
    # Latency mode: the first target.
    peer, paddr = peers[0], paddrs[0]

    if args.latency:
        bsz = args.block_size or 4096
        if bsz > psize:
            raise Failure(f"--block-size {bsz} > --peer-size {psize}")
        buf = Buffer(max(bsz, 4096))
        register(engine, buf)
        fn = engine.transfer_sync_write if op == "write" else engine.transfer_sync_read
        for _ in range(args.warmup):
            check_rc(f"transfer_sync_{op} (warmup)", fn(peer, buf.addr, paddr, bsz))
        samples = []
        deadline = time.perf_counter() + args.duration
        t_start = time.perf_counter()
        pc = time.perf_counter_ns
        while True:
            t0 = pc()
            rc = fn(peer, buf.addr, paddr, bsz)
            t1 = pc()
            if rc != 0:
                raise Failure(f"transfer_sync_{op} returned {rc} after {len(samples)} transfers")
            samples.append(t1 - t0)
            if t1 * 1e-9 >= deadline or (args.iterations and len(samples) >= args.iterations):
                break
        elapsed = time.perf_counter() - t_start
        samples.sort()

        def pct(p):
            return round(samples[min(len(samples) - 1, int(p / 100.0 * len(samples)))] / 1000.0, 2)

        emit({**base, "ok": True, "latency": True, "block_size": bsz, "count": len(samples),
              "seconds": round(elapsed, 3), "ops_per_s": round(len(samples) / elapsed, 1),
              "p50_us": pct(50), "p90_us": pct(90), "p99_us": pct(99),
              "min_us": round(samples[0] / 1000.0, 2), "max_us": round(samples[-1] / 1000.0, 2),
              "mean_us": round(sum(samples) / len(samples) / 1000.0, 2)})
        return 0

    bsz = args.block_size or 65536
    kk, tt = args.batch_size, args.threads
    if bsz > psize:
        raise Failure(f"--block-size {bsz} > --peer-size {psize}")
    slots = psize // bsz  # peer block slots
    need = tt * kk
    local_slots = min(need, slots)
    buf = Buffer(local_slots * bsz)
    buf.clear(0x5A)
    register(engine, buf)
    fn = engine.batch_transfer_sync_write if op == "write" else engine.batch_transfer_sync_read

    per_thread = [dict(batches=0, error=None, lat=[]) for _ in range(tt)]
    stop = threading.Event()
    start_barrier = threading.Barrier(tt + 1)

    def worker(t: int):
        idx = [(t * kk + j) for j in range(kk)]
        locs = [buf.addr + (i % local_slots) * bsz for i in idx]
        remotes = [[pa + (i % slots) * bsz for i in idx] for pa in paddrs]
        lens = [bsz] * kk
        st = per_thread[t]
        lat = st["lat"]
        pc = time.perf_counter_ns
        start_barrier.wait()
        while not stop.is_set():
            k = (t + st["batches"]) % len(peers)
            t0 = pc()
            rc = fn(peers[k], locs, remotes[k], lens)
            lat.append(pc() - t0)
            if rc != 0:
                st["error"] = f"batch_transfer_sync_{op} returned {rc} (thread {t}, after {st['batches']} batches)"
                stop.set()
                return
            st["batches"] += 1

    # One warm-up batch per target (opens the segment, fetches the descriptor) outside the
    # timed window.
    for p, pa in zip(peers, paddrs):
        check_rc(f"batch_transfer_sync_{op} to {p} (warmup)", fn(p, [buf.addr], [pa], [bsz]))
    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(tt)]
    for th in threads:
        th.start()
    start_barrier.wait()
    t0 = time.perf_counter()
    stop.wait(args.duration)
    stop.set()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t0
    batches = sum(s["batches"] for s in per_thread)
    errors = [s["error"] for s in per_thread if s["error"]]
    reqs = batches * kk
    nbytes = reqs * bsz
    lat = sorted(x for s in per_thread for x in s["lat"])

    def bpct(p):
        return round(lat[min(len(lat) - 1, int(p / 100.0 * len(lat)))] / 1000.0, 1) if lat else None

    out = {**base, "ok": not errors, "latency": False, "block_size": bsz, "batch_size": kk,
           "targets": len(peers), "seconds": round(elapsed, 3), "batches": batches,
           "requests": reqs, "bytes": nbytes, "gbps": round(nbytes / 1e9 / elapsed, 3),
           "req_per_s": round(reqs / elapsed, 1), "batch_p50_us": bpct(50), "batch_p99_us": bpct(99)}
    if errors:
        out["error"] = "; ".join(errors)
        emit(out)
        log(f"FAILED: {out['error']}")
        return 1
    emit(out)
    return 0


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------
def parse_int(s: str) -> int:
    """Integers with optional 0x prefix or K/M/G suffix (powers of 1024)."""
    s = s.strip()
    mult = 1
    suffixes = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    if s and s[-1].lower() in suffixes:
        mult = suffixes[s[-1].lower()]
        s = s[:-1]
    return int(s, 0) * mult


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--host", default="127.0.0.1", help="local hostname for initialize() (default 127.0.0.1)")
    common.add_argument("--metadata", default="P2PHANDSHAKE", help="metadata server (default P2PHANDSHAKE)")
    common.add_argument("--protocol", default="tcp")
    common.add_argument("--device", default="")
    sub = p.add_subparsers(dest="mode", required=True)

    t = sub.add_parser("target", parents=[common], help="serve a pattern-filled buffer")
    t.add_argument("--size", type=parse_int, required=True)
    t.add_argument("--pattern-seed", type=parse_int, default=0)
    t.add_argument("--wait", choices=["stdin", "signal"], default="stdin")

    bt = sub.add_parser("bench-target", parents=[common], help="serve a buffer for benchmarks")
    bt.add_argument("--size", type=parse_int, default=1 << 30)
    bt.add_argument("--wait", choices=["stdin", "signal"], default="stdin")

    i = sub.add_parser("initiator", parents=[common], help="write/read/verify against a target")
    i.add_argument("--peer", required=True, help="target session id HOST:RPC_PORT")
    i.add_argument("--peer-buffer", type=parse_int, required=True)
    i.add_argument("--size", type=parse_int, required=True)
    i.add_argument("--seed", type=parse_int, default=1)
    i.add_argument("--blocks", type=int, default=8)
    i.add_argument("--expect-peer-seed", type=parse_int, default=None)
    i.add_argument("--check-reject", action="store_true")

    nt = sub.add_parser("notify", parents=[common], help="probe a target, write with a notification")
    nt.add_argument("--peer", required=True, help="target session id HOST:RPC_PORT")
    nt.add_argument("--peer-buffer", type=parse_int, required=True)
    nt.add_argument("--size", type=parse_int, default=4096)
    nt.add_argument("--seed", type=parse_int, default=1)
    nt.add_argument("--name", required=True)
    nt.add_argument("--msg", required=True)

    b = sub.add_parser("bench-initiator", parents=[common], help="throughput / latency benchmark")
    b.add_argument("--peer", required=True, help="HOST:PORT, or several comma-separated")
    b.add_argument("--peer-buffer", required=True, help="ADDR, or one per --peer, comma-separated")
    b.add_argument("--peer-size", type=parse_int, required=True)
    b.add_argument("--block-size", type=parse_int, default=None, help="default 65536 (4096 with --latency)")
    b.add_argument("--batch-size", type=int, default=64)
    b.add_argument("--duration", type=float, default=5.0)
    b.add_argument("--op", choices=["read", "write"], default="write")
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--latency", action="store_true")
    b.add_argument("--warmup", type=int, default=100)
    b.add_argument("--iterations", type=int, default=0, help="latency: stop after this many (0 = by duration)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.mode in ("target", "bench-target"):
            return run_target(args)
        if args.mode == "initiator":
            return run_initiator(args)
        if args.mode == "notify":
            return run_notify(args)
        return run_bench_initiator(args)
    except Failure as e:
        emit({"mode": args.mode, "ok": False, "error": str(e)})
        log(f"FAILED: {e}")
        return 1


if __name__ == "__main__":
    code = main()
    _OUT.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the engine's destructor and its threads are not ours to wait on.
    os._exit(code)
