"""RecordArena: one thread's reusable ring buffer for the page records of its PUT requests.

A PUT sends each page as a record (header + payload, ``page_format``). Built
as a fresh ``bytes`` per page, every megabyte of a put is new memory that the
kernel must fault in and zero, which on a loaded machine cost the client more
than the daemon's whole commit. The arena builds records into one buffer that
the thread keeps, as a ring: each request's records are a region (``seal``),
and a region's bytes are reused once its request was answered (``release``)
and every region before it too. A put larger than the buffer is built request
by request as replies free room (the caller asks ``fits`` first), so a batch
of any size is built in the same ``max_bytes``.

Reuse is safe only once ZeroMQ no longer reads a region: once the request that
referenced it has been answered (the daemon replies only to a request it
received whole). After an exchange with any request unanswered, ``discard``
drops the buffer (ZeroMQ may still be sending from it) and the next batch
starts a new one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from storage_backends.page_format import HEADER_BYTES, build_runs_header

# The buffer one thread keeps between batches (so 8 I/O threads keep at most 128 MiB);
# a record larger than it is built on its own.
ARENA_BYTES = 16 << 20


class _Extent:
    """A record's bytes in the buffer, and whether its request was answered."""

    __slots__ = ("end", "region", "released", "start")

    def __init__(self, start: int, end: int, region: int) -> None:
        self.start = start
        self.end = end
        self.region = region
        self.released = False


class RecordArena:
    """Builds page records into a ring buffer reused from request to request.

    Not thread-safe: one per thread. ``start`` begins a batch (every record of
    the last one done with: its requests answered, or ``discard`` called), and
    grows the buffer up to ``max_bytes``. ``encode_runs`` builds a record where
    the ring has room (else a ``bytes`` of its own), ``seal`` closes the records
    built since the last seal into a region (one request's), ``release`` frees a
    region once its request was answered; ``fits`` says whether records of given
    sizes would find room now. Records returned stay valid until their region is
    released (or the next ``start``). ValueError for a negative ``max_bytes``.
    """

    def __init__(self, max_bytes: int = ARENA_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self._max_bytes = max_bytes
        self._buf = bytearray()
        self._head = 0  # where the next record goes (when something is live)
        self._live: deque[_Extent] = deque()  # oldest first
        self._region = 0  # the region records built now belong to
        self.fresh = 0  # records built on their own (no room in the ring), so far

    @property
    def capacity(self) -> int:
        """Bytes of the buffer kept now (0 after ``discard``)."""
        return len(self._buf)

    def start(self, nbytes: int) -> None:
        """Begin a batch of records adding up to ``nbytes`` (grows the buffer up to the cap)."""
        want = min(nbytes, self._max_bytes)
        if want > len(self._buf):
            self._buf = bytearray(want)
        self._live.clear()
        self._head = 0

    def discard(self) -> None:
        """Forget the buffer: requests that may still be sent from it keep it alive."""
        self._buf = bytearray()
        self._live.clear()
        self._head = 0

    def _place(self, size: int, head: int, tail: int | None) -> int | None:
        """Where a record of ``size`` bytes goes with the next free byte at ``head`` and
        the oldest live record at ``tail`` (None: nothing live); None: no room now."""
        cap = len(self._buf)
        if tail is None:
            return 0 if size <= cap else None
        if head > tail:  # free: [head, cap), then [0, tail)
            if head + size <= cap:
                return head
            return 0 if size <= tail else None
        return head if head + size <= tail else None  # free: [head, tail); equal: full

    def fits(self, sizes: Sequence[int]) -> bool:
        """Whether records of ``sizes`` bytes, built now one after another, would all
        find room in the ring. Mutates nothing."""
        head, tail = self._head, self._live[0].start if self._live else None
        for size in sizes:
            at = self._place(size, head, tail)
            if at is None:
                return False
            tail = at if tail is None else tail
            head = at + size
        return True

    def encode(self, key: bytes, payload: memoryview) -> memoryview | bytes:
        """The record of ``payload`` under ``key`` (see ``encode_runs``)."""
        return self.encode_runs(key, (payload,))

    def encode_runs(self, key: bytes, runs: Sequence[memoryview]) -> memoryview | bytes:
        """The record of the page that is ``runs`` (flat byte views) concatenated in order,
        under ``key``: a read-only view into the ring where it has room, else a ``bytes``
        of its own. Each run is read twice (hashed, copied), never gathered first."""
        header = build_runs_header(key, runs)
        size = HEADER_BYTES + sum(len(run) for run in runs)
        at = self._place(size, self._head, self._live[0].start if self._live else None)
        if at is None:
            self.fresh += 1
            return b"".join((header, *runs))
        self._live.append(_Extent(at, at + size, self._region))
        self._head = at + size
        record = memoryview(self._buf)[at : at + size]
        record[:HEADER_BYTES] = header
        offset = HEADER_BYTES
        for run in runs:
            record[offset : offset + len(run)] = run
            offset += len(run)
        return record.toreadonly()

    def seal(self) -> int:
        """Close the region of the records built since the last seal; its token."""
        region, self._region = self._region, self._region + 1
        return region

    def release(self, region: int) -> None:
        """The request of ``region`` was answered: its bytes are reused once every region
        sealed before it is released too (unknown regions are ignored)."""
        for extent in self._live:
            if extent.region == region:
                extent.released = True
        while self._live and self._live[0].released:
            self._live.popleft()
        if not self._live:
            self._head = 0
