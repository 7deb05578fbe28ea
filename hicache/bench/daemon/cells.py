"""The cells of ``hicache bench daemon``: what one measurement moves, and the echo it is held to.

A cell is (transport, page size, pages a call, clients). ``measure`` drives
``clients`` threads through a ``Client``, one call of ``pages`` pages at a
time, over fresh keys. The daemon's client is the ``remote`` backend; the
baseline is ``EchoClient``, which sends the same requests (the remote
backend's split of a call into requests, all in flight at once) as bare
frames to the plain zmq echo, which stores and checks nothing.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple, Protocol

import msgpack
import numpy as np
import zmq

from hicache.bench.common.processes import process_cpu_s
from storage_backends.page_format import HEADER_BYTES
from storage_backends.remote.client import chunks

EXISTS_KEYS = 32


class Cell(NamedTuple):
    transport: str  # "ipc" or "tcp"
    page_bytes: int
    pages: int  # pages a call
    clients: int


class Timing(NamedTuple):
    """One measurement: wall time, bytes moved, per-call latencies, and the CPU time the
    client process and the server process spent together (user + system, all threads)."""

    wall_s: float
    nbytes: int
    latencies_s: list[float]
    cpu_s: float = 0.0

    @property
    def gbps(self) -> float:
        return self.nbytes / max(self.wall_s, 1e-9) / 1e9

    def percentile_us(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1e6) if self.latencies_s else 0.0


class Client(Protocol):
    """What a measurement drives: the remote backend, or the echo baseline."""

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]: ...
    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]: ...
    def exists(self, keys: Sequence[bytes]) -> int: ...
    def delete(self, keys: Sequence[bytes]) -> int: ...


class EchoClient:
    """The remote backend's requests as bare DEALER round trips to the echo (a socket a
    thread): a call is split as the backend splits it, every request in flight at once."""

    def __init__(self, endpoint: str) -> None:
        self._endpoint = endpoint
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._local = threading.local()
        self._sockets: list[zmq.Socket[bytes]] = []
        self._lock = threading.Lock()

    def _socket(self) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] | None = getattr(self._local, "sock", None)
        if sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self._endpoint)
            with self._lock:
                self._sockets.append(sock)
            self._local.sock = sock
        return sock

    def _round_trips(self, op: str, size: int, payload: Sequence[memoryview]) -> int:
        """One request per chunk of ``payload`` (or of ``count`` pages for GET); the frames
        of every reply, counted."""
        sock = self._socket()
        parts = chunks([size] * len(payload))
        for part in parts:
            frames = payload[part.start : part.stop] if op == "PUT" else []
            n = part.stop - part.start
            header = msgpack.packb({"op": op, "id": part.start, "n": n, "size": size})
            sock.send_multipart([header, *frames], copy=False)
        return sum(len(sock.recv_multipart(copy=False)) - 1 for _ in parts)

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self._round_trips("PUT", HEADER_BYTES + len(src[0]), src)
        return [True] * len(keys)

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        got = self._round_trips("GET", HEADER_BYTES + len(dst[0]), dst)
        return [got == len(dst)] * len(dst)

    def exists(self, keys: Sequence[bytes]) -> int:
        self._socket().send_multipart([msgpack.packb({"op": "EXISTS", "id": 0, "n": 0})])
        self._socket().recv_multipart(copy=False)
        return len(keys)

    def delete(self, keys: Sequence[bytes]) -> int:
        return 0  # the echo keeps nothing

    def close(self) -> None:
        for sock in self._sockets:
            sock.close(linger=0)
        self._ctx.term()


def drive(clients: int, work: Callable[[int], list[float]]) -> Timing:
    """Run ``work(client)`` on ``clients`` threads started together; wall time and latencies."""
    barrier = threading.Barrier(clients + 1)
    results: list[list[float]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []

    def body(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as e:  # re-raised on the caller's thread below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return Timing(wall, 0, [x for r in results for x in r])


class Plan(NamedTuple):
    """The keys of one measurement of a cell: per client, calls of ``cell.pages`` keys."""

    cell: Cell
    calls: list[list[list[bytes]]]  # [client][call] -> keys

    @staticmethod
    def build(tag: str, cell: Cell, total_bytes: int) -> Plan:
        per_client = max(cell.pages, total_bytes // cell.page_bytes // cell.clients)
        ncalls = max(1, per_client // cell.pages)
        calls = [
            [
                [hashlib.sha256(f"{tag}/{c}/{b}/{i}".encode()).digest() for i in range(cell.pages)]
                for b in range(ncalls)
            ]
            for c in range(cell.clients)
        ]
        return Plan(cell, calls)

    @property
    def nbytes(self) -> int:
        return len(self.calls) * len(self.calls[0]) * self.cell.pages * self.cell.page_bytes


def timed_calls(calls: list[Callable[[], object]]) -> list[float]:
    out = []
    for call in calls:
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def measure(client: Client, server_pid: int, plan: Plan, op: str, exists_calls: int) -> Timing:
    """One op over every client's calls; GET/PUT bytes count only pages that succeeded.
    The CPU time counted is this process's and the server's (``server_pid``)."""
    size = plan.cell.page_bytes
    moved = [0] * plan.cell.clients
    payload = memoryview(np.random.default_rng(0).bytes(size))

    def work(c: int) -> list[float]:
        calls = plan.calls[c]
        if op == "EXISTS":
            flat = [key for keys in calls for key in keys]
            probes = [flat[i : i + EXISTS_KEYS] for i in range(0, len(flat), EXISTS_KEYS)]
            return timed_calls(
                [partial(client.exists, probes[i % len(probes)]) for i in range(exists_calls)]
            )
        bufs = [memoryview(bytearray(size)) for _ in range(plan.cell.pages)]
        src = [payload] * plan.cell.pages
        latencies = []
        for keys in calls:
            start = time.perf_counter()
            ok = client.put(keys, src) if op == "PUT" else client.get(keys, bufs)
            latencies.append(time.perf_counter() - start)
            moved[c] += sum(ok) * size
        return latencies

    cpu = time.process_time() + process_cpu_s(server_pid)
    timing = drive(plan.cell.clients, work)
    cpu = time.process_time() + process_cpu_s(server_pid) - cpu
    return timing._replace(nbytes=sum(moved), cpu_s=cpu)
