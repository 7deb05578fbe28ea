"""ReplyBudget: bytes of GET replies queued in ZeroMQ for peers that have not read them yet.

A ROUTER queues replies for a peer that does not read without limit (its
high-water mark counts messages, and dropping silently would hide it), so the
daemon tracks each GET reply it hands to ZeroMQ until ZeroMQ releases its
frames (sent, or dropped with the peer) and bounds the bytes per peer and in
total, counting the pages reader threads hold for replies not yet sent. A peer
out of room gets BUSY without the daemon reading a page for it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import zmq

from storage_backends.remote.protocol import Frame

logger = logging.getLogger(__name__)


class Tracker(Protocol):
    """Whether ZeroMQ is done with a sent reply's frames."""

    @property
    def done(self) -> bool: ...


class Released(NamedTuple):
    """A sent reply, done once ZeroMQ released every one of its page frames."""

    trackers: tuple[zmq.MessageTracker, ...]  # one per page

    @property
    def done(self) -> bool:
        return all(tracker.done for tracker in self.trackers)


def send_reply(
    sock: zmq.Socket[bytes], identity: zmq.Frame | bytes, frames: Sequence[Frame], track: bool
) -> Released | None:
    """Send one reply (``frames``: header, then pages) to ``identity`` on a ROUTER, large
    frames without a copy. With ``track``: done once ZeroMQ released every page (those it
    copied at once), returned whether or not the send went through; None without. A
    failed send is logged, not raised.

    Each page is tracked on its own: ``send_multipart(track=True)`` returns the last
    frame's tracker only, which is done at once when that frame is small enough to be
    copied, while ZeroMQ may still be sending the pages before it (from buffers a reuse
    would overwrite). The frames are sent one by one as ``send_multipart`` sends them."""
    trackers: list[zmq.MessageTracker] = []
    try:
        sock.send(identity, zmq.SNDMORE, copy=False)
        sock.send(frames[0], zmq.SNDMORE if len(frames) > 1 else 0, copy=False)
        last = len(frames) - 1
        for i in range(1, len(frames)):
            flags = zmq.SNDMORE if i < last else 0
            sent = sock.send(frames[i], flags, copy=False, track=track)
            if track:
                trackers.append(sent)
    except zmq.ZMQError as exc:
        logger.debug("reply not sent: %s", exc)
    except Exception:  # a bug must not end the caller's loop (the client then times out)
        logger.exception("reply not sent")
    return Released(tuple(trackers)) if track else None


class _Queued(NamedTuple):
    tracker: Tracker
    nbytes: int
    buffers: Sequence[memoryview]  # handed to ``on_release`` once ZeroMQ is done


def _keep(_buffers: Sequence[memoryview]) -> None:
    """The default ``on_release``: the buffers are nobody's to give back."""


class ReplyBudget:
    """Per-peer FIFO of tracked replies, plus bytes claimed by replies still being read.

    ``room`` is what a new reply to ``peer`` may hold; a reader ``claim``s the
    bytes of the pages it read before they become a reply (so readers running
    at once for one peer never together exceed its room); ``add`` turns a
    claim into a reply ``send_reply`` tracks; ``unclaim`` gives a claim
    back (reply not sent, or sent without pages); ``sweep`` forgets released
    replies of every peer (a peer that went away is forgotten once ZeroMQ
    dropped its queue), handing each released reply's ``buffers`` to
    ``on_release`` (called under the budget's lock: it must not call back).
    Thread-safe (one lock).
    """

    def __init__(
        self,
        per_peer: int,
        total: int,
        on_release: Callable[[Sequence[memoryview]], None] = _keep,
    ) -> None:
        self._on_release = on_release
        self._per_peer = per_peer
        self._total = total
        self._peers: dict[bytes, deque[_Queued]] = {}
        self._held: dict[bytes, int] = {}  # queued + claimed, per peer
        self._held_total = 0
        self._lock = threading.Lock()

    @property
    def queued_bytes(self) -> int:
        """Bytes held: replies queued in ZeroMQ and claims of replies being read."""
        return self._held_total

    def room(self, peer: bytes) -> int:
        with self._lock:
            self._release(peer)
            return self._room(peer)

    def _room(self, peer: bytes) -> int:
        return min(self._per_peer - self._held.get(peer, 0), self._total - self._held_total)

    def claim(self, peer: bytes, sizes: Sequence[int]) -> int:
        """Claim the longest run of leading ``sizes`` that fits; return how many."""
        with self._lock:
            self._release(peer)
            room, used, count = self._room(peer), 0, 0
            for size in sizes:
                if used + size > room:
                    break
                used += size
                count += 1
            self._hold(peer, used)
            return count

    def unclaim(self, peer: bytes, nbytes: int) -> None:
        with self._lock:
            self._hold(peer, -nbytes)

    def add(
        self,
        peer: bytes,
        tracker: Tracker,
        claimed: int,
        buffers: Sequence[memoryview] = (),
    ) -> None:
        """Track a sent reply whose ``claimed`` bytes stay held, and whose ``buffers`` are
        given to ``on_release``, once ZeroMQ releases it."""
        with self._lock:
            if tracker.done:
                self._hold(peer, -claimed)
                self._on_release(buffers)
                return
            self._peers.setdefault(peer, deque()).append(_Queued(tracker, claimed, buffers))

    def sweep(self) -> None:
        with self._lock:
            for peer in list(self._peers):
                self._release(peer)

    def _hold(self, peer: bytes, nbytes: int) -> None:
        held = self._held.get(peer, 0) + nbytes
        self._held_total += nbytes
        if held:
            self._held[peer] = held
        else:
            self._held.pop(peer, None)

    def _release(self, peer: bytes) -> None:
        queue = self._peers.get(peer)
        if queue is None:
            return
        # Replies to one peer leave in order, so only the front can have been released.
        while queue and queue[0].tracker.done:
            released = queue.popleft()
            self._hold(peer, -released.nbytes)
            self._on_release(released.buffers)
        if not queue:
            del self._peers[peer]
