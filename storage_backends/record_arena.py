"""RecordArena: one thread's reusable buffer for the page records of its PUT requests.

A PUT sends each page as a record (header + payload, ``page_format``). Built
as a fresh ``bytes`` per page, every megabyte of a put is new memory that the
kernel must fault in and zero, which on a loaded machine cost the client more
than the daemon's whole commit. The arena builds the records of one batch into
one buffer that the next batch of the same thread reuses.

Reuse is safe only once ZeroMQ no longer reads the buffer: once every request
that referenced it has been answered (the daemon replies only to a request it
received whole). After an exchange with any request unanswered, ``discard``
drops the buffer (ZeroMQ may still be sending from it) and the next batch
starts a new one.
"""

from __future__ import annotations

from collections.abc import Sequence

from storage_backends.page_format import HEADER_BYTES, build_runs_header

# The buffer one thread keeps between batches (so 8 I/O threads keep at most 128 MiB);
# records beyond it are built one by one.
ARENA_BYTES = 16 << 20


class RecordArena:
    """Builds page records into a buffer reused from batch to batch.

    Not thread-safe: one per thread. ``start`` begins a batch and reuses the
    buffer of the previous one, so a caller calls it only after every request
    of that batch was answered, and ``discard`` otherwise. Records returned by
    ``encode`` stay valid until the next ``start``.
    """

    def __init__(self, max_bytes: int = ARENA_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self._max_bytes = max_bytes
        self._buf = bytearray()
        self._used = 0

    @property
    def capacity(self) -> int:
        """Bytes of the buffer kept now (0 after ``discard``)."""
        return len(self._buf)

    def start(self, nbytes: int) -> None:
        """Begin a batch of records adding up to ``nbytes`` (grows the buffer up to the cap)."""
        want = min(nbytes, self._max_bytes)
        if want > len(self._buf):
            self._buf = bytearray(want)
        self._used = 0

    def discard(self) -> None:
        """Forget the buffer: requests that may still be sent from it keep it alive."""
        self._buf = bytearray()
        self._used = 0

    def encode(self, key: bytes, payload: memoryview) -> memoryview | bytes:
        """The record of ``payload`` under ``key``: a view into the buffer while it has room,
        else a ``bytes`` of its own (``payload`` is a flat byte view)."""
        return self.encode_runs(key, (payload,))

    def encode_runs(self, key: bytes, runs: Sequence[memoryview]) -> memoryview | bytes:
        """The record of the page that is ``runs`` (flat byte views) concatenated in order,
        under ``key``: a view into the buffer while it has room, else a ``bytes`` of its
        own. Each run is read twice (hashed, copied), never gathered into a page first."""
        header = build_runs_header(key, runs)
        size = HEADER_BYTES + sum(len(run) for run in runs)
        if self._used + size > len(self._buf):
            return b"".join((header, *runs))
        record = memoryview(self._buf)[self._used : self._used + size]
        record[:HEADER_BYTES] = header
        offset = HEADER_BYTES
        for run in runs:
            record[offset : offset + len(run)] = run
            offset += len(run)
        self._used += size
        return record.toreadonly()
