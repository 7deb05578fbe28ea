"""What every KV event wire format provides, and the block hash they share.

A *wire format* turns the cache's own events (``hicache.events.kv``: page keys as
32-byte sha256 digests, media named ``device``/``host``/``storage``) into the
msgpack batch one peer project's routers decode with their own msgspec Structs,
and frames the replies of the replay socket the way that project's publisher
does. Formats are stateless after construction; ``encode`` and the framing
helpers are safe to call from any thread.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import msgspec

if TYPE_CHECKING:
    from hicache.events.kv import KVEvent

# The replay end-of-stream marker both peers send: sequence -1 as 8 signed
# big-endian bytes, with an empty payload.
END_SEQ: bytes = (-1).to_bytes(8, "big", signed=True)


def block_hash(page_key: bytes) -> int:
    """The int64 a router sees for ``page_key``: its first 8 bytes read as a
    signed big-endian integer.

    Page keys are sha256 digests, so any 8 of their bytes are uniformly
    distributed; the leading ones are what SGLang takes from its own sha256
    page hashes, and both peers declare block hashes as (at most) 64-bit ints.
    Two pages collide with probability ~2^-64 per pair, which a router (a
    cache of hints, not of data) can afford. Raises ValueError for a key
    shorter than 8 bytes.
    """
    if len(page_key) < 8:
        raise ValueError(f"page key of {len(page_key)} bytes; a block hash needs 8")
    return int.from_bytes(page_key[:8], "big", signed=True)


def parent_hash(page_key: bytes | None) -> int | None:
    """``block_hash`` of a parent page key, None for a chain that starts at the root."""
    return None if page_key is None else block_hash(page_key)


class WireFormat(Protocol):
    """One peer project's KV event schema and replay framing."""

    name: str

    def encode(self, ts: float, events: Sequence[KVEvent]) -> bytes:
        """The msgpack payload of one batch of ``events`` stamped ``ts`` (seconds
        since the epoch). Raises ValueError for an event it cannot express."""
        ...

    def replay_frames(self, topic: bytes, seq: bytes, payload: bytes) -> list[bytes]:
        """Frames after ``[identity, b""]`` that replay one buffered batch."""
        ...

    def replay_end(self, topic: bytes) -> list[bytes]:
        """Frames after ``[identity, b""]`` that end a replay."""
        ...


Batch = TypeVar("Batch", bound=msgspec.Struct)


class StructFormat(ABC, Generic[Batch]):
    """A WireFormat whose batches are msgspec Structs of type ``batch`` (built
    as ``batch(ts=..., events=[...])``); a subclass says how one event converts."""

    name: str

    def __init__(self, batch: type[Batch]) -> None:
        self._batch = batch
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(batch)

    @abstractmethod
    def convert(self, event: KVEvent) -> msgspec.Struct:
        """The peer's Struct for one event; ValueError for a non-event."""

    def encode(self, ts: float, events: Sequence[KVEvent]) -> bytes:
        return self._encoder.encode(self._batch(ts=ts, events=[self.convert(e) for e in events]))

    def decode(self, payload: bytes) -> Batch:
        """Inverse of ``encode``; msgspec.ValidationError/DecodeError for other bytes."""
        return self._decoder.decode(payload)

    # Replays as both peers' publishers frame them (vLLM 0.33.0, SGLang 0.5.23):
    # the live frames again, then an end marker with an empty topic.
    def replay_frames(self, topic: bytes, seq: bytes, payload: bytes) -> list[bytes]:
        return [topic, seq, payload]

    def replay_end(self, topic: bytes) -> list[bytes]:
        return [b"", END_SEQ, b""]
