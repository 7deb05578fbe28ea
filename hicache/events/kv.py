"""KV events: every page stored in or removed from a tier, for cache-aware routers.

The cache emits the dataclasses below (page keys as 32-byte digests, media
named after hicache's tiers). A publisher encodes each batch in the wire format
that ``events.format`` names -- vLLM's or SGLang's schema, see
``hicache.events.formats`` -- and sends it on a ZeroMQ PUB socket as ``[topic,
8-byte big-endian sequence, msgpack batch]``, the framing both projects use.
With ``events.replay_endpoint`` set, a ROUTER socket serves the last
``events.replay_buffer`` batches again to a subscriber that missed some: it
sends the 8-byte big-endian sequence to start from, and gets one reply per
buffered batch from there on, then an end marker (sequence -1), framed as the
chosen project's publisher frames them.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

import zmq

if TYPE_CHECKING:
    from hicache.events.formats import WireFormat

Medium = Literal["device", "host", "storage"]
logger = logging.getLogger("hicache.events.kv")


class PublisherSettings(Protocol):
    """What a publisher is built from: ``hicache.config.cache.EventsConfig`` is one. A
    Protocol, so that events (below config in the layers) need not import config."""

    @property
    def endpoint(self) -> str: ...
    @property
    def topic(self) -> str: ...
    @property
    def format(self) -> str: ...
    @property
    def replay_endpoint(self) -> str: ...
    @property
    def replay_buffer(self) -> int: ...


@dataclass(frozen=True)
class BlockStored:
    """Pages of one chain stored in ``medium``: ``block_hashes`` are their page
    keys, ``parent_block_hash`` the key of the page before the first (None at
    the root), ``token_ids`` their tokens (``block_size`` per page)."""

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    namespace: str | None
    medium: Medium


@dataclass(frozen=True)
class BlockRemoved:
    """Pages (by page key) that ``medium`` no longer holds."""

    block_hashes: tuple[bytes, ...]
    medium: Medium


@dataclass(frozen=True)
class AllBlocksCleared:
    """Every page of the device and host tiers is gone (storage keeps its pages)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventSink(Protocol):
    """Receives KV events from the owner thread; not thread-safe.

    ``emit`` buffers; ``flush`` publishes what is buffered (the cache flushes
    once per ``poll()``); ``close`` flushes and releases resources.
    ``endpoint`` and ``replay_endpoint`` are the addresses actually bound (a
    ``*`` port resolved; "" when there is none), for subscribers to connect to.
    """

    endpoint: str
    replay_endpoint: str

    def emit(self, event: KVEvent) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class PublisherStats(NamedTuple):
    """What a publisher has done since it started."""

    batches: int  # published (= the next sequence number)
    replays: int  # replay requests answered
    replay_errors: int  # malformed replay requests and replay failures


