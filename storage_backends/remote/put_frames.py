"""PutFramer: a PUT's records built into the thread's arena as each request is sent.

A put's requests are sent a window at a time (``Channel.exchange``). Built all
before the first is sent, a put larger than the arena would build most of its
records as fresh memory (faulted in, zeroed, freed: more CPU than the copy);
built as each request goes out, into the room earlier answered requests gave
back (``RecordArena``: a ring), a put of any size reuses the same buffer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from storage_backends.page_format import HEADER_BYTES
from storage_backends.record_arena import RecordArena
from storage_backends.remote.channel import OnReply
from storage_backends.remote.protocol import Reply, Request

Runs = Sequence[memoryview]


class PutFramer:
    """``prepare`` and ``on_reply`` for one PUT exchange (``Channel.exchange``).

    ``requests`` are the exchange's requests: one through a shared-memory lease
    (with spans) is sent as it is; the others carry no records yet, and
    ``prepare`` builds them from ``keys[i]`` and ``pages[i]`` for ``i`` in the
    request's ``parts`` entry, in the arena where the records find room, else
    (``must``: nothing in flight) where they can. ``on_reply`` hands each reply
    to ``note`` and gives its request's room back to the arena. Not thread-safe:
    the exchange's thread only. Mutates the arena.
    """

    def __init__(
        self,
        arena: RecordArena,
        requests: Sequence[Request],
        parts: Sequence[Sequence[int]],
        keys: Sequence[bytes],
        pages: Sequence[Runs],
        note: OnReply,
    ) -> None:
        self._arena = arena
        self._requests = requests
        self._parts = parts
        self._keys = keys
        self._pages = pages
        self._note = note
        self._regions: dict[int, int] = {}  # request position -> its arena region

    def prepare(self, position: int, must: bool) -> Request | None:
        request = self._requests[position]
        if request.spans:
            return request
        part = self._parts[position]
        sizes = [HEADER_BYTES + sum(len(run) for run in self._pages[i]) for i in part]
        if not must and not self._arena.fits(sizes):
            return None
        records = tuple(self._arena.encode_runs(self._keys[i], self._pages[i]) for i in part)
        self._regions[position] = self._arena.seal()
        return dataclasses.replace(request, pages=records)

    def on_reply(self, position: int, reply: Reply) -> None:
        self._note(position, reply)
        region = self._regions.pop(position, None)
        if region is not None:
            self._arena.release(region)
