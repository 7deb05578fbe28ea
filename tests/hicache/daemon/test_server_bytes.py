"""The bytes a client PUTs are the bytes every later GET returns: from the memory tier,
from the store through the reply pool, pipelined, and after a restart.

Page records of sizes around ZeroMQ's and the daemon's thresholds (small frames that
ZeroMQ packs into shared receive buffers, records copied or kept as views) are sent
with many requests in flight, so a buffer reused too early shows as a wrong byte.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import zmq

from storage_backends.page_format import encode_page
from storage_backends.remote.protocol import (
    GetReply,
    Op,
    PutReply,
    Request,
    decode_reply,
    encode_request,
)
from tests.polling import wait_until

from .conftest import REPLY_TIMEOUT_S, Client, daemon_toml, page_key

SIZES = (1, 100, 4096, (64 << 10) - 57, (64 << 10) + 1, (256 << 10) + 7)
COPIES = 4
BIG = (1 << 20) + 7
GETS = 'hicache_daemon_requests_total{op="GET"}'


class _SlowReader(Client):
    """A client whose socket takes in little: replies not yet read stay in the daemon."""

    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 1)
        self.sock.setsockopt(zmq.RCVBUF, 65536)
        self.sock.connect(endpoint)
        self._next_id = 0


def _records(sizes: list[int], salt: str) -> dict[bytes, bytes]:
    rng = np.random.default_rng(len(salt))
    keys = [page_key(i, salt) for i in range(len(sizes))]
    return {key: encode_page(key, rng.bytes(size)) for key, size in zip(keys, sizes, strict=True)}


def _pipelined(
    client: Client, op: Op, requests: list[Request], until: Callable[[], bool] | None = None
) -> dict[int, object]:
    """Send every request at once, then (once ``until`` holds) take every reply (by id)."""
    for request in requests:
        client.sock.send_multipart(encode_request(request))
    if until is not None:
        assert wait_until(until, REPLY_TIMEOUT_S), "the daemon did not answer in time"
    replies: dict[int, object] = {}
    for _ in requests:
        frames = client.recv(REPLY_TIMEOUT_S)
        assert frames is not None, "no reply in time"
        reply = decode_reply(frames, op)
        replies[reply.id] = reply  # type: ignore[assignment]
    return replies


def _get_each(
    client: Client, records: dict[bytes, bytes], until: Callable[[], bool] | None = None
) -> dict[bytes, bytes]:
    """Every key by a GET of its own, all in flight together."""
    keys = list(records)
    requests = [Request(Op.GET, i + 1, (k,)) for i, k in enumerate(keys)]
    replies = _pipelined(client, Op.GET, requests, until)
    got: dict[bytes, bytes] = {}
    for i, key in enumerate(keys):
        reply = replies[i + 1]
        assert isinstance(reply, GetReply) and reply.found == (True,), reply
        got[key] = bytes(reply.pages[0])
    return got


def test_put_bytes_come_back_exactly_from_memory_from_the_store_and_after_restart(
    start_daemon, connect, tmp_path: Path
) -> None:
    records = _records(list(SIZES) * COPIES, "bytes-")
    # More replies than the kernel's socket buffers hold, all of one size (one pool class).
    big = _records([BIG] * 24, "big-")
    records |= big
    config = daemon_toml(tmp_path / "store", memory_bytes=8 << 20, sync=False)
    assert "memory_bytes = 8388608" in config
    daemon = start_daemon(config)
    client = connect(daemon.endpoint)
    items = list(records.items())
    puts = [
        Request(Op.PUT, i + 1, tuple(k for k, _ in items[i::3]), tuple(r for _, r in items[i::3]))
        for i in range(3)
    ]
    acks = _pipelined(client, Op.PUT, puts)
    assert all(isinstance(a, PutReply) and all(a.stored) for a in acks.values()), acks
    assert _get_each(client, records) == records  # the memory tier
    assert daemon.terminate() == 0
    restarted = start_daemon(config.replace("memory_bytes = 8388608", "memory_bytes = 0"))
    again = connect(restarted.endpoint)
    restarted.wait_ping(again)
    assert _get_each(again, records) == records  # the store, into pool buffers
    # Replies that wait in the daemon (a client that reads nothing until all are
    # answered) keep their buffers: the reads after them must take others.
    slow = _SlowReader(restarted.endpoint)
    done = restarted.stat(again, GETS) + len(big)
    try:
        got = _get_each(slow, big, until=lambda: restarted.stat(again, GETS) >= done)
    finally:
        slow.close()
    assert got == big
