"""The bytes a client PUTs are the bytes every later GET returns: from the memory tier,
from the store through the reply pool, pipelined, and after a restart.

Page records of sizes around ZeroMQ's and the daemon's thresholds (small frames that
ZeroMQ packs into shared receive buffers, records copied or kept as views) are sent
with many requests in flight, so a buffer reused too early shows as a wrong byte.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from storage_backends.page_format import encode_page
from storage_backends.remote.protocol import (
    GetReply,
    Op,
    PutReply,
    Request,
    decode_reply,
    encode_request,
)

from .conftest import REPLY_TIMEOUT_S, Client, daemon_toml, page_key

SIZES = (1, 100, 4096, (64 << 10) - 57, (64 << 10) + 1, (256 << 10) + 7)
COPIES = 4


def _records() -> dict[bytes, bytes]:
    rng = np.random.default_rng(7)
    keys = [page_key(i, "bytes-") for i in range(len(SIZES) * COPIES)]
    return {key: encode_page(key, rng.bytes(SIZES[i % len(SIZES)])) for i, key in enumerate(keys)}


def _pipelined(client: Client, op: Op, requests: list[Request]) -> dict[int, object]:
    """Send every request at once, then take every reply (by id)."""
    for request in requests:
        client.sock.send_multipart(encode_request(request))
    replies: dict[int, object] = {}
    for _ in requests:
        frames = client.recv(REPLY_TIMEOUT_S)
        assert frames is not None, "no reply in time"
        reply = decode_reply(frames, op)
        replies[reply.id] = reply  # type: ignore[assignment]
    return replies


def _get_each(client: Client, records: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """Every key by a GET of its own, all in flight together."""
    keys = list(records)
    replies = _pipelined(client, Op.GET, [Request(Op.GET, i + 1, (k,)) for i, k in enumerate(keys)])
    got: dict[bytes, bytes] = {}
    for i, key in enumerate(keys):
        reply = replies[i + 1]
        assert isinstance(reply, GetReply) and reply.found == (True,), reply
        got[key] = bytes(reply.pages[0])
    return got


def test_put_bytes_come_back_exactly_from_memory_from_the_store_and_after_restart(
    start_daemon, connect, tmp_path: Path
) -> None:
    records = _records()
    config = daemon_toml(tmp_path / "store", memory_bytes=8 << 20, sync=False)
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
    for _ in range(3):  # the store, into pool buffers that the later rounds reuse
        assert _get_each(again, records) == records
