"""RemoteBackend trusts nothing it receives: damaged records and protocol-breaking replies.

The peer is a scripted ROUTER thread that answers with exactly the frames a
test gives it, the way a faulty or hostile daemon (or a corrupted link) could.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple

import msgpack
import pytest
import zmq

from storage_backends import StorageConfig, create
from storage_backends.page_format import HEADER_BYTES, encode_page
from storage_backends.remote.client import RemoteBackend
from storage_backends.remote.protocol import (
    DeleteReply,
    ErrorCode,
    ErrorReply,
    GetReply,
    Limits,
    Op,
    PingReply,
    Reply,
    Request,
    decode_request,
    encode_reply,
)
from tests.polling import wait_until

PAGE = 1024
Script = Callable[[Request], list[bytes]]


def key(i: int) -> bytes:
    return hashlib.sha256(f"v{i}".encode()).digest()


def frames(reply: Reply) -> list[bytes]:
    return [bytes(f) for f in encode_reply(reply)]


class Peer(NamedTuple):
    endpoint: str
    script: list[Script]  # the current answering function, replaceable by a test


@pytest.fixture
def peer() -> Iterator[Peer]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    script: list[Script] = [lambda req: frames(DeleteReply(req.id, len(req.keys)))]
    stop = threading.Event()

    def ping(req: Request) -> list[bytes]:  # the breaker's probe
        return frames(PingReply(req.id, "scripted peer"))

    def serve() -> None:
        while not stop.is_set():
            if sock.poll(50, zmq.POLLIN):
                identity, *body = sock.recv_multipart()
                request = decode_request(body, Limits())
                answer = script[0] if request.op is not Op.PING else ping
                sock.send_multipart([identity, *answer(request)])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield Peer(sock.getsockopt_string(zmq.LAST_ENDPOINT), script)
    stop.set()
    thread.join(5)
    sock.close()
    ctx.term()


def remote(endpoint: str, timeout_s: float = 0.5, max_page_bytes: int = 64 << 20) -> RemoteBackend:
    # A timeout opens the breaker; a short cool-down lets the next call probe soon.
    config = StorageConfig(
        backend="remote",
        endpoint=endpoint,
        timeout_s=timeout_s,
        max_page_bytes=max_page_bytes,
        breaker_cooldown_s=0.05,
    )
    backend = create("remote", config)
    assert isinstance(backend, RemoteBackend)
    return backend


def answer_get(records: Callable[[bytes], bytes | None]) -> Script:
    """GETs answered with ``records(key)`` (None: not found); DELETEs with 'all deleted'."""

    def script(req: Request) -> list[bytes]:
        if req.op is Op.DELETE:
            return frames(DeleteReply(req.id, len(req.keys)))
        found = [records(k) for k in req.keys]
        pages = tuple(r for r in found if r is not None)
        return frames(GetReply(req.id, tuple(r is not None for r in found), pages))

    return script


def flip(record: bytes, at: int) -> bytes:
    return record[:at] + bytes([record[at] ^ 1]) + record[at + 1 :]


@pytest.mark.parametrize(
    "damage",
    [
        lambda k, good: flip(good, HEADER_BYTES + 7),  # payload bit flip: checksum
        lambda k, good: flip(good, 0),  # magic
        lambda k, good: encode_page(key(99), good[HEADER_BYTES:]),  # another key's record
        lambda k, good: good[:-1],  # truncated
    ],
    ids=["checksum", "magic", "wrong_key", "truncated"],
)
def test_damaged_records_are_misses_counted_and_deleted(
    peer: Peer, damage: Callable[[bytes, bytes], bytes]
) -> None:
    good = {key(i): encode_page(key(i), bytes([i]) * PAGE) for i in range(3)}
    peer.script[0] = answer_get(lambda k: damage(k, good[k]) if k == key(1) else good[k])
    backend = remote(peer.endpoint)
    try:
        dst = [memoryview(bytearray(b"\xee" * PAGE)) for _ in range(3)]
        assert backend.get(list(good), dst) == [True, False, True]
        assert bytes(dst[0]) == b"\x00" * PAGE and bytes(dst[2]) == b"\x02" * PAGE
        assert bytes(dst[1]) == b"\xee" * PAGE  # nothing of a damaged page is copied
        stats = backend.stats()
        assert (stats.hits, stats.misses, stats.corrupt) == (2, 1, 1)
        assert backend.take_removed() == [key(1)]  # deleted at the daemon and announced
    finally:
        backend.close()


def test_replies_that_break_the_protocol_are_misses(peer: Peer) -> None:
    record = encode_page(key(0), b"\x05" * PAGE)
    bad_replies: list[Script] = [
        # one key asked, two found
        lambda req: frames(GetReply(req.id, (True, True), (record, record))),
        # found, but no page frame follows
        lambda req: [msgpack.packb({"v": 1, "id": req.id, "ok": True, "found": [True]})],
        lambda req: frames(ErrorReply(req.id, ErrorCode.TOO_LARGE, "no")),
        # not msgpack at all (no readable id: the request times out, the breaker opens)
        lambda req: [b"\xc1 not msgpack"],
    ]
    backend = remote(peer.endpoint)
    try:
        for script in bad_replies:
            peer.script[0] = script
            dst = [memoryview(bytearray(PAGE))]
            assert backend.get([key(0)], dst) == [False]
            assert bytes(dst[0]) == bytes(PAGE)
        link = backend.link_stats()
        assert (link.bad_replies, link.timeouts, link.error_replies) == (2, 1, 1)
        peer.script[0] = answer_get(lambda k: record)
        assert wait_until(
            lambda: backend.get([key(0)], [memoryview(bytearray(PAGE))]) == [True], 10
        )
    finally:
        backend.close()


def test_a_late_reply_is_never_taken_for_a_later_request(peer: Peer) -> None:
    records = {key(i): encode_page(key(i), bytes([i]) * PAGE) for i in range(2)}
    held, release = threading.Event(), threading.Event()

    def script(req: Request) -> list[bytes]:
        if req.keys == (key(0),) and not held.is_set():
            held.set()
            release.wait(60)  # answered only after the client gave up on it
        return answer_get(records.get)(req)

    peer.script[0] = script
    backend = remote(peer.endpoint, timeout_s=2.0)
    try:
        dst = [memoryview(bytearray(PAGE))]
        assert backend.get([key(0)], dst) == [False]  # timed out: no reply came at all
        assert held.is_set()
        release.set()  # the late reply to key 0 now comes first, then key 1's
        assert wait_until(lambda: backend.get([key(1)], dst) == [True], 10)  # after the probe
        assert bytes(dst[0]) == b"\x01" * PAGE  # key 1's page, not the late key 0 reply
        assert backend.link_stats().timeouts == 1
    finally:
        release.set()
        backend.close()


def test_a_frame_larger_than_any_valid_reply_is_refused(peer: Peer) -> None:
    small = encode_page(key(0), b"\x03" * PAGE)
    huge = encode_page(key(0), bytes(8 << 20))  # 8 MiB: over this client's frame bound
    peer.script[0] = answer_get(lambda k: huge)
    backend = remote(peer.endpoint, max_page_bytes=PAGE)
    try:
        assert backend.get([key(0)], [memoryview(bytearray(PAGE))]) == [False]
        assert backend.link_stats().timeouts == 1  # the connection was dropped, not read
        peer.script[0] = answer_get(lambda k: small)
        assert wait_until(
            lambda: backend.get([key(0)], [memoryview(bytearray(PAGE))]) == [True], 10
        )
    finally:
        backend.close()
