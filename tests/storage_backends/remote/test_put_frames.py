"""PutFramer: a put's records are built as each request is sent, in the room answered
requests gave back, so a put larger than the arena reuses it instead of fresh memory."""

from __future__ import annotations

import hashlib
from collections import deque

from storage_backends.page_format import HEADER_BYTES, encode_page
from storage_backends.record_arena import RecordArena
from storage_backends.remote.protocol import Op, PutReply, Reply, Request
from storage_backends.remote.put_frames import PutFramer


def _key(i: int) -> bytes:
    return hashlib.sha256(f"frames-{i}".encode()).digest()


def _exchange(framer: PutFramer, count: int, window: int) -> list[list[bytes]]:
    """What ``Channel.exchange`` does with ``prepare``: build a request as it is sent,
    at most ``window`` in flight, the oldest answered when none can be built. Returns
    each request's records as they were when sent."""
    sent: list[list[bytes]] = []
    pending: deque[int] = deque()
    while len(sent) < count or pending:
        request = None
        if len(sent) < count and len(pending) < window:
            request = framer.prepare(len(sent), not pending)
        if request is None:
            position = pending.popleft()
            reply: Reply = PutReply(0, (True,))
            framer.on_reply(position, reply)
            continue
        sent.append([bytes(record) for record in request.pages])
        pending.append(len(sent) - 1)
    return sent


def test_a_put_larger_than_the_arena_is_built_in_it_request_by_request() -> None:
    size, count = 1000, 40
    arena = RecordArena(5 * (HEADER_BYTES + size))  # room for five pages of forty
    pages = [[memoryview(bytes((i + j) % 251 for j in range(size)))] for i in range(count)]
    keys = [_key(i) for i in range(count)]
    parts = [[i] for i in range(count)]
    requests = [Request(Op.PUT, 0, (keys[i],)) for i in range(count)]
    notes: list[int] = []
    framer = PutFramer(arena, requests, parts, keys, pages, lambda p, _r: notes.append(p))
    arena.start(count * (HEADER_BYTES + size))
    sent = _exchange(framer, count, window=8)
    assert sent == [[encode_page(keys[i], pages[i][0])] for i in range(count)]
    assert arena.fresh == 0  # every record was built in the arena
    assert sorted(notes) == list(range(count))


def test_a_record_larger_than_the_arena_is_built_on_its_own_when_nothing_is_in_flight() -> None:
    arena = RecordArena(HEADER_BYTES + 10)
    page = [memoryview(b"x" * 100)]
    framer = PutFramer(arena, [Request(Op.PUT, 0, (_key(0),))], [[0]], [_key(0)], [page], print)
    arena.start(HEADER_BYTES + 100)
    assert framer.prepare(0, False) is None  # no room: wait for a reply
    request = framer.prepare(0, True)  # nothing in flight: built anyway
    assert request is not None and bytes(request.pages[0]) == encode_page(_key(0), page[0])
    assert arena.fresh == 1
