"""``TransferEngine.get_metrics()`` after real transfers between two engines of this process,
and the Prometheus endpoint that ``MC_METRICS_PORT`` opens."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest

from helpers import Buffer, initialized_engine
from mooncake.engine import TransferEngine

SIZE = 1 << 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_get_metrics_counts_transfers_per_transport_and_peer(monkeypatch):
    port = free_port()
    monkeypatch.setenv("MC_METRICS_PORT", str(port))
    initiator, _ = initialized_engine()
    monkeypatch.delenv("MC_METRICS_PORT")
    target, target_name = initialized_engine()
    remote = Buffer(SIZE)
    assert target.register_memory(remote.addr, SIZE) == 0
    local = Buffer(SIZE, fill=b"\x07" * SIZE)
    assert initiator.register_memory(local.addr, SIZE) == 0

    assert initiator.transfer_sync_write(target_name, local.addr, remote.addr, 4096) == 0
    assert initiator.transfer_sync_read(target_name, local.addr, remote.addr, 1024) == 0
    # Outside the target's buffer: rejected, and counted as such.
    assert initiator.transfer_sync_write(target_name, local.addr, remote.addr + (1 << 40), 16) < 0

    m = initiator.get_metrics()
    assert set(m) == {"transports", "peers", "peer_cap"}
    assert m["peer_cap"] == 1024
    tcp = m["transports"]["tcp"]
    assert tcp["bytes_written"] == 4096
    assert tcp["bytes_read"] == 1024
    assert tcp["requests"] == 3
    assert tcp["failures"]["address_rejected"] == 1
    assert sum(tcp["failures"].values()) == 1
    assert tcp["connects"] >= 1
    assert tcp["reconnects"] == 0 and tcp["retries"] == 0
    assert tcp["request_latency"]["count"] == 3
    assert tcp["request_latency"]["sum_seconds"] > 0
    assert tcp["batch_latency"]["count"] == 3
    peer = m["peers"][target_name]
    assert (peer["bytes_written"], peer["bytes_read"], peer["requests"]) == (4096, 1024, 3)
    assert target.get_metrics()["peers"] == {}
    # The target side: what the initiator moved, served by the target's TCP data server
    # (the rejected write served nothing). Counted just after the status is sent: poll.
    deadline = time.monotonic() + 5
    while True:
        served = target.get_metrics()["transports"]["tcp"]
        got = (served["served_bytes_written"], served["served_bytes_read"])
        if got == (4096, 1024) or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert got == (4096, 1024)
    assert (tcp["served_bytes_written"], tcp["served_bytes_read"]) == (0, 0)

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'mooncake_te_requests_total{transport="tcp"} 3' in text
    assert f'mooncake_te_peer_bytes_written_total{{peer="{target_name}"}} 4096' in text


def test_get_metrics_before_initialize_says_what_to_do():
    with pytest.raises(RuntimeError, match="initialize"):
        TransferEngine().get_metrics()
