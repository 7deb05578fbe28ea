"""One DEALER connection to the cache daemon: pipelined requests, replies matched by id.

A ``Channel`` is used by one thread at a time (zmq sockets are not
thread-safe); ``RemoteBackend`` keeps one per calling thread.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import zmq

from storage_backends.remote.protocol import (
    MAX_ID,
    ErrorReply,
    GetReply,
    Op,
    ProtocolError,
    Reply,
    Request,
    decode_reply,
    encode_request,
)
from storage_backends.remote.shm_lease import ClientLease

logger = logging.getLogger(__name__)

# Transport-level reconnects back off from 50 ms to 2 s while the daemon is away.
RECONNECT_IVL_MS = 50
RECONNECT_IVL_MAX_MS = 2000
# Requests of one exchange in flight at once (each carries at most about 1 MiB).
WINDOW = 64


@dataclass(frozen=True)
class CurveKeys:
    """Z85 keys of this client (public, secret) and of the daemon (public)."""

    public: bytes
    secret: bytes
    server: bytes


OnReply = Callable[[int, Reply], None]  # (position of the request, its reply)
# (position, must) -> the request to send there, built now; None: not yet (room for its
# bytes comes with a reply), never when ``must`` (nothing is in flight).
Prepare = Callable[[int, bool], Request | None]


class Outcome(NamedTuple):
    """Replies of one exchange, in request order (None: no usable reply in time).

    ``timed_out`` counts requests unanswered by the deadline, ``bad`` replies
    that broke the protocol.
    """

    replies: list[Reply | None]
    timed_out: int
    bad: int


class Channel:
    """A DEALER socket plus the ids of its requests in flight.

    ``exchange`` keeps up to ``WINDOW`` requests in flight and collects replies
    until the deadline; a request still unanswered then is given up, and the socket is
    replaced so that a late reply can never be taken for a later request's.
    Raises nothing but ``zmq.ZMQError`` from the socket itself.
    """

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        curve: CurveKeys | None,
        max_frame_bytes: int,
    ):
        self._ctx = ctx
        self._endpoint = endpoint
        self._curve = curve
        self._max_frame_bytes = max_frame_bytes
        self._next_id = 0
        self.reconnects = 0
        self.lease: ClientLease | None = None  # this thread's shared-memory lease, if any
        self._sock = self._connect()

    def _connect(self) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # Queue messages only on completed connections: with the daemon down a send
        # waits (bounded) instead of piling requests up for whoever connects later.
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
        # A peer sending a frame larger than any valid reply is disconnected (the
        # request then times out) instead of making this process buffer it.
        sock.setsockopt(zmq.MAXMSGSIZE, self._max_frame_bytes)
        if self._curve is not None:
            sock.curve_publickey = self._curve.public
            sock.curve_secretkey = self._curve.secret
            sock.curve_serverkey = self._curve.server
        sock.connect(self._endpoint)
        return sock

    def reset(self) -> None:
        """Drop the socket (and whatever it still queues) and connect a new one."""
        self._sock.close(linger=0)
        self._sock = self._connect()
        self.reconnects += 1

    def close(self) -> None:
        self._sock.close(linger=0)

    def exchange(
        self,
        op: Op,
        requests: Sequence[Request],
        timeout_s: float,
        on_reply: OnReply | None = None,
        prepare: Prepare | None = None,
    ) -> Outcome:
        """Send ``requests`` (all of ``op``; their ids are assigned here) and wait for replies.

        At most ``WINDOW`` requests are in flight, so the replies the daemon queues for this
        client stay far below its per-client budget (over it, the daemon answers BUSY).
        ``on_reply(position, reply)`` runs on this thread as each reply arrives, while
        later ones are still on their way (a GET copies its pages out meanwhile); what
        it raises ends the exchange (the channel is then reset). With ``prepare``, the
        request sent at a position is ``prepare(position, must)``, built just before it
        is sent (``requests`` then only count them); when it answers None, later
        requests wait for the next reply."""
        deadline = time.monotonic() + timeout_s
        pending: dict[int, int] = {}  # request id -> position
        replies: list[Reply | None] = [None] * len(requests)
        bad = sent = 0
        while True:
            while sent < len(requests) and len(pending) < WINDOW:
                request = requests[sent] if prepare is None else prepare(sent, not pending)
                if request is None:
                    break
                rid = self._take_id()
                frames = encode_request(dataclasses.replace(request, id=rid))
                if not self._send(frames, deadline):
                    break
                pending[rid] = sent
                sent += 1
            if not pending:
                break
            before = len(pending)
            try:
                bad += self._collect(op, pending, replies, deadline, 1, on_reply)
            except BaseException:
                self.reset()  # replies to the requests still pending must not be taken later
                raise
            if len(pending) == before:  # the deadline passed
                break
        unanswered = len(requests) - sum(r is not None for r in replies) - bad
        if unanswered or bad:
            self.reset()
        return Outcome(replies, unanswered, bad)

    def post(self, request: Request, timeout_s: float) -> bool:
        """Send a request the daemon does not answer (SHM_FREE, SHM_DETACH); False if it
        could not be queued within ``timeout_s``."""
        frames = encode_request(dataclasses.replace(request, id=self._take_id()))
        return self._send(frames, time.monotonic() + timeout_s)

    def _take_id(self) -> int:
        self._next_id = (self._next_id + 1) % MAX_ID
        return self._next_id

    def _send(self, frames: list[bytes | memoryview], deadline: float) -> bool:
        """Queue one message, waiting until ``deadline`` for a connected peer."""
        while True:
            try:
                self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                return True
            except zmq.Again:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0 or not self._sock.poll(left_ms, zmq.POLLOUT):
                    return False

    def _collect(
        self,
        op: Op,
        pending: dict[int, int],
        replies: list[Reply | None],
        deadline: float,
        wanted: int,
        on_reply: OnReply | None = None,
    ) -> int:
        """Fill ``replies`` from what arrives before ``deadline`` until ``wanted`` pending
        requests are settled (or none is left); return the bad replies."""
        bad = 0
        goal = max(len(pending) - wanted, 0)
        while len(pending) > goal:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not self._sock.poll(left_ms, zmq.POLLIN):
                return bad
            frames = self._sock.recv_multipart(copy=False)
            try:
                reply: Reply = decode_reply([f.buffer for f in frames], op)
            except ProtocolError as e:
                logger.warning("bad reply from %s: %s", self._endpoint, e)
                if e.request_id in pending:
                    pending.pop(e.request_id)
                    bad += 1
                continue
            if reply.id in pending:
                position = pending.pop(reply.id)
                if on_reply is not None:
                    on_reply(position, reply)
                    reply = _consumed(reply)
                replies[position] = reply
            elif isinstance(reply, ErrorReply):  # no readable id: the request is unknown
                logger.warning("error reply without id from %s: %s", self._endpoint, reply)
        return bad


def _consumed(reply: Reply) -> Reply:
    """A reply once ``on_reply`` has seen it: a GET's without its pages (copied out by
    then), so each reply's receive buffers go back to the allocator as soon as it is done
    with, not all at the end of the exchange."""
    if isinstance(reply, GetReply) and reply.pages:
        return dataclasses.replace(reply, pages=())
    return reply
