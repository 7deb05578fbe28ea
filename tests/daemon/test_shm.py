"""The shared-memory data plane against a real daemon: pages bit-exact through the slab,
slots of a SIGKILLed client reclaimed, a live client's never, off by default, ipc only.

Daemons listen on ipc:// in the test's directory with a 0.2 s heartbeat, so a lease is
reclaimed 0.6 s after its client went silent; every wait polls STATS with a bound.
"""

from __future__ import annotations

import dataclasses
import hashlib
import select
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from hicache.config.daemon import AuthConfig, DaemonConfig, ServerConfig, TenantConfig
from hicache.daemon.store import DaemonStore, Lookup
from storage_backends import StorageConfig, create
from storage_backends.remote.client import RemoteBackend
from storage_backends.remote.protocol import (
    GetReply,
    Op,
    Request,
    ShmAttachReply,
    StatsReply,
    decode_reply,
    encode_request,
)
from tests.daemon.conftest import Client, Daemon, StartDaemon, in_process_daemon
from tests.polling import wait_until

HEARTBEAT_S = 0.2
RECLAIM_S = 3 * HEARTBEAT_S
BOUND_S = 20.0  # how long a wait for a reclaim may take before the test fails
SLAB = 16 << 20  # a lease's put area, and its share of GET slots: a quarter (4 MiB)
LEASES = "hicache_daemon_shm_leases"
LENT = "hicache_daemon_shm_lent_bytes"


def shm_toml(workdir: Path, shm_bytes: int = SLAB) -> str:
    return f"""
[server]
endpoint = "ipc://{workdir}/daemon.sock"
ready_file = "ready.json"
shm_bytes = {shm_bytes}
heartbeat_s = {HEARTBEAT_S}
[store]
path = "{workdir}/store"
max_bytes = {256 << 20}
memory_bytes = {4 << 20}
sync = "none"
"""


def key(i: int) -> bytes:
    return hashlib.sha256(f"shm-{i}".encode()).digest()


