"""Fixtures for the daemon tests: a daemon subprocess on an OS-picked port, raw DEALER clients.

Helpers are handed out through fixtures (not imported), like the storage tests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest
import zmq

from hicache.bench.common.processes import DAEMON_BANNER, ServerProcess
from hicache.config.daemon import STORE_BACKENDS, DaemonConfig
from hicache.daemon.record_store import OPENERS
from hicache.daemon.server import DaemonServer
from hicache.daemon.shm_plane import ShmPlane
from storage_backends import StorageConfig
from storage_backends.page_format import encode_page
from storage_backends.remote.protocol import (
    Frame,
    Op,
    PingReply,
    Reply,
    Request,
    StatsReply,
    decode_reply,
    encode_request,
)
from tests.hicache.daemon.shm_fake import EXPIRES_S, SIZE, Clock
from tests.polling import wait_until

_START_TIMEOUT_S = 30.0
REPLY_TIMEOUT_S = 10.0


def page_key(i: int, salt: str = "") -> bytes:
    return hashlib.sha256(f"{salt}page-{i}".encode()).digest()


def page_record(key: bytes, i: int, size: int = 256) -> bytes:
    """A page record whose payload depends on the key and ``i`` (so mix-ups are visible)."""
    payload = (key + i.to_bytes(8, "little")) * (size // 40 + 1)
    return encode_page(key, payload[:size])


def write_wrapped(
    path: Path,
    backend: str,
    keys: Sequence[bytes],
    records: Sequence[bytes],
    max_bytes: int = 16 << 20,
) -> list[bool]:
    """Store ``records`` under the scoped ``keys`` as daemons before session 10 did: each
    client record whole, as the payload of a page of the ``backend`` store at ``path``
    (``put``: wrapped in a second header). The store must not be open elsewhere."""
    config = StorageConfig(
        backend=backend, path=str(path), max_bytes=max_bytes, max_page_bytes=1 << 20
    )
    store = OPENERS[backend](config)
    try:
        return store.put(keys, [memoryview(record) for record in records])
    finally:
        store.close()


class Client:
    """A raw DEALER socket with a helper for one request at a time (or raw frames)."""

    def __init__(self, endpoint: str, curve: tuple[bytes, bytes, bytes] | None = None) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            self.sock.curve_serverkey, self.sock.curve_publickey, self.sock.curve_secretkey = curve
        self.sock.connect(endpoint)
        self._next_id = 0

    def raw(
        self, frames: Sequence[Frame], timeout_s: float = REPLY_TIMEOUT_S
    ) -> list[bytes] | None:
        """Send and wait for one reply; None if it cannot be sent or none comes in time (a
        DEALER whose handshake was refused has no peer to send to)."""
        if not self.sock.poll(int(timeout_s * 1000), zmq.POLLOUT):
            return None
        try:
            self.sock.send_multipart(list(frames), zmq.NOBLOCK)
        except zmq.Again:  # the peer went between the poll and the send (a refused handshake)
            return None
        return self.recv(timeout_s)

    def recv(self, timeout_s: float = REPLY_TIMEOUT_S) -> list[bytes] | None:
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        return self.sock.recv_multipart()

    def call(
        self,
        op: Op,
        keys: Sequence[bytes] = (),
        pages: Sequence[Frame] = (),
        timeout_s: float = REPLY_TIMEOUT_S,
    ) -> Reply | None:
        self._next_id += 1
        frames = encode_request(Request(op, self._next_id, tuple(keys), tuple(pages)))
        reply_frames = self.raw(frames, timeout_s)
        if reply_frames is None:
            return None
        reply = decode_reply(reply_frames, op)
        assert reply.id == self._next_id
        return reply

    def put(self, keys: Sequence[bytes], pages: Sequence[Frame]) -> tuple[bool, ...]:
        reply = self.call(Op.PUT, keys, pages)
        assert reply is not None and hasattr(reply, "stored"), reply
        return reply.stored  # type: ignore[union-attr]

    def get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        reply = self.call(Op.GET, keys)
        assert reply is not None and hasattr(reply, "found"), reply
        pages = iter(reply.pages)  # type: ignore[union-attr]
        return [bytes(next(pages)) if hit else None for hit in reply.found]  # type: ignore[union-attr]

    def close(self) -> None:
        self.sock.close(linger=0)


class Daemon:
    """A ``python -m hicache.daemon serve`` subprocess, started as the benches
    start one (``hicache.bench.common.processes.ServerProcess``: bound once it logs
    its endpoint, which it does after writing its ready file); stopped by PID."""

    def __init__(self, workdir: Path, config: str, log_name: str = "daemon.log") -> None:
        self.workdir = workdir
        self.config_path = workdir / "daemon.toml"
        self.config_path.write_text(config)
        self.ready_file = workdir / "ready.json"
        self.ready_file.unlink(missing_ok=True)
        self.log_path = workdir / log_name
        argv = [sys.executable, "-m", "hicache.daemon", "serve", "--config", str(self.config_path)]
        self.server = ServerProcess(argv, DAEMON_BANNER, self.log_path, cwd=workdir)
        self.proc = self.server.proc
        info = json.loads(self.ready_file.read_text())
        self.endpoint: str = info["endpoint"]
        self.metrics_port: int | None = info["metrics_port"]
        assert info["pid"] == self.proc.pid and self.endpoint == self.server.endpoint

    def wait_ping(self, client: Client) -> None:
        """Readiness: a PING reply."""
        reply = client.call(Op.PING, timeout_s=_START_TIMEOUT_S)
        assert isinstance(reply, PingReply), reply

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_log(self, text: str, timeout_s: float = REPLY_TIMEOUT_S) -> bool:
        """Whether ``text`` appears anywhere in the daemon's log within ``timeout_s``."""
        return wait_until(lambda: text in self.log_path.read_text(errors="replace"), timeout_s)

    def rss_bytes(self, field: str = "VmRSS") -> int:
        """A memory figure of ``/proc/<pid>/status`` (``RssAnon``: heap, not the LMDB map)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field}")

    def stat_map(self, client: Client) -> dict[str, float]:
        reply = client.call(Op.STATS)
        assert isinstance(reply, StatsReply), reply
        return dict(reply.stats)

    def stat(self, client: Client, name: str) -> float:
        return self.stat_map(client)[name]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM; the exit code (SIGKILL after ``timeout_s``: -9)."""
        return self.server.stop(timeout_s)

    def kill9(self) -> None:
        self.server.kill()


