"""Daemon fairness: latency of a small GET and of a PING while another client streams.

One thread streams ``total_bytes`` of bulk GETs, then ``total_bytes`` of bulk
PUTs (fresh keys), ``BULK_PAGES`` pages of ``BULK_PAGE_BYTES`` a request and
``BULK_WINDOW`` requests in flight, through its own DEALER socket and zmq
context (two clients do not share a ZeroMQ I/O thread); meanwhile
the probe sends, one at a time, a 1-page GET and a PING and records each
round trip, until that stream ends. The same probe also runs against a quiet
daemon in the same run, so the figures read as "under load" next to "quiet";
each row carries the machine's load average (on busy cores every thread wake-up
on the path waits for a core: the p99 is mostly that).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import zmq

from storage_backends.page_format import encode_page
from storage_backends.remote.protocol import Op, Request, encode_request

BULK_PAGE_BYTES = 256 << 10
BULK_PAGES = 16
BULK_WINDOW = 16  # bulk requests in flight (the remote backend keeps up to 64)
QUIET_PROBES = 200
REPLY_TIMEOUT_MS = 30_000


class FairnessRow(NamedTuple):
    transport: str
    probe: str  # "GET 1 page" or "PING"
    load: str  # "quiet", "bulk GETs" or "bulk PUTs"
    p50_us: float
    p99_us: float
    samples: int
    load_avg: float  # the machine's 1-minute load average when the probe ended (0: unknown)


def _keys(tag: str, n: int) -> list[bytes]:
    return [hashlib.sha256(f"fair/{tag}/{i}".encode()).digest() for i in range(n)]


class _Dealer:
    """A raw protocol client: one socket, ids assigned here."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self._next = 0

    def send(self, op: Op, keys: Sequence[bytes] = (), pages: Sequence[bytes] = ()) -> None:
        self._next += 1
        frames = encode_request(Request(op, self._next, tuple(keys), tuple(pages)))
        self.sock.send_multipart(frames, copy=False)

    def recv(self) -> None:
        if not self.sock.poll(REPLY_TIMEOUT_MS):
            raise TimeoutError(f"no reply within {REPLY_TIMEOUT_MS} ms")
        self.sock.recv_multipart(copy=False)

    def round_trip(self, op: Op, keys: Sequence[bytes] = ()) -> float:
        start = time.perf_counter()
        self.send(op, keys)
        self.recv()
        return time.perf_counter() - start


class _Bulk(NamedTuple):
    """What the streaming client sends: request ``i`` is ``op`` of ``batches[i]``."""

    op: Op
    batches: list[list[bytes]]
    records: dict[bytes, bytes]  # PUT only


def _stream(sock: _Dealer, bulk: _Bulk, done: threading.Event) -> None:
    """Every request of ``bulk``, ``BULK_WINDOW`` in flight; sets ``done`` at the end."""
    try:
        in_flight = 0
        for keys in bulk.batches:
            if in_flight == BULK_WINDOW:
                sock.recv()
                in_flight -= 1
            sock.send(bulk.op, keys, [bulk.records[k] for k in keys] if bulk.records else ())
            in_flight += 1
        for _ in range(in_flight):
            sock.recv()
    finally:
        done.set()


def _probe(
    dealer: _Dealer, key: bytes, until: threading.Event | None
) -> tuple[list[float], list[float]]:
    """GET and PING round trips: ``QUIET_PROBES`` of each, or (with ``until``) at least
    one each until ``until`` is set."""
    gets: list[float] = []
    pings: list[float] = []
    while True:
        gets.append(dealer.round_trip(Op.GET, [key]))
        pings.append(dealer.round_trip(Op.PING))
        if until.is_set() if until is not None else len(gets) >= QUIET_PROBES:
            return gets, pings


def _load_avg() -> float:
    """The 1-minute load average (latencies on a busy machine read differently); 0.0 where
    the OS does not tell."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def _rows(transport: str, load: str, gets: list[float], pings: list[float]) -> list[FairnessRow]:
    load_avg = _load_avg()

    def row(probe: str, samples: list[float]) -> FairnessRow:
        if not samples:
            return FairnessRow(transport, probe, load, 0.0, 0.0, 0, load_avg)
        p50, p99 = np.percentile(samples, [50, 99]) * 1e6
        return FairnessRow(transport, probe, load, float(p50), float(p99), len(samples), load_avg)

    return [row("GET 1 page", gets), row("PING", pings)]


def _under_load(
    probe: _Dealer, small: bytes, bulk: _Dealer, load: _Bulk
) -> tuple[list[float], list[float]]:
    done = threading.Event()
    streamer = threading.Thread(target=_stream, args=(bulk, load, done), daemon=True)
    streamer.start()
    try:
        return _probe(probe, small, done)
    finally:
        streamer.join(REPLY_TIMEOUT_MS / 1000)


def _loads(payload: bytes, total_bytes: int) -> tuple[_Bulk, _Bulk, list[bytes]]:
    """The bulk GETs (over pages stored first), the bulk PUTs (fresh keys), the GET keys."""
    requests = max(1, total_bytes // (BULK_PAGE_BYTES * BULK_PAGES))
    stored = _keys("bulk", 4 * BULK_PAGES)
    get_batches = [stored[(i % 4) * BULK_PAGES :][:BULK_PAGES] for i in range(requests)]
    fresh = _keys("fresh", requests * BULK_PAGES)
    put_batches = [fresh[i : i + BULK_PAGES] for i in range(0, len(fresh), BULK_PAGES)]
    records = {key: encode_page(key, payload) for key in fresh}
    return _Bulk(Op.GET, get_batches, {}), _Bulk(Op.PUT, put_batches, records), stored


def measure_fairness(endpoint: str, transport: str, total_bytes: int) -> list[FairnessRow]:
    """Probe latencies on a quiet daemon, then while another client streams GETs, then PUTs."""
    # One context each: two clients, as two engines would be, do not share an I/O thread.
    contexts: list[zmq.Context[zmq.Socket[bytes]]] = [zmq.Context(), zmq.Context()]
    bulk, probe = _Dealer(contexts[0], endpoint), _Dealer(contexts[1], endpoint)
    try:
        payload = np.random.default_rng(0).bytes(BULK_PAGE_BYTES)
        gets, puts, stored = _loads(payload, total_bytes)
        for i in range(0, len(stored), BULK_PAGES):
            keys = stored[i : i + BULK_PAGES]
            bulk.send(Op.PUT, keys, [encode_page(key, payload) for key in keys])
            bulk.recv()
        small = _keys("small", 1)[0]
        probe.send(Op.PUT, [small], [encode_page(small, payload[:4096])])
        probe.recv()
        rows = _rows(transport, "quiet", *_probe(probe, small, None))
        rows += _rows(transport, "bulk GETs", *_under_load(probe, small, bulk, gets))
        rows += _rows(transport, "bulk PUTs", *_under_load(probe, small, bulk, puts))
        return rows
    finally:
        bulk.sock.close(linger=0)
        probe.sock.close(linger=0)
        for ctx in contexts:
            ctx.term()


def print_fairness(rows: list[FairnessRow]) -> None:
    print(f"{'via':<5}{'probe':<12}{'load':<11}{'p50 µs':>9}{'p99 µs':>9}{'n':>6}{'loadavg':>8}")
    for r in rows:
        print(
            f"{r.transport:<5}{r.probe:<12}{r.load:<11}{r.p50_us:>9.0f}{r.p99_us:>9.0f}"
            f"{r.samples:>6}{r.load_avg:>8.1f}"
        )
