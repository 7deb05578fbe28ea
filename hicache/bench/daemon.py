"""Daemon throughput: GET/PUT GB/s and EXISTS latency of the remote backend vs a plain zmq echo.

The bench starts ``hicache serve`` (on a temporary store) and the echo server
(``hicache.bench.zmq_echo``) as subprocesses on loopback ports. ``--clients``
threads share one RemoteBackend (one DEALER socket per thread, as the storage
I/O workers do); the baseline threads send the same batches of the same page
sizes through their own DEALER sockets to the echo, which stores nothing and
checks nothing. ``ratio`` is daemon/echo throughput for GET and PUT, and
echo/daemon p50 latency for EXISTS (so > 1 always means "daemon faster").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple, Protocol

import msgpack
import numpy as np
import zmq
from tqdm import tqdm

from hicache.bench.daemon_fairness import FairnessRow, measure_fairness, print_fairness
from hicache.bench.processes import ServerProcess, start_daemon, start_echo
from hicache.config.flags import at_least
from storage_backends import StorageConfig
from storage_backends.remote.client import RemoteBackend

logger = logging.getLogger(__name__)

PAGE_SIZES = (64 << 10, 256 << 10, 2 << 20)
BATCH_BYTES = 4 << 20  # pages per call: 64 × 64 KiB, 16 × 256 KiB, 2 × 2 MiB
EXISTS_KEYS = 32


@dataclass(frozen=True)
class Row:
    op: str
    clients: int
    page_bytes: int
    gbps: float
    baseline_gbps: float
    ratio: float
    p50_us: float
    p99_us: float


class Timing(NamedTuple):
    """One measurement: wall time, bytes moved and per-call latencies."""

    wall_s: float
    nbytes: int
    latencies_s: list[float]

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


class EchoClient:
    """The same calls as bare DEALER round trips to the echo (one socket per thread)."""

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

    def _round_trip(self, op: str, n: int, size: int, payload: list[memoryview]) -> list[zmq.Frame]:
        sock = self._socket()
        header = msgpack.packb({"op": op, "id": 1, "n": n, "size": size})
        sock.send_multipart([header, *payload], copy=False)
        return sock.recv_multipart(copy=False)

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self._round_trip("PUT", len(keys), len(src[0]), src)
        return [True] * len(keys)

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        frames = self._round_trip("GET", len(keys), len(dst[0]), [])
        return [len(f) == len(d) for f, d in zip(frames[1:], dst, strict=True)]

    def exists(self, keys: Sequence[bytes]) -> int:
        self._round_trip("EXISTS", len(keys), 0, [])
        return len(keys)

    def close(self) -> None:
        for sock in self._sockets:
            sock.close(linger=0)
        self._ctx.term()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--clients", type=client_counts, default="1,4,16", help="comma-separated client counts"
    )
    parser.add_argument(
        "--mib", type=at_least(1), default=64, help="MiB each GET/PUT measurement moves in all"
    )
    parser.add_argument(
        "--repeat", type=at_least(1), default=3, help="runs per cell; the best counts"
    )
    parser.add_argument(
        "--exists-calls", type=at_least(1), default=200, help="EXISTS calls per client"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write the rows here (default: print only)"
    )


def client_counts(text: str) -> list[int]:
    """An argparse type: ``parse_clients`` with argparse's one-line refusal."""
    try:
        return parse_clients(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--clients ")) from None


def parse_clients(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--clients must be comma-separated integers, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"--clients needs counts >= 1, got {text!r}")
    return counts


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
    """The pages of one (clients, page size) cell: per client, batches of keys."""

    page_bytes: int
    batches: list[list[list[bytes]]]  # [client][batch] -> keys

    @staticmethod
    def build(tag: str, clients: int, page_bytes: int, total_bytes: int) -> Plan:
        per_batch = max(1, BATCH_BYTES // page_bytes)
        pages = max(per_batch, total_bytes // page_bytes // clients)
        nbatches = max(1, pages // per_batch)
        batches = [
            [
                [hashlib.sha256(f"{tag}/{c}/{b}/{i}".encode()).digest() for i in range(per_batch)]
                for b in range(nbatches)
            ]
            for c in range(clients)
        ]
        return Plan(page_bytes, batches)

    @property
    def clients(self) -> int:
        return len(self.batches)

    def batch_bytes(self) -> int:
        return len(self.batches[0][0]) * self.page_bytes


def timed_calls(calls: list[Callable[[], object]]) -> list[float]:
    out = []
    for call in calls:
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def measure(client: Client, plan: Plan, op: str, exists_calls: int) -> Timing:
    """One op over every client's batches; GET/PUT bytes count only pages that succeeded."""
    moved = [0] * plan.clients
    payload = [memoryview(np.random.default_rng(0).bytes(plan.page_bytes))]

    def work(c: int) -> list[float]:
        batches = plan.batches[c]
        if op == "EXISTS":
            flat = [key for batch in batches for key in batch]
            probes = [flat[i : i + EXISTS_KEYS] for i in range(0, len(flat), EXISTS_KEYS)]
            return timed_calls(
                [partial(client.exists, probes[i % len(probes)]) for i in range(exists_calls)]
            )
        bufs = [memoryview(bytearray(plan.page_bytes)) for _ in batches[0]]
        src = payload * len(batches[0])
        latencies = []
        for keys in batches:
            start = time.perf_counter()
            ok = client.put(keys, src) if op == "PUT" else client.get(keys, bufs)
            latencies.append(time.perf_counter() - start)
            moved[c] += sum(ok) * plan.page_bytes
        return latencies

    timing = drive(plan.clients, work)
    return timing._replace(nbytes=sum(moved))


OPS = ("PUT", "GET", "EXISTS")


def speed(timing: Timing, op: str) -> float:
    """Higher is better: GB/s for GET and PUT, calls per second at the median for EXISTS."""
    return timing.gbps if op != "EXISTS" else 1e6 / max(timing.percentile_us(50), 1e-9)


def cell_row(op: str, plan: Plan, mine: Timing, base: Timing) -> Row:
    moves = op != "EXISTS"
    return Row(
        op=op,
        clients=plan.clients,
        page_bytes=plan.page_bytes,
        gbps=mine.gbps if moves else 0.0,
        baseline_gbps=base.gbps if moves else 0.0,
        ratio=speed(mine, op) / max(speed(base, op), 1e-12),
        p50_us=mine.percentile_us(50),
        p99_us=mine.percentile_us(99),
    )


def cell_rows(
    daemon: RemoteBackend, echo: Client, plans: list[Plan], exists_calls: int
) -> tuple[list[Row], int]:
    """PUT, GET, EXISTS rows of one cell, each the best of one run per plan (fresh keys
    each, daemon and echo interleaved); and the pages that were not stored or read back."""
    best: dict[str, tuple[Timing, Timing]] = {}
    missing = 0
    for plan in plans:
        expected = plan.clients * len(plan.batches[0]) * plan.batch_bytes()
        for op in OPS:
            mine = measure(daemon, plan, op, exists_calls)
            base = measure(echo, plan, op, exists_calls)
            if op != "EXISTS":
                missing += (expected - mine.nbytes) // plan.page_bytes
            if op not in best or speed(mine, op) > speed(best[op][0], op):
                best[op] = (mine, best[op][1] if op in best else base)
            if speed(base, op) > speed(best[op][1], op):
                best[op] = (best[op][0], base)
        for batches in plan.batches:  # keep the daemon's memory tier for the next run
            for keys in batches:
                daemon.delete(keys)
    return [cell_row(op, plans[0], *best[op]) for op in OPS], missing


def print_rows(rows: list[Row]) -> None:
    head = f"{'op':<7}{'clients':>8}{'page':>9}{'GB/s':>8}{'echo':>8}{'ratio':>7}"
    print(f"{head}{'p50 µs':>9}{'p99 µs':>9}")
    for r in rows:
        page = f"{r.page_bytes >> 10} KiB"
        print(
            f"{r.op:<7}{r.clients:>8}{page:>9}{r.gbps:>8.2f}{r.baseline_gbps:>8.2f}"
            f"{r.ratio:>7.2f}{r.p50_us:>9.0f}{r.p99_us:>9.0f}"
        )


def run_cells(
    backend: RemoteBackend, echo: EchoClient, counts: list[int], args: argparse.Namespace
) -> tuple[list[Row], int]:
    rows: list[Row] = []
    missing = 0
    cells = [(c, size) for size in PAGE_SIZES for c in counts]
    for clients, size in tqdm(cells, desc="daemon bench", unit="cell", leave=False):
        plans = [
            Plan.build(f"{rep}/{clients}/{size}", clients, size, args.mib << 20)
            for rep in range(args.repeat)
        ]
        got, lost = cell_rows(backend, echo, plans, args.exists_calls)
        rows += got
        missing += lost
    return rows, missing


def run(args: argparse.Namespace) -> int:
    counts = args.clients if isinstance(args.clients, list) else parse_clients(args.clients)
    with tempfile.TemporaryDirectory(prefix="hicache-bench-daemon-") as tmp:
        daemon = start_daemon(args.config_path, Path(tmp) / "store")
        echo_server: ServerProcess | None = None
        backend = echo = None
        try:
            echo_server = start_echo()
            config = StorageConfig(backend="remote", endpoint=daemon.endpoint, timeout_s=60.0)
            backend, echo = RemoteBackend(config), EchoClient(echo_server.endpoint)
            rows, missing = run_cells(backend, echo, counts, args)
            fairness: list[FairnessRow] = measure_fairness(daemon.endpoint)
        finally:
            for closable in (backend, echo):
                if closable is not None:
                    closable.close()
            if echo_server is not None:
                echo_server.stop()
            daemon.stop()
    print_rows(rows)
    print_fairness(fairness)
    if missing:
        print(f"WARNING: {missing} pages were not stored or not read back")
    big_gets = [r.ratio for r in rows if r.op == "GET" and r.page_bytes >= 256 << 10]
    print(f"GET ratio for pages >= 256 KiB: min {min(big_gets):.2f} (target >= 0.5)")
    if args.json is not None:
        report = {"cells": [asdict(r) for r in rows], "fairness": [r._asdict() for r in fairness]}
        args.json.write_text(json.dumps(report, indent=2))
        print(f"report: {args.json}")
    return 0 if not missing else 1
