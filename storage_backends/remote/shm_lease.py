"""ClientLease: one thread's lease on the cache daemon's shared-memory slab (``storage.shm``).

The daemon answers SHM_ATTACH with the slab's path and size, a lease id and the
lease's put area; the client maps the slab, writes its PUT records into the put
area (like ``RecordArena``: reused once every request of the last batch was
answered) and reads GET records out of the slots the daemon names, then frees
them (SHM_FREE). The daemon reclaims a lease silent for ``expires_s``, so the
client writes into its area only while the lease was confirmed alive within
half of that, and renews it otherwise.

Reads never trust the slab: the record's header is read once, the payload copied
into the caller's runs and its checksum computed over what was copied, so a slot
the daemon reused under a slow reader is a miss, never a wrong byte (the runs of
such a miss may be partly written, as ``StorageBackend.get`` allows).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence

from storage_backends.page_format import (
    HEADER_BYTES,
    Verdict,
    build_runs_header,
    check_header,
    parse_header,
    runs_checksum,
)
from storage_backends.remote.protocol import ShmAttachReply, Span
from storage_backends.scatter import Runs, scatter, total


class ClientLease:
    """A mapped slab plus the lease's id and put area. Not thread-safe: one per thread.

    Construction raises OSError if the slab cannot be mapped (another host, another
    user, a daemon gone) and ValueError if it is not the size the daemon reported.
    """

    def __init__(self, grant: ShmAttachReply, now: float) -> None:
        fd = os.open(grant.path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            size = os.fstat(fd).st_size
            if size != grant.size or grant.put.offset + grant.put.length > size:
                raise ValueError(f"slab {grant.path} has {size} bytes, not {grant.size}")
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._view = memoryview(self._map)
        self.id = grant.lease
        self.expires_s = grant.expires_s
        self._area = grant.put
        self._used = 0
        self.confirmed = now  # when a request of this lease last reached a live daemon

    @property
    def area_bytes(self) -> int:
        """The size of the lease's put area (0: none)."""
        return self._area.length

    def fresh(self, now: float) -> bool:
        """Whether the daemon surely still holds the lease (confirmed within half its life)."""
        return now - self.confirmed < self.expires_s / 2

    def renewed(self, now: float) -> None:
        self.confirmed = now

    def start(self) -> None:
        """Begin a batch of PUT records at the start of the put area (every request of the
        previous batch was answered, so the daemon no longer reads it)."""
        self._used = 0

    def encode(self, keys: Sequence[bytes], payloads: Sequence[memoryview]) -> tuple[Span, ...]:
        """Write the records of one request into the put area; () when they do not all fit
        (nothing is taken then)."""
        return self.encode_runs(keys, [[payload] for payload in payloads])

    def encode_runs(self, keys: Sequence[bytes], pages: Sequence[Runs]) -> tuple[Span, ...]:
        """``encode`` of pages that are each several runs (flat byte views), concatenated
        in order: each record built straight from its runs, never from a gathered page."""
        sizes = [total(runs) for runs in pages]
        if self._used + sum(HEADER_BYTES + size for size in sizes) > self._area.length:
            return ()
        spans: list[Span] = []
        for key, runs, size in zip(keys, pages, sizes, strict=True):
            offset = self._area.offset + self._used
            self._view[offset : offset + HEADER_BYTES] = build_runs_header(key, runs)
            at = offset + HEADER_BYTES
            for run in runs:
                self._view[at : at + len(run)] = run
                at += len(run)
            self._used += HEADER_BYTES + size
            spans.append(Span(offset, HEADER_BYTES + size))
        return tuple(spans)

    def read(self, span: Span, key: bytes, runs: Runs) -> bool:
        """Copy the record at ``span`` into ``runs`` if it is ``key``'s, intact and of their
        length; False (a miss) otherwise."""
        end = span.offset + span.length
        if end > len(self._view) or span.length < HEADER_BYTES:
            return False
        header = bytes(self._view[span.offset : span.offset + HEADER_BYTES])
        if check_header(header, key, span.length - HEADER_BYTES, total(runs)) is not Verdict.OK:
            return False
        scatter(self._view[span.offset + HEADER_BYTES : end], runs)
        parsed = parse_header(header)
        assert parsed is not None  # check_header passed
        return runs_checksum(runs) == parsed.checksum
