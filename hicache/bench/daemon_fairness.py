"""Daemon fairness: latency of a small GET and of a PING while another client streams GETs.

One thread streams bulk GETs (``BULK_PAGES`` pages of ``BULK_PAGE_BYTES`` per
request, a window of requests in flight) through its own DEALER socket; the
probe sends, one at a time, a 1-page GET and a PING and records each round
trip. The same probe also runs against a quiet daemon in the same run, so the
figures read as "under load" next to "quiet".
"""

from __future__ import annotations

import hashlib
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
PROBES = 200


class FairnessRow(NamedTuple):
    probe: str  # "GET 1 page" or "PING"
    load: str  # "quiet" or "bulk GETs"
    p50_us: float
    p99_us: float


def _keys(tag: str, n: int) -> list[bytes]:
    return [hashlib.sha256(f"fair/{tag}/{i}".encode()).digest() for i in range(n)]


class _Dealer:
    """A raw protocol client: one socket, ids assigned here, one reply awaited at a time."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self._next = 0

    def send(self, op: Op, keys: Sequence[bytes] = (), pages: Sequence[bytes] = ()) -> None:
        self._next += 1
        self.sock.send_multipart(encode_request(Request(op, self._next, tuple(keys), tuple(pages))))

    def round_trip(self, op: Op, keys: Sequence[bytes] = ()) -> float:
        start = time.perf_counter()
        self.send(op, keys)
        if not self.sock.poll(30_000):
            raise TimeoutError(f"no {op} reply within 30 s")
        self.sock.recv_multipart(copy=False)
        return time.perf_counter() - start


def _stream(dealer: _Dealer, keys: list[bytes], stop: threading.Event) -> None:
    """Bulk GETs, ``BULK_WINDOW`` in flight, until ``stop``."""
    batches = [keys[i : i + BULK_PAGES] for i in range(0, len(keys), BULK_PAGES)]
    sent = 0
    for _ in range(BULK_WINDOW):
        dealer.send(Op.GET, batches[sent % len(batches)])
        sent += 1
    while not stop.is_set():
        if dealer.sock.poll(1000):
            dealer.sock.recv_multipart(copy=False)
            dealer.send(Op.GET, batches[sent % len(batches)])
            sent += 1


def _probe(dealer: _Dealer, key: bytes) -> tuple[list[float], list[float]]:
    gets, pings = [], []
    for _ in range(PROBES):
        gets.append(dealer.round_trip(Op.GET, [key]))
        pings.append(dealer.round_trip(Op.PING))
    return gets, pings


def _rows(load: str, gets: list[float], pings: list[float]) -> list[FairnessRow]:
    def row(probe: str, samples: list[float]) -> FairnessRow:
        p50, p99 = np.percentile(samples, [50, 99]) * 1e6
        return FairnessRow(probe, load, float(p50), float(p99))

    return [row("GET 1 page", gets), row("PING", pings)]


def measure_fairness(endpoint: str) -> list[FairnessRow]:
    """Probe latencies on a quiet daemon, then while another client streams bulk GETs."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    bulk, probe = _Dealer(ctx, endpoint), _Dealer(ctx, endpoint)
    try:
        keys = _keys("bulk", 4 * BULK_PAGES)
        payload = np.random.default_rng(0).bytes(BULK_PAGE_BYTES)
        for i in range(0, len(keys), BULK_PAGES):
            pages = [encode_page(key, payload) for key in keys[i : i + BULK_PAGES]]
            bulk.send(Op.PUT, keys[i : i + BULK_PAGES], pages)
            bulk.sock.recv_multipart()
        small = _keys("small", 1)[0]
        probe.send(Op.PUT, [small], [encode_page(small, payload[:4096])])
        probe.sock.recv_multipart()
        rows = _rows("quiet", *_probe(probe, small))
        stop = threading.Event()
        streamer = threading.Thread(target=_stream, args=(bulk, keys, stop), daemon=True)
        streamer.start()
        try:
            rows += _rows("bulk GETs", *_probe(probe, small))
        finally:
            stop.set()
            streamer.join(30)
        return rows
    finally:
        bulk.sock.close(linger=0)
        probe.sock.close(linger=0)
        ctx.term()


def print_fairness(rows: list[FairnessRow]) -> None:
    print(f"{'probe':<12}{'load':<11}{'p50 µs':>9}{'p99 µs':>9}")
    for r in rows:
        print(f"{r.probe:<12}{r.load:<11}{r.p50_us:>9.0f}{r.p99_us:>9.0f}")