class ReplayServer:
    """Serves recently published batches again, by sequence number, on a ROUTER
    socket that its own thread owns (the owner thread only appends to the
    bounded buffer, under a lock).

    A request is ``[identity, b"", start]`` (what a REQ or an enveloped DEALER
    sends) with ``start`` 8 big-endian bytes; the reply is every buffered
    batch with a sequence >= ``start``, oldest first, then the end marker
    (several messages to one request, as vLLM's and SGLang's publishers send
    them: a DEALER client reads them all, a REQ socket only the first). A
    malformed request is logged, counted and answered with the end marker
    alone; a failure never ends the thread.
    """

    POLL_MS = 100

    def __init__(
        self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, wire: WireFormat, topic: bytes
    ) -> None:
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(endpoint)
        except zmq.ZMQError as e:
            self._sock.close(0)
            raise ValueError(f"events.replay_endpoint {endpoint!r}: cannot bind: {e}") from None
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._wire, self._topic = wire, topic
        self._buffer: deque[tuple[int, bytes]] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.replays = 0
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name="hicache-kv-replay", daemon=True)

    def start(self, capacity: int) -> None:
        self._buffer = deque(maxlen=capacity)
        self._thread.start()

    def record(self, seq: int, payload: bytes) -> None:
        """Keep batch ``seq`` for replay (the oldest goes when the buffer is full)."""
        with self._lock:
            self._buffer.append((seq, payload))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._sock.poll(self.POLL_MS, zmq.POLLIN):
                    self._serve(self._sock.recv_multipart())
            except Exception:  # a replay must never take the thread down
                logger.exception("KV event replay failed")
                self.errors += 1
        self._sock.close(0)

    def _serve(self, frames: list[bytes]) -> None:
        ident = frames[0]
        if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
            logger.warning("malformed KV event replay request: %d frames", len(frames))
            self.errors += 1
        else:
            start = int.from_bytes(frames[2], "big")
            with self._lock:
                batches = [(s, p) for s, p in self._buffer if s >= start]
            for seq, payload in batches:
                body = self._wire.replay_frames(self._topic, struct.pack(">Q", seq), payload)
                self._sock.send_multipart([ident, b"", *body])
            self.replays += 1
        self._sock.send_multipart([ident, b"", *self._wire.replay_end(self._topic)])

    def close(self, timeout_s: float = 5.0) -> bool:
        """Stop the thread (it closes the socket); False if it did not stop in time."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()


class ZmqEventPublisher:
    """An EventSink that binds a publishing socket on ``endpoint`` (e.g.
    ``tcp://127.0.0.1:5557``; ``tcp://127.0.0.1:*`` picks a port, see
    ``self.endpoint``) and encodes batches in ``wire`` (vLLM's schema when
    None). Subscribers use a plain SUB socket. With ``replay_endpoint``, a
    ``ReplayServer`` keeps the last ``replay_buffer`` batches (see
    ``self.replay_endpoint``).

    The socket is an XPUB so that ``wait_for_subscriber`` can see a
    subscription arrive (PUB drops whatever is sent before that). Not
    thread-safe: the owner thread emits, flushes and closes. Raises ValueError
    when a socket cannot bind or ``replay_buffer`` < 1.
    """

    def __init__(
        self,
        endpoint: str,
        topic: str = "kv-events",
        wire: WireFormat | None = None,
        replay_endpoint: str = "",
        replay_buffer: int = 10_000,
    ) -> None:
        if replay_buffer < 1:
            raise ValueError(f"events.replay_buffer must be >= 1, got {replay_buffer}")
        if wire is None:
            from hicache.events.formats import create_format

            wire = create_format("vllm", "")
        self._wire = wire
        self._topic = topic.encode()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._replay: ReplayServer | None = None
        try:
            self._sock = self._bind_pub(endpoint)
            if replay_endpoint:
                self._replay = ReplayServer(self._ctx, replay_endpoint, wire, self._topic)
        except ValueError:
            self._ctx.destroy(linger=0)
            raise
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = self._replay.endpoint if self._replay else ""
        if self._replay is not None:
            self._replay.start(replay_buffer)
        replay = f", replays on {self.replay_endpoint}" if self.replay_endpoint else ""
        logger.info(
            "KV events: publishing on %s (topic %r, %s format)%s",
            self.endpoint, topic, wire.name, replay,
        )  # fmt: skip
        self._seq = 0
        self._buffer: list[KVEvent] = []

    @classmethod
    def from_config(cls, config: PublisherSettings, storage_backend: str) -> ZmqEventPublisher:
        """The publisher ``config`` describes (its ``endpoint`` must be set);
        ``storage_backend`` names the storage tier's backend for the format."""
        from hicache.events.formats import create_format

        wire = create_format(config.format, storage_backend)
        return cls(
            config.endpoint, config.topic, wire, config.replay_endpoint, config.replay_buffer
        )

    def _bind_pub(self, endpoint: str) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(zmq.XPUB)
        sock.setsockopt(zmq.LINGER, 1000)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as e:
            sock.close(0)
            raise ValueError(f"events.endpoint {endpoint!r}: cannot bind: {e}") from None
        return sock

    @property
    def format(self) -> str:
        """The wire format's name (``vllm`` or ``sglang``)."""
        return self._wire.name

    @property
    def sequence(self) -> int:
        """The sequence number the next batch will carry (= batches sent)."""
        return self._seq

    def stats(self) -> PublisherStats:
        replay = self._replay
        return PublisherStats(
            self._seq, replay.replays if replay else 0, replay.errors if replay else 0
        )

    def wait_for_subscriber(self, timeout_s: float) -> bool:
        """Block until a subscription message arrives, or ``timeout_s`` passes."""
        if not self._sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            return False
        self._sock.recv()
        return True

    def emit(self, event: KVEvent) -> None:
        self._buffer.append(event)

    def flush(self) -> None:
        """Encode and publish the buffered events as one batch (none: no batch)."""
        if not self._buffer:
            return
        payload = self._wire.encode(time.time(), self._buffer)
        self._buffer = []
        self._sock.send_multipart([self._topic, struct.pack(">Q", self._seq), payload])
        if self._replay is not None:
            self._replay.record(self._seq, payload)
        self._seq += 1

    def close(self) -> None:
        """Flush, stop the replay thread and release the sockets (idempotent)."""
        if self._sock.closed:
            return
        self.flush()
        self._sock.close()
        if self._replay is not None and not self._replay.close():
            logger.warning("KV event replay thread did not stop; leaving its context open")
            return
        self._ctx.term()
