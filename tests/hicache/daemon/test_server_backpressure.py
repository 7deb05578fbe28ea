"""A client that sends GETs and never reads the replies: bounded memory, others still served."""

from __future__ import annotations

import time

import zmq

from storage_backends import StorageConfig, create
from storage_backends.page_format import HEADER_BYTES
from storage_backends.remote.protocol import Op, PingReply, Request, encode_request

from .conftest import daemon_toml, page_key

PAGE = 1 << 20
PAGES = 40
UNREAD_GETS = 40  # of 16 pages each: 640 MiB of replies if all were queued
PEER_BUDGET = 32 << 20
SLACK = 48 << 20  # allocator and interpreter noise around the bound


def test_unread_replies_are_bounded_and_do_not_stall_others(
    start_daemon, connect, pages, tmp_path
) -> None:
    extra = f"max_queued_reply_bytes_per_peer = {PEER_BUDGET}\n"
    daemon = start_daemon(daemon_toml(tmp_path / "store", extra, memory_bytes=PAGE, sync=False))
    other = connect(daemon.endpoint)
    daemon.wait_ping(other)
    keys, records = pages(PAGES, size=PAGE - 64)
    for start in range(0, PAGES, 8):
        assert other.put(keys[start : start + 8], records[start : start + 8]) == (True,) * 8
    baseline = daemon.rss_bytes("RssAnon")

    greedy = zmq.Context.instance().socket(zmq.DEALER)
    greedy.setsockopt(zmq.RCVHWM, 1)
    greedy.setsockopt(zmq.RCVBUF, 65536)
    greedy.setsockopt(zmq.LINGER, 0)
    greedy.connect(daemon.endpoint)
    slowest_ping = 0.0
    try:
        for i in range(UNREAD_GETS):
            window = keys[(i * 16) % (PAGES - 16) :][:16]
            greedy.send_multipart(encode_request(Request(Op.GET, i + 1, tuple(window))))
            start = time.perf_counter()
            assert isinstance(other.call(Op.PING), PingReply)
            slowest_ping = max(slowest_ping, time.perf_counter() - start)
        while daemon.stat(other, 'hicache_daemon_requests_total{op="GET"}') < UNREAD_GETS:
            pass
        grown = daemon.rss_bytes("RssAnon") - baseline
        busy = daemon.stat(other, 'hicache_daemon_errors_total{code="BUSY"}')
    finally:
        greedy.close(linger=0)
    print(f"RssAnon grew {grown / 2**20:.0f} MiB; slowest PING {slowest_ping * 1000:.0f} ms")
    assert grown <= PEER_BUDGET + 16 * PAGE + SLACK, f"RssAnon grew {grown / 2**20:.0f} MiB"
    assert busy > 0
    # Once the greedy client is gone its queue is released and GETs are served again.
    assert other.get(keys[:4]) == records[:4]


def test_a_client_that_reads_gets_a_batch_larger_than_its_budget(start_daemon, tmp_path) -> None:
    budget = 80 << 20  # above the remote backend's window of requests in flight
    extra = f"max_queued_reply_bytes_per_peer = {budget}\n"
    toml = daemon_toml(tmp_path / "store", extra, memory_bytes=PAGE, sync=False)
    daemon = start_daemon(toml.replace(f"max_bytes = {64 << 20}", f"max_bytes = {256 << 20}"))
    config = StorageConfig(backend="remote", endpoint=daemon.endpoint, timeout_s=30.0)
    backend = create("remote", config)
    count, size = 128, PAGE - HEADER_BYTES  # 128 MiB in one batch
    keys = [page_key(i, "batch-") for i in range(count)]
    try:
        for start in range(0, count, 16):
            src = [memoryview(bytes([i % 251]) * size) for i in range(start, start + 16)]
            assert backend.put(keys[start : start + 16], src) == [True] * 16
        dst = [memoryview(bytearray(size)) for _ in keys]
        hits = backend.get(keys, dst)
    finally:
        backend.close()
    assert sum(hits) == count
    assert all(view[0] == i % 251 for i, view in enumerate(dst))