def daemon_toml(
    store: Path,
    extra: str = "",
    memory_bytes: int = 4 << 20,
    sync: bool | str | None = None,
    backend: str | None = None,
) -> str:
    """A daemon config on an OS-picked port; ``sync``, ``backend`` None: the defaults."""
    sync_line = "" if sync is None else f"sync = {json.dumps(sync)}"
    backend_line = "" if backend is None else f'backend = "{backend}"'
    return f"""
[server]
endpoint = "tcp://127.0.0.1:0"
ready_file = "ready.json"
{extra}
[store]
{backend_line}
path = "{store}"
max_bytes = {64 << 20}
memory_bytes = {memory_bytes}
{sync_line}
"""


StartDaemon = Callable[..., Daemon]

# Parametrize a test (or a module: ``pytestmark``) with this to run it on every store the
# daemon can run on: ``start_daemon()`` then starts daemons on ``daemon_backend``.
ON_EVERY_STORE = pytest.mark.parametrize("daemon_backend", STORE_BACKENDS)


@pytest.fixture
def daemon_backend() -> str:
    """The store kind of ``start_daemon()``'s default config (the daemon's default)."""
    return DaemonConfig().store.backend


@pytest.fixture
def start_daemon(tmp_path: Path, daemon_backend: str) -> Iterator[StartDaemon]:
    """``start_daemon(config_text=None)`` → a bound daemon; every one is killed at teardown."""
    started: list[Daemon] = []

    def start(config_text: str | None = None) -> Daemon:
        text = config_text or daemon_toml(tmp_path / "store", backend=daemon_backend)
        daemon = Daemon(tmp_path, text)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        if daemon.alive():
            daemon.kill9()


@pytest.fixture
def connect() -> Iterator[Callable[..., Client]]:
    clients: list[Client] = []

    def make(endpoint: str, curve: tuple[bytes, bytes, bytes] | None = None) -> Client:
        client = Client(endpoint, curve)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def pages() -> Callable[..., tuple[list[bytes], list[bytes]]]:
    """``pages(n, salt="", size=256)`` → (keys, records)."""

    def make(n: int, salt: str = "", size: int = 256) -> tuple[list[bytes], list[bytes]]:
        keys = [page_key(i, salt) for i in range(n)]
        return keys, [page_record(key, i, size) for i, key in enumerate(keys)]

    return make


class InProcess(NamedTuple):
    endpoint: str
    serving: threading.Thread  # the socket thread


@contextlib.contextmanager
def in_process_daemon(config: DaemonConfig) -> Iterator[InProcess]:
    """A DaemonServer serving on a thread of this process (for tests that patch its
    store to hold a call at a gate); stopped on exit (open the gates before)."""
    server = DaemonServer(config)
    bound = server.start()
    thread = threading.Thread(target=server.serve, name="socket", daemon=True)
    thread.start()
    try:
        yield InProcess(bound.endpoint, thread)
    finally:
        server.stop()
        thread.join(30)


@pytest.fixture
def clients(daemon: InProcess) -> Iterator[Callable[[], Client]]:
    """Clients of the test module's own ``daemon`` fixture (anything with an
    ``endpoint``), closed after the test."""
    made: list[Client] = []

    def make() -> Client:
        made.append(Client(daemon.endpoint))
        return made[-1]

    yield make
    for client in made:
        client.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def plane(tmp_path: Path, clock: Clock) -> Iterator[ShmPlane]:
    """A plane of ``SIZE`` bytes whose leases expire after ``EXPIRES_S`` of the fake clock."""
    made = ShmPlane(str(tmp_path / "slab"), SIZE, EXPIRES_S, clock)
    yield made
    made.close()