def payload(i: int, size: int) -> bytes:
    seed = hashlib.sha256(f"payload-{i}-{size}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def remote(endpoint: str, shm: bool = True) -> RemoteBackend:
    config = StorageConfig(backend="remote", endpoint=endpoint, timeout_s=5.0, shm=shm)
    backend = create("remote", config)
    assert isinstance(backend, RemoteBackend)
    return backend


def read_back(backend: RemoteBackend, sizes: dict[int, int]) -> list[bytes | None]:
    dst = [memoryview(bytearray(size)) for size in sizes.values()]
    hits = backend.get([key(i) for i in sizes], dst)
    return [bytes(d) if hit else None for d, hit in zip(dst, hits, strict=True)]


def stats(daemon: Daemon, client: Client) -> Callable[[str], float]:
    return lambda name: daemon.stat(client, name)


@pytest.fixture
def shm_daemon(start_daemon: StartDaemon, tmp_path: Path) -> Iterator[Daemon]:
    daemon = start_daemon(shm_toml(tmp_path))
    yield daemon
    if daemon.alive():
        assert daemon.terminate() == 0  # SIGTERM: the slab is removed with it


def test_pages_go_through_the_slab_bit_exact(shm_daemon: Daemon, connect) -> None:
    stat = stats(shm_daemon, connect(shm_daemon.endpoint))
    backend = remote(shm_daemon.endpoint)
    sizes = {i: (3000, 64 << 10, 300 << 10)[i % 3] for i in range(60)}  # ~7 MiB
    total = sum(sizes.values())
    keys, pages = [key(i) for i in sizes], [memoryview(payload(i, s)) for i, s in sizes.items()]
    try:
        # Batches reuse the put area the last one was written to (the first two both fit
        # the memory tier, which must hold copies, not views of the area).
        for batch in (slice(0, 6), slice(6, 12)):
            assert backend.put(keys[batch], pages[batch]) == [True] * 6
        first = {i: sizes[i] for i in range(6)}
        assert read_back(backend, first) == [bytes(pages[i]) for i in range(6)]
        for batch in (slice(12, 36), slice(36, 60)):
            assert backend.put(keys[batch], pages[batch]) == [True] * 24
        put_area = stat(LENT)
        assert stat(LEASES) == 1 and 0 < put_area <= SLAB // 4
        for half in (range(30), range(30, 60)):  # each within the lease's share of slots
            part = {i: sizes[i] for i in half}
            assert read_back(backend, part) == [bytes(pages[i]) for i in half]
        runs = [memoryview(bytearray(1000)), memoryview(bytearray((64 << 10) - 1000))]
        assert backend.get_scatter([key(1)], [runs]) == [True]
        assert b"".join(runs) == payload(1, 64 << 10)
        two = [memoryview(bytearray(64 << 10)) for _ in range(2)]
        assert backend.get([key(1), key(999)], two) == [True, False]
        # The pages crossed the slab, not the socket; every GET slot was given back.
        assert stat("hicache_daemon_received_bytes_total") < total / 20
        assert stat("hicache_daemon_sent_bytes_total") < total / 20
        assert stat(LENT) == put_area
    finally:
        backend.close()
    assert wait_until(lambda: stat(LEASES) == 0 and stat(LENT) == 0, BOUND_S)  # detached


def test_what_the_slab_cannot_hold_goes_as_frames(shm_daemon: Daemon, connect) -> None:
    stat = stats(shm_daemon, connect(shm_daemon.endpoint))
    backend = remote(shm_daemon.endpoint)
    big = {0: 5 << 20}  # over the put area and over a lease's share of GET slots
    try:
        assert backend.put([key(0)], [memoryview(payload(0, big[0]))]) == [True]
        assert read_back(backend, big) == [payload(0, big[0])]
        assert stat("hicache_daemon_received_bytes_total") > big[0]
        assert stat("hicache_daemon_sent_bytes_total") > big[0]
    finally:
        backend.close()


def test_a_put_bigger_than_the_put_area_goes_through_it_in_rounds(shm_daemon, connect) -> None:
    stat = stats(shm_daemon, connect(shm_daemon.endpoint))
    backend = remote(shm_daemon.endpoint)
    sizes = {i: 1 << 20 for i in range(10)}  # 10 MiB through a 4 MiB put area
    expected = [payload(i, s) for i, s in sizes.items()]
    try:
        assert (
            backend.put([key(i) for i in sizes], [memoryview(e) for e in expected]) == [True] * 10
        )
        assert stat("hicache_daemon_received_bytes_total") < (1 << 20) / 10
        for half in (range(5), range(5, 10)):
            assert read_back(backend, {i: sizes[i] for i in half}) == [expected[i] for i in half]
    finally:
        backend.close()


HOLDER = """
import sys
import zmq
from storage_backends.remote.protocol import Op, Request, decode_reply, encode_request

sock = zmq.Context().socket(zmq.DEALER)
sock.connect(sys.argv[1])


def call(request):
    sock.send_multipart(encode_request(request))
    return decode_reply(sock.recv_multipart(), request.op)


grant = call(Request(Op.SHM_ATTACH, 1, put_bytes=1 << 20))
reply = call(Request(Op.GET, 2, (bytes.fromhex(sys.argv[2]),), lease=grant.lease))
print("holding", len(reply.spans), flush=True)  # and never frees them
sys.stdin.read()
"""


def test_the_slots_of_a_sigkilled_client_are_reclaimed(
    shm_daemon: Daemon, connect, tmp_path
) -> None:
    stat = stats(shm_daemon, connect(shm_daemon.endpoint))
    writer = remote(shm_daemon.endpoint, shm=False)
    assert writer.put([key(0)], [memoryview(payload(0, 100 << 10))]) == [True]
    writer.close()
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    holder = subprocess.Popen(
        [sys.executable, str(script), shm_daemon.endpoint, key(0).hex()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        ready, _, _ = select.select([holder.stdout], [], [], BOUND_S)
        assert ready and holder.stdout.readline().strip() == "holding 1"
        assert stat(LEASES) == 1 and stat(LENT) >= (1 << 20) + (100 << 10)
        holder.kill()  # SIGKILL: no detach, no free
        holder.wait(BOUND_S)
        assert wait_until(lambda: stat(LEASES) == 0 and stat(LENT) == 0, BOUND_S)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(BOUND_S)


def test_a_client_silent_past_the_window_or_a_restarted_daemon_is_no_harm(
    start_daemon: StartDaemon, tmp_path: Path, connect
) -> None:
    daemon = start_daemon(shm_toml(tmp_path))
    stat = stats(daemon, connect(daemon.endpoint))
    backend = remote(daemon.endpoint)
    sizes = {i: 64 << 10 for i in range(8)}
    expected = [payload(i, s) for i, s in sizes.items()]
    try:
        assert backend.put([key(i) for i in sizes], [memoryview(e) for e in expected]) == [True] * 8
        assert wait_until(lambda: stat(LEASES) == 0, BOUND_S)  # reclaimed while idle
        assert read_back(backend, sizes) == expected  # attached again, through the slab
        assert stat(LEASES) == 1
        daemon.kill9()  # a new daemon, a new slab: the client's lease means nothing there
        daemon = start_daemon(shm_toml(tmp_path))
        got = read_back(backend, sizes)
        assert all(page is None or page == e for page, e in zip(got, expected, strict=True))
        assert wait_until(lambda: read_back(backend, sizes) == expected, BOUND_S)
        assert daemon.stat(connect(daemon.endpoint), LEASES) == 1
    finally:
        backend.close()
        daemon.terminate()  # SIGTERM: the slab is removed with it


def test_shared_memory_is_off_by_default_and_ipc_only(tmp_path: Path) -> None:
    assert DaemonConfig().server.shm_bytes == 0 and not StorageConfig().shm
    with pytest.raises(ValueError, match="ipc://"):
        StorageConfig(backend="remote", endpoint="tcp://127.0.0.1:5557", shm=True)
    with pytest.raises(ValueError, match="ipc://"):
        ServerConfig(endpoint="tcp://127.0.0.1:5557", shm_bytes=SLAB)
    with pytest.raises(ValueError, match="heartbeat_s"):
        ServerConfig(endpoint="ipc:///tmp/x.sock", shm_bytes=SLAB, heartbeat_s=0)
    server = ServerConfig(endpoint="ipc:///tmp/x.sock", shm_bytes=SLAB)
    tenants = (TenantConfig("a", "k" * 40),)
    with pytest.raises(ValueError, match="curve"):  # every client maps the whole slab
        DaemonConfig(server=server, auth=AuthConfig(True, "server.key_secret", tenants))


def test_a_shm_client_of_a_daemon_without_it_uses_frames(
    start_daemon: StartDaemon, tmp_path: Path, connect
) -> None:
    daemon = start_daemon(shm_toml(tmp_path, shm_bytes=0))
    stat = stats(daemon, connect(daemon.endpoint))
    backend = remote(daemon.endpoint)
    sizes = {i: 64 << 10 for i in range(4)}
    expected = [payload(i, s) for i, s in sizes.items()]
    try:
        assert backend.put([key(i) for i in sizes], [memoryview(e) for e in expected]) == [True] * 4
        assert read_back(backend, sizes) == expected
        assert read_back(backend, sizes) == expected
        assert stat('hicache_daemon_errors_total{code="BAD_OP"}') == 1  # asked once, then frames
        assert stat("hicache_daemon_sent_bytes_total") > 2 * sum(sizes.values())
    finally:
        backend.close()


def _call(client: Client, request: Request) -> object:
    frames = client.raw(encode_request(request))
    assert frames is not None, f"no reply to {request.op}"
    return decode_reply(frames, request.op)


def test_a_live_client_keeps_its_slots_and_lease(shm_daemon: Daemon, connect) -> None:
    stat = stats(shm_daemon, connect(shm_daemon.endpoint))
    writer = remote(shm_daemon.endpoint, shm=False)
    assert writer.put([key(0)], [memoryview(payload(0, 100 << 10))]) == [True]
    writer.close()
    client = connect(shm_daemon.endpoint)
    grant = _call(client, Request(Op.SHM_ATTACH, 1))
    assert isinstance(grant, ShmAttachReply) and grant.put.length == 0
    held = _call(client, Request(Op.GET, 2, (key(0),), lease=grant.lease))
    assert isinstance(held, GetReply) and len(held.spans) == 1
    lent = stat(LENT)
    # Busy for five reclaim windows: a GET every 50 ms, each freed; the first one held.
    deadline, rid = time.monotonic() + 5 * RECLAIM_S, 10
    while time.monotonic() < deadline:
        rid += 1
        reply = _call(client, Request(Op.GET, rid, (key(0),), lease=grant.lease))
        assert isinstance(reply, GetReply) and len(reply.spans) == 1, reply
        client.sock.send_multipart(
            encode_request(Request(Op.SHM_FREE, rid, lease=grant.lease, spans=reply.spans))
        )
        assert stat(LEASES) == 1
        threading.Event().wait(0.05)  # pace the loop: no state to wait for
    renewed = _call(client, Request(Op.SHM_ATTACH, rid + 1, lease=grant.lease))
    assert isinstance(renewed, ShmAttachReply) and renewed.lease == grant.lease
    assert stat(LENT) == lent  # the held slot is still lent, nothing more
    assert wait_until(lambda: stat(LEASES) == 0 and stat(LENT) == 0, BOUND_S)  # silent now


def test_a_client_whose_request_is_in_flight_keeps_its_slots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, connect
) -> None:
    gate, slow = threading.Event(), key(1)
    original: Callable[..., Lookup] = DaemonStore.get

    def get(
        self: DaemonStore, keys: Sequence[bytes], client_keys: Sequence[bytes], *args
    ) -> Lookup:  # type: ignore[no-untyped-def]
        if slow in client_keys:
            assert gate.wait(BOUND_S)
        return original(self, keys, client_keys, *args)

    monkeypatch.setattr(DaemonStore, "get", get)
    # Not answered from the memory tier on the socket thread: a reader holds it at the gate.
    monkeypatch.setattr(DaemonStore, "cached", lambda self, keys: None)
    config = DaemonConfig.from_mapping(tomllib.loads(shm_toml(tmp_path)))
    quiet = dataclasses.replace(config.server, ready_file="")
    with in_process_daemon(dataclasses.replace(config, server=quiet)) as served:
        client, other = connect(served.endpoint), connect(served.endpoint)
        try:
            _hold_in_flight(client, other, served.endpoint, slow)
        finally:
            gate.set()
        frames = client.recv()
        assert frames is not None
        late = decode_reply(frames, Op.GET)
        assert isinstance(late, GetReply) and len(late.spans) == 1  # answered through the slab
        assert wait_until(lambda: _stat(other, LEASES) == 0 and _stat(other, LENT) == 0, BOUND_S)


def _stat(client: Client, name: str) -> float:
    reply = _call(client, Request(Op.STATS, 1))
    assert isinstance(reply, StatsReply)
    return reply.stats[name]


def _hold_in_flight(client: Client, other: Client, endpoint: str, slow: bytes) -> None:
    """``client`` holds a slot and has a GET of ``slow`` (held at the gate) in flight for
    five reclaim windows, sending nothing else; ``other`` watches it keep everything."""
    writer = remote(endpoint, shm=False)
    assert writer.put([key(0), slow], [memoryview(payload(0, 100 << 10))] * 2) == [True] * 2
    writer.close()
    grant = _call(client, Request(Op.SHM_ATTACH, 1))
    assert isinstance(grant, ShmAttachReply)
    held = _call(client, Request(Op.GET, 2, (key(0),), lease=grant.lease))
    assert isinstance(held, GetReply) and len(held.spans) == 1
    lent = _stat(other, LENT)
    client.sock.send_multipart(encode_request(Request(Op.GET, 3, (slow,), lease=grant.lease)))
    deadline = time.monotonic() + 5 * RECLAIM_S
    while time.monotonic() < deadline:
        assert _stat(other, LEASES) == 1 and _stat(other, LENT) == lent
        threading.Event().wait(0.05)  # pace the loop: no state to wait for
