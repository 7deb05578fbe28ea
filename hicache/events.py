"""KV events: every page stored in or removed from a tier, for cache-aware routers.

Published on a ZeroMQ PUB socket as ``[topic, 8-byte big-endian sequence,
msgpack batch]`` -- the framing vLLM and SGLang use -- where a batch is
``[timestamp, [event, ...], None]`` and an event is a list led by its tag:
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
namespace, medium]``, ``["BlockRemoved", block_hashes, medium]`` or
``["AllBlocksCleared"]``.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Literal, Protocol

import msgpack
import zmq

Medium = Literal["device", "host", "storage"]


@dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    namespace: str | None
    medium: Medium

    def encode(self) -> list[object]:
        return [
            "BlockStored",
            list(self.block_hashes),
            self.parent_block_hash,
            list(self.token_ids),
            self.block_size,
            self.namespace,
            self.medium,
        ]


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[bytes, ...]
    medium: Medium

    def encode(self) -> list[object]:
        return ["BlockRemoved", list(self.block_hashes), self.medium]


@dataclass(frozen=True)
class AllBlocksCleared:
    def encode(self) -> list[object]:
        return ["AllBlocksCleared"]


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def decode_event(raw: list[object]) -> KVEvent:
    """Inverse of ``encode``; ValueError for an unknown tag or shape."""
    tag = raw[0] if raw else None
    if tag == "BlockStored" and len(raw) == 7:
        _, hashes, parent, tokens, size, ns, medium = raw
        return BlockStored(tuple(hashes), parent, tuple(tokens), size, ns, medium)  # type: ignore[arg-type]
    if tag == "BlockRemoved" and len(raw) == 3:
        return BlockRemoved(tuple(raw[1]), raw[2])  # type: ignore[arg-type]
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise ValueError(f"not a KV event: {raw!r}")


def decode_batch(payload: bytes) -> list[KVEvent]:
    """The events of one published msgpack batch."""
    _ts, events, _rank = msgpack.unpackb(payload, raw=False)
    return [decode_event(e) for e in events]


class EventSink(Protocol):
    """Receives KV events from the owner thread; not thread-safe.

    ``emit`` buffers; ``flush`` publishes what is buffered (the cache flushes
    once per ``poll()``); ``close`` flushes and releases resources.
    """

    def emit(self, event: KVEvent) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class ZmqEventPublisher:
    """An EventSink that binds a publishing socket on ``endpoint`` (e.g.
    ``tcp://127.0.0.1:5557``; ``tcp://127.0.0.1:*`` picks a port, see
    ``self.endpoint``). Subscribers use a plain SUB socket.

    The socket is an XPUB so that ``wait_for_subscriber`` can see a
    subscription arrive (PUB drops whatever is sent before that).
    """

    def __init__(self, endpoint: str, topic: str = "kv-events") -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.XPUB)
        self._sock.setsockopt(zmq.LINGER, 1000)
        try:
            self._sock.bind(endpoint)
        except zmq.ZMQError as e:
            self._sock.close(0)
            self._ctx.term()
            raise ValueError(f"events.endpoint {endpoint!r}: cannot bind: {e}") from None
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._topic = topic.encode()
        self._seq = 0
        self._buffer: list[KVEvent] = []

    @property
    def sequence(self) -> int:
        """The sequence number the next batch will carry (= batches sent)."""
        return self._seq

    def wait_for_subscriber(self, timeout_s: float) -> bool:
        """Block until a subscription message arrives, or ``timeout_s`` passes."""
        if not self._sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            return False
        self._sock.recv()
        return True

    def emit(self, event: KVEvent) -> None:
        self._buffer.append(event)

    def flush(self) -> None:
        if not self._buffer:
            return
        batch = [time.time(), [e.encode() for e in self._buffer], None]
        self._buffer = []
        frames = [self._topic, struct.pack(">Q", self._seq), msgpack.packb(batch)]
        self._seq += 1
        self._sock.send_multipart(frames)

    def close(self) -> None:
        if self._sock.closed:
            return
        self.flush()
        self._sock.close()
        self._ctx.term()
