"""Reads off the socket thread: out-of-order replies, fairness between clients, and the
reply budget given back when a client that never read disconnects.

The daemon runs in this process so that a test can hold chosen reads at a gate
(``DaemonStore.get`` wrapped): every assertion is on the order replies arrive in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import msgpack
import pytest
import zmq

from hicache.config.daemon import DaemonConfig
from hicache.daemon.store import DaemonStore, Lookup
from storage_backends.remote.protocol import (
    ContainsReply,
    ErrorCode,
    ErrorReply,
    ExistsReply,
    GetReply,
    Op,
    Request,
    encode_request,
)

from .conftest import REPLY_TIMEOUT_S, Client, in_process_daemon, page_key, page_record

QUEUED = "hicache_daemon_queued_reply_bytes"
LENT = "hicache_daemon_reply_buffers_lent"
MEMORY_BYTES = 64 << 10
BIG = 2 * MEMORY_BYTES  # a record the memory tier cannot hold


class Gated(NamedTuple):
    endpoint: str
    gated: set[bytes]  # client keys whose GETs wait for ``gate``
    gate: threading.Event
    broken: set[bytes]  # client keys whose GETs come back from the store unusable


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gated]:
    gate, gated, broken = threading.Event(), set[bytes](), set[bytes]()
    original: Callable[..., Lookup] = DaemonStore.get

    def get(
        self: DaemonStore, keys: Sequence[bytes], client_keys: Sequence[bytes], *args: object
    ) -> Lookup:
        if gated.intersection(client_keys):
            assert gate.wait(2 * REPLY_TIMEOUT_S)
        lookup = original(self, keys, client_keys, *args)
        if broken.intersection(client_keys):  # the pages were read: the reply cannot be built
            return lookup._replace(memory_hits=None)
        return lookup

    monkeypatch.setattr(DaemonStore, "get", get)
    config = DaemonConfig().with_overrides(
        server={"endpoint": "tcp://127.0.0.1:0", "readers": 2},
        # The memory tier holds small records only: bigger ones are read by the readers.
        store={
            "path": str(tmp_path / "store"),
            "max_bytes": 64 << 20,
            "memory_bytes": MEMORY_BYTES,
            "sync": False,
        },
    )
    with in_process_daemon(config) as served:
        yield Gated(served.endpoint, gated, gate, broken)
        gate.set()


def into_memory(client: Client, keys: Sequence[bytes], records: Sequence[bytes]) -> None:
    """Put pages and read them twice: the memory tier keeps a page read a second time."""
    assert client.put(keys, records) == (True,) * len(keys)
    for _ in range(2):
        assert client.get(keys) == list(records)


def send(client: Client, op: Op, request_id: int, keys: Sequence[bytes] = ()) -> None:
    client.sock.send_multipart(encode_request(Request(op, request_id, tuple(keys))))


def reply_id(client: Client) -> int:
    """The id of the next reply (whatever its op), after checking it is not an error."""
    frames = client.recv()
    assert frames is not None, "no reply in time"
    header = msgpack.unpackb(frames[0])
    assert header["ok"] is True, header
    return int(header["id"])


def test_a_clients_later_requests_are_answered_before_a_slow_read(daemon, clients) -> None:
    client = clients()
    slow, other, cached, fresh = (page_key(i) for i in range(4))
    records = [page_record(slow, 0, size=BIG), page_record(other, 1, size=BIG)]
    assert client.put([slow, other], records)
    into_memory(client, [cached], [page_record(cached, 2)])
    daemon.gated.add(slow)
    send(client, Op.GET, 101, [slow])
    send(client, Op.PING, 102)
    send(client, Op.STATS, 103)
    send(client, Op.GET, 104, [cached])  # a read of its own, behind the held one
    put = Request(Op.PUT, 105, (fresh,), (page_record(fresh, 3),))
    client.sock.send_multipart(encode_request(put))
    assert {reply_id(client) for _ in range(4)} == {102, 103, 104, 105}  # the GET is held
    daemon.gate.set()
    assert reply_id(client) == 101


def test_a_small_read_is_answered_while_another_clients_bulk_reads_wait(daemon, clients) -> None:
    bulk, small = clients(), clients()
    keys = [page_key(i) for i in range(9)]
    records = [page_record(key, i, size=64 << 10) for i, key in enumerate(keys)]
    assert bulk.put(keys, records) == (True,) * 9
    daemon.gated.update(keys[:8])
    for i in range(4):  # more bulk reads than reader threads
        send(bulk, Op.GET, 200 + i, keys[2 * i : 2 * i + 2])
    assert small.get([keys[8]]) == [records[8]]
    assert bulk.sock.poll(0) == 0  # no bulk read has been answered yet
    daemon.gate.set()
    assert [reply_id(bulk) for _ in range(4)] == [200, 201, 202, 203]  # one client: in order


def test_reads_the_memory_tier_holds_are_answered_while_every_reader_is_busy(
    daemon, clients
) -> None:
    first, second, small = clients(), clients(), clients()
    big = [page_key(i, "big-") for i in range(2)]
    assert first.put(big, [page_record(key, i, size=BIG) for i, key in enumerate(big)])
    held = page_key(0, "small-")
    record = page_record(held, 0)
    into_memory(small, [held], [record])
    daemon.gated.update(big)
    send(first, Op.GET, 301, big[:1])  # one per reader thread (two), both held at the gate
    send(second, Op.GET, 302, big[1:])
    assert small.get([held]) == [record]
    assert small.call(Op.EXISTS, [held]) == ExistsReply(small._next_id, 1)
    assert small.call(Op.CONTAINS, [held]) == ContainsReply(small._next_id, (True,))
    assert first.sock.poll(0) == second.sock.poll(0) == 0  # the readers still hold theirs
    daemon.gate.set()
    assert (reply_id(first), reply_id(second)) == (301, 302)


def test_replies_a_client_never_read_are_released_when_it_disconnects(daemon, clients) -> None:
    other = clients()
    keys = [page_key(i, "big-") for i in range(4)]
    records = [page_record(key, i, size=1 << 20) for i, key in enumerate(keys)]
    assert other.put(keys, records) == (True,) * 4
    greedy = zmq.Context.instance().socket(zmq.DEALER)
    greedy.setsockopt(zmq.RCVHWM, 1)
    greedy.setsockopt(zmq.RCVBUF, 65536)
    greedy.setsockopt(zmq.LINGER, 0)
    greedy.connect(daemon.endpoint)
    try:
        before = _stat(other, 'hicache_daemon_requests_total{op="GET"}')
        for i in range(24):  # 96 MiB of replies, far beyond what the kernel buffers take
            greedy.send_multipart(encode_request(Request(Op.GET, i + 1, tuple(keys))))
        _wait(lambda: _stat(other, 'hicache_daemon_requests_total{op="GET"}') >= before + 24)
        assert _stat(other, QUEUED) > 0
        assert _stat(other, LENT) > 0  # the store's reads are the unsent replies' frames
    finally:
        greedy.close(linger=0)
    _wait(lambda: _stat(other, QUEUED) == 0)
    _wait(lambda: _stat(other, LENT) == 0)
    assert other.get(keys[:1]) == records[:1]


def test_pages_read_for_a_reply_that_failed_go_back_to_the_pool(daemon, clients) -> None:
    client = clients()
    key = page_key(0, "broken-")
    assert client.put([key], [page_record(key, 0, size=BIG)]) == (True,)
    daemon.broken.add(key)
    reply = client.call(Op.GET, [key])
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.INTERNAL
    assert _stat(client, LENT) == 0
    daemon.broken.clear()
    assert client.get([key]) == [page_record(key, 0, size=BIG)]


def _stat(client: Client, name: str) -> float:
    reply = client.call(Op.STATS)
    assert reply is not None and not isinstance(reply, GetReply)
    return reply.stats[name]  # type: ignore[union-attr]


def _wait(done: Callable[[], bool], timeout_s: float = REPLY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "condition not reached in time"
