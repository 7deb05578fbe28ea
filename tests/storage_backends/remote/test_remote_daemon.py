"""RemoteBackend against a real daemon process: round trips, outages, kill -9, restarts, CURVE.

The daemon runs as a subprocess on an OS-picked loopback port; it is ready
when it answers a PING and is stopped by PID.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hicache.bench.common.processes import ServerProcess, start_daemon
from storage_backends import StorageConfig, create
from storage_backends.base import ScatterGet
from storage_backends.remote.client import RemoteBackend
from storage_backends.remote.keys import keygen
from tests.polling import wait_until

DAEMON_CONFIG = Path(__file__).resolve().parents[3] / "configs" / "daemon.toml"
PAGE = 8192
RECOVERY_S = 30.0  # bound on waiting for the breaker to let a probe through again


def key(i: int) -> bytes:
    return hashlib.sha256(f"remote-{i}".encode()).digest()


def payload(i: int, size: int = PAGE) -> bytes:
    seed = hashlib.sha256(f"payload-{i}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def remote(endpoint: str, timeout_s: float = 5.0, **fields: str | int | float) -> RemoteBackend:
    config = StorageConfig(backend="remote", endpoint=endpoint, timeout_s=timeout_s)
    backend = create("remote", dataclasses.replace(config, **fields))  # type: ignore[arg-type]
    assert isinstance(backend, RemoteBackend)
    return backend


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start daemons over ``tmp_path/store``; every one still running is stopped at teardown."""
    started: list[ServerProcess] = []

    def start(endpoint: str = "tcp://127.0.0.1:0", config: Path = DAEMON_CONFIG) -> ServerProcess:
        log = tmp_path / "daemon.log"
        server = start_daemon(config, tmp_path / "store", endpoint, log)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def read_back(backend: RemoteBackend, ids: list[int]) -> list[bytes | None]:
    dst = [memoryview(bytearray(PAGE)) for _ in ids]
    hits = backend.get([key(i) for i in ids], dst)
    return [bytes(d) if hit else None for d, hit in zip(dst, hits, strict=True)]


