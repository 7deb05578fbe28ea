"""A GET reply's pages stay untouched until ZeroMQ has sent them, whatever the reply's
last frame is.

The reply pool's buffers are the frames of GET replies read from the store. The
daemon runs in this process with the pool's debug poison on
(``HICACHE_DAEMON_POISON``): a buffer given back is overwritten at once. A client
that does not read keeps the replies in ZeroMQ's queue; each reply ends with a
small page (which ZeroMQ copies, so its own frame is done at once) after a large
one (sent from the pool's buffer): when the client then reads, every page must
still be the one it put.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from hicache.config.daemon import DaemonConfig
from storage_backends.page_format import Verdict, validate
from storage_backends.remote.protocol import GetReply, Op, Request, decode_reply, encode_request

from .conftest import REPLY_TIMEOUT_S, InProcess, in_process_daemon, page_key, page_record

BIG = 1 << 20  # sent from the pool's buffer without a copy
SMALL = 4 << 10  # copied by ZeroMQ when sent
REPLIES = 24  # 48 MiB of replies: far more than the socket buffers take


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcess]:
    monkeypatch.setenv("HICACHE_DAEMON_POISON", "1")
    config = DaemonConfig().with_overrides(
        server={"endpoint": "tcp://127.0.0.1:0", "readers": 2},
        store={
            "path": str(tmp_path / "store"),
            "max_bytes": 64 << 20,
            "memory_bytes": 0,  # every GET is read from the store into the pool's buffers
        },
    )
    with in_process_daemon(config) as served:
        yield served


def test_pages_before_a_small_last_page_are_not_reused_before_they_are_sent(
    daemon, clients
) -> None:
    writer = clients()
    keys = [page_key(i, "frames-") for i in range(4)]
    sizes = [BIG, SMALL, BIG, SMALL]
    records = [
        page_record(key, i, size) for i, (key, size) in enumerate(zip(keys, sizes, strict=True))
    ]
    assert writer.put(keys, records) == (True,) * 4
    slow = zmq.Context.instance().socket(zmq.DEALER)
    slow.setsockopt(zmq.RCVHWM, 1)
    slow.setsockopt(zmq.RCVBUF, 65536)
    slow.setsockopt(zmq.LINGER, 0)
    slow.connect(daemon.endpoint)
    try:
        for request_id in range(1, REPLIES + 1):  # each reply: a big page, then a small one
            pair = keys[:2] if request_id % 2 else keys[2:]
            slow.send_multipart(encode_request(Request(Op.GET, request_id, tuple(pair))))
        # Meanwhile other reads take buffers from the pool (and would write a reused one).
        for _ in range(8):
            assert writer.get(keys) == records
        for _ in range(REPLIES):
            assert slow.poll(int(REPLY_TIMEOUT_S * 1000)), "no reply in time"
            reply = decode_reply(slow.recv_multipart(), Op.GET)
            assert isinstance(reply, GetReply) and reply.found == (True, True)
            pair = keys[:2] if reply.id % 2 else keys[2:]
            for key, page in zip(pair, reply.pages, strict=True):
                assert validate(memoryview(page), key, None) is Verdict.OK
    finally:
        slow.close(linger=0)
    stats = writer.call(Op.STATS).stats  # type: ignore[union-attr]
    assert stats["hicache_daemon_reply_buffers_tampered"] == 0
