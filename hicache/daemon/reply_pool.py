"""ReplyPool: buffers that GET replies read from the store land in, reused once sent.

A GET that misses the memory tier is read from the store straight into a
buffer of the pool, and that buffer is the reply's frame (sent without a
copy). ZeroMQ reads it until the reply has gone (or was dropped with its
peer); the reply budget tracks that (``replies``) and gives the buffer back
then, so the next read writes into memory already faulted in instead of new,
zeroed memory. What the pool keeps free is bounded; buffers out with replies
are bounded by the reply budget.

Each buffer starts ``HEADER_BYTES`` before a 64-byte boundary, so the payload of
the record read into it starts on one, as the disk store lays payloads out in
its files (``layout.RECORD_LEAD``): the kernel's copy from the page cache into a
buffer runs several times faster when the two line up (measured here, a 2 MiB
``preadv`` from cached file pages into cold buffers: 0.06 s/GiB of CPU aligned,
0.33 at 8 bytes off, which is where a plain ``bytearray`` put the payload).

Debug mode (``HICACHE_DAEMON_POISON=1`` in the daemon's environment; tests use
it): every buffer given back is filled with ``POISON`` at once, so a buffer given
back while ZeroMQ still sends it shows as poison in a client's reply, and a free
buffer found changed when it is lent again (something wrote it after giving it
back) is counted in ``PoolSize.tampered`` and logged.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from storage_backends.page_format import HEADER_BYTES

logger = logging.getLogger(__name__)

# Free buffers kept for reuse, all sizes together; more are let go.
KEEP_BYTES = 64 << 20
POISON_ENV = "HICACHE_DAEMON_POISON"
# 16 bytes no page record holds by chance (a record's bytes are a header and a payload).
POISON = b"\xdeHICACHE-POISON\xad"
# Buffers start at this offset from a multiple of ALIGN: a record's payload then starts on one.
ALIGN = 64
LEAD = -HEADER_BYTES % ALIGN


def poison_from(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` turns the debug poison on (``HICACHE_DAEMON_POISON`` set, not 0)."""
    return environ.get(POISON_ENV, "0") not in ("", "0")


def poison_on() -> bool:
    """``poison_from`` this process's environment."""
    return poison_from(os.environ)


class PoolSize(NamedTuple):
    """What the pool holds: buffers lent out (with replies) and kept free."""

    lent: int
    free_bytes: int
    tampered: int = 0  # free buffers found written before they were lent again (poison on)


class ReplyPool:
    """The daemon's ``store.ReplyBuffers``: ``take`` lends a buffer of exactly the size
    asked, reused when one of that size is free; ``give_back`` returns one (a read that
    missed, or a reply ZeroMQ is done with); ``lent_out`` tells which frames of a reply
    are the pool's.

    Thread-safe (one lock): readers take and give back, the socket thread gives
    back what sent replies held. Giving back a buffer the pool did not lend, or
    twice, is ignored. A buffer is written again only after it was given back,
    so a caller gives back only what nothing reads any more. With ``poison``, each
    buffer given back is overwritten with ``POISON`` (and checked when lent again).
    """

    def __init__(self, keep_bytes: int = KEEP_BYTES, poison: bool = False) -> None:
        if keep_bytes < 0:
            raise ValueError(f"keep_bytes must be >= 0, got {keep_bytes}")
        self._keep_bytes = keep_bytes
        self._poison = poison
        self._tampered = 0
        self._free: dict[int, list[bytearray]] = {}  # by the size lent
        self._free_bytes = 0  # sizes lent, not counting each buffer's < ALIGN of slack
        self._lent: dict[int, bytearray] = {}  # id(buffer) -> buffer
        self._starts: dict[int, int] = {}  # id(buffer) -> where its lent view starts
        self._lock = threading.Lock()

    def take(self, size: int) -> memoryview:
        """A view of ``size`` bytes starting ``LEAD`` bytes past a multiple of ``ALIGN``."""
        with self._lock:
            free = self._free.get(size)
            if free:
                buffer = free.pop()
                self._free_bytes -= size
                if self._poison and buffer != _poison(len(buffer)):
                    self._tampered += 1
                    logger.error(
                        "a free reply buffer of %d bytes was written after it came back", size
                    )
            else:
                buffer = bytearray(size + ALIGN - 1)
                self._starts[id(buffer)] = (LEAD - _address(buffer)) % ALIGN
            self._lent[id(buffer)] = buffer
            start = self._starts[id(buffer)]
        return memoryview(buffer)[start : start + size]

    def give_back(self, buffer: memoryview) -> None:
        self.give_back_all((buffer,))

    def give_back_all(self, buffers: Iterable[memoryview]) -> None:
        with self._lock:
            for view in buffers:
                owner = self._lent.pop(id(view.obj), None)
                if owner is None or owner is not view.obj:
                    continue
                if self._poison:
                    owner[:] = _poison(len(owner))
                size = len(owner) - (ALIGN - 1)
                if self._free_bytes + size <= self._keep_bytes:
                    self._free.setdefault(size, []).append(owner)
                    self._free_bytes += size
                else:
                    del self._starts[id(owner)]

    def lent_out(self, frames: Iterable[object]) -> list[memoryview]:
        """The frames among ``frames`` that are buffers this pool lent."""
        with self._lock:
            return [
                frame
                for frame in frames
                if isinstance(frame, memoryview) and self._lent.get(id(frame.obj)) is frame.obj
            ]

    def size(self) -> PoolSize:
        with self._lock:
            return PoolSize(len(self._lent), self._free_bytes, self._tampered)


def _address(buffer: bytearray) -> int:
    """Where ``buffer``'s bytes are in memory (they never move: a pool buffer is never
    resized)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def _poison(size: int) -> bytes:
    return (POISON * (size // len(POISON) + 1))[:size]