def test_round_trip_and_batches_over_request_caps(daemons: Callable[..., ServerProcess]) -> None:
    backend = remote(daemons().endpoint)
    try:
        ids = list(range(300))  # 300 × 8 KiB: several requests in flight per call
        keys = [key(i) for i in ids]
        assert backend.put(keys, [memoryview(payload(i)) for i in ids]) == [True] * 300
        assert backend.exists(keys) == 300
        assert backend.exists([*keys[:5], key(10_000), *keys[5:]]) == 5
        absent = [key(10_000 + i) for i in range(1100)]  # over one request's keys: 2 requests
        gappy = [*keys[:5], *absent, *keys[5:]]
        assert backend.contains(gappy) == [True] * 5 + [False] * 1100 + [True] * 295
        assert read_back(backend, ids) == [payload(i) for i in ids]
        assert backend.delete(keys[:10]) == 10
        assert backend.exists(keys) == 0
        assert backend.contains(keys[9:12]) == [False, True, True]
        assert read_back(backend, [0, 11]) == [None, payload(11)]
        # A wrong-sized destination is a miss, never a partial copy.
        dst = [memoryview(bytearray(b"\x01" * (PAGE // 2)))]
        assert backend.get([key(11)], dst) == [False] and bytes(dst[0]) == b"\x01" * (PAGE // 2)
        stats = backend.stats()
        assert stats.hits == 300 + 1 and stats.misses == 2 and stats.puts == 300
        assert stats.entries == 290 and stats.deletes == 10
        assert stats.capacity_bytes == 8 << 30  # configs/daemon.toml's store.max_bytes
        assert set(backend.take_removed()) == set(keys[:10])
        assert backend.link_stats().timeouts == 0
    finally:
        backend.close()


def test_scatter_reads_land_in_their_runs(daemons: Callable[..., ServerProcess]) -> None:
    backend = remote(daemons().endpoint)
    try:
        assert isinstance(backend, ScatterGet)
        assert backend.put([key(i) for i in range(2)], [memoryview(payload(i)) for i in range(2)])
        runs = [
            [memoryview(bytearray(n)) for n in split] for split in ([100, PAGE - 100], [PAGE, 1])
        ]
        assert backend.get_scatter([key(0), key(1)], runs) == [True, False]  # 1: wrong total
        assert b"".join(bytes(r) for r in runs[0]) == payload(0)
        assert not any(bytes(runs[1][0]))
    finally:
        backend.close()


def test_daemon_down_then_back_breaker_opens_and_recovers(
    daemons: Callable[..., ServerProcess],
) -> None:
    daemon = daemons()
    # Two 0.3 s timeouts open the breaker; the calls after it fail fast, each in far less
    # than the 2 s cool-down, so a loaded machine cannot turn them into probes.
    backend = remote(daemon.endpoint, timeout_s=0.3, breaker_failures=2, breaker_cooldown_s=2.0)
    try:
        assert backend.put([key(1)], [memoryview(payload(1))]) == [True]
        daemon.stop()
        for _ in range(6):
            assert backend.exists([key(1)]) == 0
            assert read_back(backend, [1]) == [None]
            assert backend.put([key(2)], [memoryview(payload(2))]) == [False]
        link = backend.link_stats()
        assert link.breaker_opens == 1 and link.fast_fails > 0
        assert link.timeouts < 18  # most of the 18 calls failed fast, without a timeout
        daemons(daemon.endpoint)  # back, on the same address and store
        assert wait_until(lambda: backend.exists([key(1)]) == 1, RECOVERY_S)
        assert read_back(backend, [1]) == [payload(1)]
        assert backend.put([key(2)], [memoryview(payload(2))]) == [True]
        assert backend.link_stats().breaker_state == "closed"
    finally:
        backend.close()


def test_kill_9_mid_workload_then_every_acknowledged_page_survives(
    daemons: Callable[..., ServerProcess],
) -> None:
    daemon = daemons()
    backend = remote(daemon.endpoint, timeout_s=0.5, breaker_failures=3, breaker_cooldown_s=0.2)
    acked: list[int] = []
    failed = 0
    killed = threading.Event()
    lock = threading.Lock()

    def writer(worker: int) -> None:
        nonlocal failed
        for n in range(60):
            ids = [worker * 1000 + n * 4 + j for j in range(4)]
            ok = backend.put([key(i) for i in ids], [memoryview(payload(i)) for i in ids])
            read_back(backend, ids[:1])  # reads interleave with the writes
            with lock:
                acked.extend(i for i, stored in zip(ids, ok, strict=True) if stored)
                failed += ok.count(False)
            if worker == 0 and n == 20:
                daemon.kill()  # kill -9 while the other writers are mid-request
                killed.set()
            if killed.is_set() and n >= 40:
                return

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert killed.is_set() and acked and failed > 0
        daemons(daemon.endpoint)  # restart on the same store
        assert wait_until(lambda: backend.exists([key(acked[0])]) == 1, RECOVERY_S)
        got = read_back(backend, acked)
        assert got == [payload(i) for i in acked]  # every acknowledged page, bit-identical
    finally:
        backend.close()


def test_curve_keys_round_trip_and_an_unknown_key_gets_nothing(
    daemons: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    server, engine, stranger = (keygen(keys, name) for name in ("server", "engine", "stranger"))
    config = tmp_path / "daemon.toml"
    config.write_text(
        DAEMON_CONFIG.read_text().replace(
            "[auth]\ncurve = false",
            f'[auth]\ncurve = true\nserver_secret_key = "{server.secret}"\n'
            f'[[auth.tenants]]\nname = "engines"\npublic_key = "{engine.public}"',
        )
    )
    daemon = start_daemon(
        config,
        tmp_path / "store",
        log_path=tmp_path / "d.log",
        keys=(str(engine.secret), str(server.public)),
    )
    allowed = remote(
        daemon.endpoint, curve_client_key=str(engine.secret), curve_server_key=str(server.public)
    )
    denied = remote(
        daemon.endpoint,
        timeout_s=0.3,
        curve_client_key=str(stranger.secret),
        curve_server_key=str(server.public),
    )
    try:
        assert allowed.put([key(5)], [memoryview(payload(5))]) == [True]
        assert read_back(allowed, [5]) == [payload(5)]
        assert denied.exists([key(5)]) == 0
        assert allowed.contains([key(5), key(6)]) == [True, False]
        assert read_back(denied, [5]) == [None]
        assert denied.put([key(6)], [memoryview(payload(6))]) == [False]
        assert allowed.exists([key(6)]) == 0
        assert denied.link_stats().timeouts + denied.link_stats().fast_fails == 3
        assert denied.contains([key(5)]) == [False]  # another tenant's page is not seen
    finally:
        allowed.close()
        denied.close()
        daemon.stop()


def test_a_page_the_daemon_found_damaged_counts_in_stats_corrupt(
    daemons: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    daemon = daemons()
    backend = remote(daemon.endpoint)
    try:
        pages = [memoryview(payload(1)), memoryview(payload(2))]
        assert backend.put([key(1), key(2)], pages) == [True, True]
        daemon.stop()  # a clean stop: the pages are in the store, the memory tier is gone
        data = tmp_path / "store" / "data.mdb"
        raw = bytearray(data.read_bytes())
        at = raw.find(payload(1)[-64:])
        assert at > 0
        raw[at] ^= 0xFF
        data.write_bytes(bytes(raw))
        daemons(daemon.endpoint)
        assert wait_until(lambda: backend.exists([key(2)]) == 1, RECOVERY_S)
        assert read_back(backend, [1, 2]) == [None, payload(2)]
        stats = backend.stats()
        assert (stats.corrupt, stats.misses, stats.hits) == (1, 1, 1)  # the client saw no damage
    finally:
        backend.close()
