"""ReplyBudget: bytes of GET replies queued in ZeroMQ for peers that have not read them yet.

A ROUTER queues replies for a peer that does not read without limit (its
high-water mark counts messages, and dropping silently would hide it), so the
daemon tracks each GET reply it hands to ZeroMQ until ZeroMQ releases its
frames (sent, or dropped with the peer) and bounds the bytes per peer and in
total. A peer out of room gets BUSY without the daemon reading a page for it.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import zmq


class _Queued(NamedTuple):
    tracker: zmq.MessageTracker
    nbytes: int


class ReplyBudget:
    """Per-peer FIFO of tracked replies. Used by the socket thread only (not thread-safe).

    ``room`` is what a new reply to ``peer`` may hold; ``add`` records a reply
    sent with ``track=True``; ``sweep`` forgets released replies of every peer
    (a peer that went away is forgotten once ZeroMQ dropped its queue).
    """

    def __init__(self, per_peer: int, total: int) -> None:
        self._per_peer = per_peer
        self._total = total
        self._peers: dict[bytes, deque[_Queued]] = {}
        self._queued: dict[bytes, int] = {}
        self._queued_total = 0

    @property
    def queued_bytes(self) -> int:
        return self._queued_total

    def room(self, peer: bytes) -> int:
        self._release(peer)
        return min(self._per_peer - self._queued.get(peer, 0), self._total - self._queued_total)

    def add(self, peer: bytes, tracker: zmq.MessageTracker, nbytes: int) -> None:
        if tracker.done:
            return
        self._peers.setdefault(peer, deque()).append(_Queued(tracker, nbytes))
        self._queued[peer] = self._queued.get(peer, 0) + nbytes
        self._queued_total += nbytes

    def sweep(self) -> None:
        for peer in list(self._peers):
            self._release(peer)

    def _release(self, peer: bytes) -> None:
        queue = self._peers.get(peer)
        if queue is None:
            return
        # Replies to one peer leave in order, so only the front can have been released.
        while queue and queue[0].tracker.done:
            released = queue.popleft().nbytes
            self._queued[peer] -= released
            self._queued_total -= released
        if not queue:
            del self._peers[peer]
            del self._queued[peer]
