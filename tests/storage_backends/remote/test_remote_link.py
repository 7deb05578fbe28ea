"""RemoteBackend when the daemon is silent or absent: bounded misses, the breaker, argument checks.

The peer here is a bare ROUTER socket that takes requests and never answers,
which is what a hung daemon looks like to the client. Tests against the real
daemon are in tests/hicache/daemon/.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from dataclasses import replace

import pytest
import zmq

from storage_backends import StorageClosedError, StorageConfig, StorageOpenError, create
from storage_backends.remote.client import REQUEST_BYTES, REQUEST_KEYS, RemoteBackend, chunks

PAGE = 4096


def key(i: int) -> bytes:
    return hashlib.sha256(f"k{i}".encode()).digest()


@pytest.fixture
def silent_router() -> Iterator[tuple[str, zmq.Socket[bytes]]]:
    """A ROUTER that receives but never replies; yields its endpoint."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    yield sock.getsockopt_string(zmq.LAST_ENDPOINT), sock
    sock.close()
    ctx.term()


def free_endpoint() -> str:
    """A loopback endpoint nobody listens on (bound once, then released)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind("tcp://127.0.0.1:*")
    endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    sock.close(linger=0)
    ctx.term()
    return endpoint


def remote(endpoint: str, failures: int = 2, cooldown: float = 30.0) -> RemoteBackend:
    config = StorageConfig(
        backend="remote",
        endpoint=endpoint,
        timeout_s=0.2,
        breaker_failures=failures,
        breaker_cooldown_s=cooldown,
    )
    backend = create("remote", config)
    assert isinstance(backend, RemoteBackend)
    return backend


def received(sock: zmq.Socket[bytes]) -> int:
    """Messages the silent ROUTER has taken so far."""
    n = 0
    while sock.poll(200, zmq.POLLIN):
        sock.recv_multipart()
        n += 1
    return n


def test_silent_daemon_gives_misses_and_failed_puts(
    silent_router: tuple[str, zmq.Socket[bytes]],
) -> None:
    endpoint, sock = silent_router
    backend = remote(endpoint)
    try:
        dst = [memoryview(bytearray(b"\x07" * PAGE)) for _ in range(3)]
        keys = [key(i) for i in range(3)]
        assert backend.exists(keys) == 0
        assert backend.get(keys, dst) == [False] * 3
        assert all(bytes(d) == b"\x07" * PAGE for d in dst)  # untouched on a miss
        assert backend.put(keys, [memoryview(b"x" * PAGE)] * 3) == [False] * 3
        assert received(sock) == 1  # the first request reached the peer; it opened the breaker
        stats, link = backend.stats(), backend.link_stats()
        assert (stats.hits, stats.misses, stats.puts, stats.put_failures) == (0, 3, 0, 3)
        assert link.timeouts == 1 and link.fast_fails == 3  # get, put, stats failed fast
        assert stats.errors == 4  # each unanswered or refused request counts as a failed call
        assert link.reconnects == 1  # a timed-out socket is replaced
    finally:
        backend.close()


def test_one_unanswered_call_opens_the_breaker(
    silent_router: tuple[str, zmq.Socket[bytes]],
) -> None:
    endpoint, sock = silent_router
    backend = remote(endpoint, failures=3)  # error replies in a row; a timeout needs one
    try:
        keys = [key(0)]
        assert backend.exists(keys) == 0
        assert backend.link_stats().breaker_state == "open"
        for _ in range(20):
            assert backend.exists(keys) == 0
            assert backend.get(keys, [memoryview(bytearray(PAGE))]) == [False]
        link = backend.link_stats()
        assert link.timeouts == 1 and link.fast_fails == 40 and link.breaker_opens == 1
        assert received(sock) == 1  # nothing was sent while open
        assert backend.stats().misses == 20
    finally:
        backend.close()


def test_breaker_probes_again_after_cooldown(free_port_endpoint: str) -> None:
    backend = remote(free_port_endpoint, failures=1, cooldown=0.05)
    try:
        assert backend.exists([key(0)]) == 0
        assert backend.link_stats().breaker_state == "open"
        probes = 0
        for _ in range(400):  # bounded: each turn is a fast fail or a 0.2 s probe
            assert backend.exists([key(0)]) == 0
            probes = backend.link_stats().timeouts - 1
            if probes >= 2:
                break
            threading.Event().wait(0.01)
        assert probes >= 2  # each failed probe reopens; the breaker never closes
        assert backend.link_stats().breaker_opens == 1
    finally:
        backend.close()


@pytest.fixture
def free_port_endpoint() -> str:
    return free_endpoint()


def test_absent_daemon_many_threads(free_port_endpoint: str) -> None:
    # No probe within the test, however slow the machine: the breaker stays open.
    backend = remote(free_port_endpoint, failures=3, cooldown=3600.0)
    results: list[int] = []

    def worker() -> None:
        for _ in range(10):
            results.append(backend.exists([key(1), key(2)]))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert results == [0] * 80
        link = backend.link_stats()
        assert link.timeouts + link.fast_fails == 80
        # Only calls that started before the breaker opened waited, whatever the
        # scheduling: at most one call in flight per thread.
        assert link.timeouts <= 8 and link.breaker_opens == 1
    finally:
        backend.close()


def test_unresolvable_daemon_host_gives_misses() -> None:
    backend = remote("tcp://nohost.invalid:5557", failures=1)
    try:
        assert backend.exists([key(0)]) == 0
        assert backend.get([key(0)], [memoryview(bytearray(PAGE))]) == [False]
        assert backend.put([key(0)], [memoryview(bytes(PAGE))]) == [False]
        link = backend.link_stats()
        assert (link.timeouts, link.fast_fails) == (1, 2)
    finally:
        backend.close()


def test_checks_arguments_and_closed(silent_router: tuple[str, zmq.Socket[bytes]]) -> None:
    backend = remote(silent_router[0])
    with pytest.raises(ValueError, match="32-byte"):
        backend.exists([b"short"])
    with pytest.raises(ValueError, match="keys but"):
        backend.get([key(0)], [])
    with pytest.raises(ValueError, match="writable"):
        backend.get([key(0)], [memoryview(b"ro" * 10)])
    assert received(silent_router[1]) == 0  # rejected at the door
    backend.close()
    backend.close()
    with pytest.raises(StorageClosedError):
        backend.exists([key(0)])


def test_chunks_respect_key_and_byte_caps() -> None:
    assert chunks([]) == []
    parts = chunks([0] * (2 * REQUEST_KEYS + 1))
    assert [(c.start, c.stop) for c in parts] == [
        (0, REQUEST_KEYS),
        (REQUEST_KEYS, 2 * REQUEST_KEYS),
        (2 * REQUEST_KEYS, 2 * REQUEST_KEYS + 1),
    ]
    big = REQUEST_BYTES // 2 + 1
    assert [(c.start, c.stop) for c in chunks([big, big, big])] == [(0, 1), (1, 2), (2, 3)]
    huge = [REQUEST_BYTES * 2]  # a page over the cap still travels alone
    assert [(c.start, c.stop) for c in chunks(huge)] == [(0, 1)]


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"endpoint": ""}, "endpoint"),
        ({"endpoint": "http://x"}, "endpoint"),
        ({"curve_client_key": "a"}, "together"),
        ({"breaker_failures": 0}, "breaker_failures"),
        ({"breaker_cooldown_s": 0.0}, "breaker_cooldown_s"),
    ],
)
def test_config_is_validated(fields: dict[str, str | int | float], match: str) -> None:
    base = StorageConfig(backend="remote", endpoint="tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match=match):
        replace(base, **fields)  # type: ignore[arg-type]


def test_unreadable_curve_keys_refuse_to_open(tmp_path: object) -> None:
    config = StorageConfig(
        backend="remote",
        endpoint="tcp://127.0.0.1:1",
        curve_client_key="/nonexistent/client.key_secret",
        curve_server_key="/nonexistent/server.key",
    )
    with pytest.raises(StorageOpenError, match="CURVE"):
        create("remote", config)
