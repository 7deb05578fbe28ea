"""The StorageBackend protocol and its result type, StorageStats."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class StorageStats:
    """A snapshot of one backend's size and counters.

    ``entries``/``bytes_used`` describe the store; the counters are totals since
    this backend object was created (in this process). ``bytes_used`` counts
    stored bytes including page headers. ``corrupt`` counts stored pages found
    damaged (bad checksum or header) and deleted. ``errors`` counts backend
    calls that failed and were reported as misses or failed puts;
    ``quarantined`` counts whole stores found damaged, moved aside and
    started empty.
    """

    entries: int
    bytes_used: int
    capacity_bytes: int
    hits: int
    misses: int
    puts: int
    put_failures: int
    evictions: int
    corrupt: int
    deletes: int
    errors: int = 0
    quarantined: int = 0

    def as_dict(self) -> dict[str, int]:
        """The snapshot as a JSON-ready dict."""
        return asdict(self)


@runtime_checkable
class StorageBackend(Protocol):
    """A batch-only key → page store outside the process.

    Keys are 32-byte sha256 page keys (``bytes``); values are whole pages.
    Every page is stored with a header (``storage_backends.page_format``) and
    checked on every read: a damaged page is deleted, counted in
    ``StorageStats.corrupt`` and reported as a miss.

    Thread-safety: every method may be called concurrently from several I/O
    worker threads, except ``close()``, which must be called once no other call
    is in flight.

    Errors: a miss is never an exception. Methods raise ``StorageClosedError``
    after ``close()`` and ``ValueError`` for malformed arguments (a key that is
    not 32 bytes, ``keys`` and buffers of different lengths, a read-only
    ``dst``). Backend failures while writing (disk or map full) are reported as
    ``False`` entries of ``put`` and counted in ``put_failures``.
    """

    def exists(self, keys: Sequence[bytes]) -> int:
        """Return how many leading keys are present, stopping at the first miss.

        Mutates nothing (recency is not updated).
        """
        ...

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        """Return, per key, whether it is present (one answer for the whole batch).

        The membership test of ``exists`` without stopping at a miss, for callers
        that probe keys past a gap. Same as ``exists``: a present page may still
        turn out damaged on ``get``; mutates nothing (recency is not updated);
        thread-safe like every method; raises only as ``exists`` does.
        """
        ...

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        """Copy the page of each key into the caller-owned buffer ``dst[i]``.

        Returns per-key hits. A ``dst[i]`` whose length differs from the stored
        payload is a miss. Every hit's bytes were verified (key and checksum).
        A miss for an absent key leaves ``dst[i]`` untouched; a miss for a page
        found damaged may leave it partly written (a backend that reads straight
        into the caller's buffer, ``disk``, verifies after the read): a miss's
        buffer is never to be used. Updates recency of hit pages, deletes
        damaged pages and updates the hit/miss/corrupt counters.
        """
        ...

    def take_removed(self) -> list[bytes]:
        """Keys this backend object removed since the last call: evicted for
        capacity, deleted, or dropped as damaged (not other processes'
        removals). Thread-safe; lets the cache announce storage removals."""
        ...

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        """Store ``src[i]`` under ``keys[i]``; return per-key success.

        Keys already present are skipped and reported as ``True``. May evict
        least-recently-used pages to stay within capacity. ``src`` is not
        mutated and may be reused as soon as this returns.
        """
        ...

    def delete(self, keys: Sequence[bytes]) -> int:
        """Remove the given keys; return how many were present."""
        ...

    def stats(self) -> StorageStats:
        """Return a snapshot of sizes and counters. Mutates nothing."""
        ...

    def close(self) -> None:
        """Release the store; idempotent. Later calls of other methods raise
        ``StorageClosedError``."""
        ...


@runtime_checkable
class ScatterGet(Protocol):
    """Optional: read each page into several buffers (a page that is several runs of
    memory at its destination, as an MHA page's K and V in a host pool).

    Same promises as ``StorageBackend.get``; a backend without it is served by
    ``storage_backends.scatter.get_scatter`` (one staging copy more).
    """

    def get_scatter(self, keys: Sequence[bytes], dst: list[Sequence[memoryview]]) -> list[bool]:
        """Copy the page of each key into the buffers ``dst[i]``, in order.

        Returns per-key hits. Buffers whose lengths do not add up to the stored
        payload length are a miss. What a hit or a miss leaves in ``dst[i]`` is
        as for ``get`` (a damaged page's runs may be partly written), updates
        recency of hit pages, deletes damaged pages and updates the
        hit/miss/corrupt counters. Raises
        like ``get`` (ValueError for malformed arguments or a read-only buffer,
        ``StorageClosedError`` after ``close()``). Thread-safe like ``get``.
        """
        ...


@runtime_checkable
class GatherPut(Protocol):
    """Optional: store each page from several buffers (a page that is several runs of
    memory at its source, as an MHA page's K and V in a host pool): the write twin of
    ``ScatterGet``.

    Same promises as ``StorageBackend.put``; a backend without it is served by
    ``storage_backends.scatter.put_gather`` (the runs gathered into one staging page,
    one copy more).
    """

    def put_gather(self, keys: Sequence[bytes], src: list[Sequence[memoryview]]) -> list[bool]:
        """Store the runs ``src[i]``, concatenated in order, as the page of ``keys[i]``.

        Returns per-key success, as ``put`` does: keys already present are skipped
        and reported as ``True``; may evict least-recently-used pages; updates the
        put counters. The runs are only read (never mutated) and may be reused as
        soon as this returns. The whole batch is checked before anything is stored
        or sent: ``ValueError`` for malformed arguments (``keys`` and ``src`` of
        different lengths, a key that is not 32 bytes, a page with no runs, a run
        that is not C-contiguous), and the store is then as it was;
        ``StorageClosedError`` after ``close()``. Thread-safe like ``put``.
        """
        ...


@runtime_checkable
class FailedCalls(Protocol):
    """Optional: how many calls failed for a reason other than a miss (no reply in
    time, a refused connection, an error reply, an exception), without any I/O, so
    that an engine's scheduler thread may ask. Thread-safe; mutates nothing."""

    def failed_calls(self) -> int:
        """The count since this backend object was created."""
        ...
