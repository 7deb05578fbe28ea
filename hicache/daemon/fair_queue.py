"""FairQueue: work queued per client, handed out round robin across clients."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    """Per-peer FIFOs; ``pop`` takes the head of the next idle peer in turn.

    A peer is busy from the ``pop`` of one of its items until ``done(peer)``:
    its next item waits, so one peer occupies at most one consumer and its
    items are served one at a time, in the order they came. Idle peers take
    turns (round robin), so a peer with a thousand items queued delays
    another peer's one item by at most the item being served.
    Thread-safe: ``push`` and ``done`` from any thread, ``pop`` from any
    number of consumer threads. After ``close``, ``push`` refuses and
    ``pop`` returns None at once; ``close`` returns what was still queued.
    """

    def __init__(self) -> None:
        self._peers: OrderedDict[bytes, deque[T]] = OrderedDict()
        self._busy: set[bytes] = set()
        self._size = 0
        self._closed = False
        self._ready = threading.Condition()

    def __len__(self) -> int:
        return self._size

    def push(self, peer: bytes, item: T) -> bool:
        """Queue ``item`` behind ``peer``'s earlier items; False once closed."""
        with self._ready:
            if self._closed:
                return False
            self._peers.setdefault(peer, deque()).append(item)
            self._size += 1
            self._ready.notify()
            return True

    def pop(self, timeout_s: float | None = None) -> T | None:
        """The next idle peer's oldest item, its peer now busy; None once closed, or if
        none came within ``timeout_s``."""
        with self._ready:
            if not self._ready.wait_for(
                lambda: self._closed or self._idle() is not None, timeout_s
            ):
                return None
            peer = self._idle()
            if self._closed or peer is None:
                return None
            items = self._peers.pop(peer)
            item = items.popleft()
            self._size -= 1
            self._busy.add(peer)
            if items:  # back of the line: its next item waits for every other peer's
                self._peers[peer] = items
            return item

    def done(self, peer: bytes) -> None:
        """The item taken for ``peer`` is finished: its next one may be handed out."""
        with self._ready:
            self._busy.discard(peer)
            if peer in self._peers:
                self._ready.notify()

    def _idle(self) -> bytes | None:
        return next((peer for peer in self._peers if peer not in self._busy), None)

    def close(self) -> list[T]:
        """Stop handing out items; return the ones still queued (oldest peer first)."""
        with self._ready:
            self._closed = True
            left = [item for items in self._peers.values() for item in items]
            self._peers.clear()
            self._busy.clear()
            self._size = 0
            self._ready.notify_all()
            return left
