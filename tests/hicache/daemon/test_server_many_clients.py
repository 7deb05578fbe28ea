"""Many client processes against one daemon with tiny tiers: no reply carries a damaged
record, a poisoned buffer, or bytes nobody put under its key.

Half the clients are raw DEALER sockets speaking docs/protocol.md (pipelined),
half the ``remote`` backend; each is its own process (``load_clients``). The
daemon's memory tier (1 MiB) and store (8 MiB) are far smaller than what they
write, so both evict all the time and most GETs are read from the store into
the reply pool's buffers. The daemon runs with ``HICACHE_DAEMON_POISON=1``:
every reply buffer given back to the pool is filled with a poison pattern at
once, so a buffer given back while ZeroMQ still sends it shows in a reply.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hicache.config.daemon import STORE_BACKENDS

from .conftest import Daemon

ROOT = Path(__file__).resolve().parents[3]
RAW_CLIENTS = 4
REMOTE_CLIENTS = 3
HEARTBEAT_S = 0.2  # with shared memory: a lease silent for 0.6 s is reclaimed
PAUSE_S = 4 * HEARTBEAT_S
OPS = {"raw": 500, "remote": 250}
CLIENT_TIMEOUT_S = 120.0
# Must stay 0 in every client's tally (load_clients.Tally).
DAMAGE = ("bad_header", "poisoned", "wrong_bytes", "stale", "protocol", "corrupt_remote")


def _start_clients(endpoint: str, seed: str, shm: bool) -> list[subprocess.Popen[str]]:
    kinds = ["raw"] * RAW_CLIENTS + ["remote-shm" if shm else "remote"] * REMOTE_CLIENTS
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.hicache.daemon.load_clients",
                kind,
                str(index),
                endpoint,
                str(OPS[kind.removesuffix("-shm")]),
                seed,
                str(PAUSE_S),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index, kind in enumerate(kinds)
    ]


def _results(procs: list[subprocess.Popen[str]]) -> list[dict[str, object]]:
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=CLIENT_TIMEOUT_S)
            assert proc.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def _config(tmp_path: Path, setup: str) -> str:
    shm = setup == "shm"
    endpoint = f"ipc://{tmp_path}/daemon.sock" if shm else "tcp://127.0.0.1:0"
    backend = f'backend = "{setup}"' if setup in STORE_BACKENDS else ""
    return f"""
[server]
endpoint = "{endpoint}"
ready_file = "ready.json"
shm_bytes = {1 << 20 if shm else 0}
heartbeat_s = {HEARTBEAT_S if shm else 10.0}
[store]
{backend}
path = "{tmp_path / "store"}"
max_bytes = {8 << 20}
memory_bytes = {1 << 20}
"""


@pytest.mark.parametrize("setup", [*STORE_BACKENDS, "shm"])
def test_many_clients_get_only_what_was_put(
    start_daemon, connect, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setup: str
) -> None:
    monkeypatch.setenv("HICACHE_DAEMON_POISON", "1")
    daemon: Daemon = start_daemon(_config(tmp_path, setup))
    probe = connect(daemon.endpoint)
    daemon.wait_ping(probe)
    seed = os.environ.get("LOAD_SEED", "0")
    results = _results(_start_clients(daemon.endpoint, seed, setup == "shm"))
    assert daemon.alive(), daemon.log()
    stats = daemon.stat_map(probe)
    totals = {name: sum(int(r[name]) for r in results) for name in ("gets", "records", *DAMAGE)}
    details = [d for r in results for d in r["details"]]  # type: ignore[attr-defined]
    print(f"{setup}: {totals}, {max(float(r['seconds']) for r in results):.1f} s")
    assert all(totals[name] == 0 for name in DAMAGE), (totals, details)
    assert stats['hicache_daemon_errors_total{code="INTERNAL"}'] == 0
    assert stats["hicache_daemon_corrupt_pages_total"] == 0
    assert stats["hicache_daemon_reply_buffers_tampered"] == 0
    assert stats["hicache_daemon_sweep_failures_total"] == 0
    # The tiers were too small to hold what was written: both evicted, reads hit the store.
    assert stats['hicache_daemon_evictions_total{tier="memory"}'] > 0
    assert stats['hicache_daemon_evictions_total{tier="store"}'] > 0
    assert stats['hicache_daemon_lookups_total{result="hit",tier="store"}'] > 0
    assert totals["records"] > 1000
    if setup == "shm":  # GET replies went through the slab; leases were reclaimed and renewed
        assert stats['hicache_daemon_tenant_requests_total{op="SHM_FREE",tenant="default"}'] > 0
        assert stats['hicache_daemon_requests_total{op="SHM_ATTACH"}'] > REMOTE_CLIENTS
