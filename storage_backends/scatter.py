"""Scatter reads and gather writes: a page as several buffers (``ScatterGet``,
``GatherPut``), natively or not.

A page can be several runs of memory where it lands or comes from (an MHA
page in a ``page_first`` host pool is its K run and its V run). A backend
that implements ``ScatterGet`` verifies the stored record and copies it
straight into the runs; ``get_scatter`` here serves every other backend with
``get`` into one staging page and a copy into the runs, one copy more.
Writes mirror it: ``GatherPut`` builds the record straight from the runs,
``put_gather`` here gathers the runs into one staging page for ``put``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from itertools import accumulate

from storage_backends.base import GatherPut, ScatterGet, StorageBackend
from storage_backends.batch import byte_view, check_keys
from storage_backends.page_format import HEADER_BYTES, Verdict, validate

Runs = list[memoryview]
# Whether a backend class implements ``ScatterGet`` / ``GatherPut``, by (class, protocol):
# ``isinstance`` against a runtime-checkable Protocol walks the protocol's members on
# every call (about 9 us on Python 3.11, twice a call through the guard: ~3 % of reading
# one 512 KiB page), and a class does not change. Written from several threads at once;
# every writer writes the same value.
_NATIVE: dict[tuple[type, type], bool] = {}
# The most staging bytes a thread keeps between calls (a bigger batch gets its own).
STAGING_BYTES = 64 << 20


def check_scatter(keys: Sequence[bytes], dst: Sequence[Sequence[memoryview]]) -> list[Runs]:
    """Validate a scatter batch (ValueError) and return flat writable byte views of each run."""
    if len(keys) != len(dst):
        raise ValueError(f"got {len(keys)} keys but {len(dst)} destinations")
    check_keys(keys)
    return [[byte_view(run, writable=True) for run in runs] for runs in dst]


def total(runs: Sequence[memoryview]) -> int:
    """The bytes the runs hold together (the payload length they expect)."""
    return sum(len(run) for run in runs)


def scatter(page: memoryview, runs: Sequence[memoryview]) -> None:
    """Copy ``page`` into ``runs`` in order (their lengths add up to ``len(page)``)."""
    offset = 0
    for run in runs:
        run[:] = page[offset : offset + len(run)]
        offset += len(run)


def copy_verified_runs(blob: memoryview, key: bytes, runs: Sequence[memoryview]) -> Verdict:
    """``copy_verified`` into several runs: validate ``blob`` for the runs' total length
    and, only if it is intact, copy its payload across them; the runs are untouched
    unless the verdict is OK."""
    verdict = validate(blob, key, total(runs))
    if verdict is Verdict.OK:
        scatter(blob[HEADER_BYTES:], runs)
    return verdict


def _implements(backend: StorageBackend, protocol: type) -> bool:
    """Whether ``backend`` implements ``protocol`` (decided once per class)."""
    at = (type(backend), protocol)
    native = _NATIVE.get(at)
    if native is None:
        native = _NATIVE[at] = isinstance(backend, protocol)
    return native


def has_scatter(backend: StorageBackend) -> bool:
    """Whether ``backend`` implements ``ScatterGet`` (decided once per class)."""
    return _implements(backend, ScatterGet)


def _flat_pages(runs: list[Runs], staging: memoryview) -> list[memoryview]:
    """Each page as one flat view: its run when it has one, else its slice of
    ``staging`` (laid out in page order; ``staged_bytes(runs)`` long at least)."""
    views: list[memoryview] = []
    offset = 0
    for page_runs in runs:
        if len(page_runs) == 1:
            views.append(page_runs[0])
            continue
        size = total(page_runs)
        views.append(staging[offset : offset + size])
        offset += size
    return views


def _staged_bytes(runs: list[Runs]) -> int:
    """The staging bytes ``_flat_pages`` needs: the pages of more than one run."""
    return sum(total(r) for r in runs if len(r) > 1)


def get_scatter(
    backend: StorageBackend, keys: Sequence[bytes], dst: list[Sequence[memoryview]]
) -> list[bool]:
    """``backend.get_scatter`` where the backend has it, else ``get`` into one staging
    buffer and a copy of each hit into its runs (a one-run page needs no staging).

    Promises and errors as ``ScatterGet.get_scatter``; thread-safe like the backend's
    ``get`` (the staging buffer is this call's own).
    """
    if has_scatter(backend):
        return backend.get_scatter(keys, dst)  # type: ignore[attr-defined]
    runs = check_scatter(keys, dst)
    views = _flat_pages(runs, memoryview(bytearray(_staged_bytes(runs))))
    hits = backend.get(keys, views)
    for hit, view, page_runs in zip(hits, views, runs, strict=True):
        if hit and len(page_runs) > 1:
            scatter(view, page_runs)
    return hits


class Staging:
    """One staging buffer per calling thread, reused from call to call (fresh memory is
    faulted in and zeroed by the kernel: as costly as the copy it stages).

    Thread-safe: each thread sees only its own buffer. A buffer stays valid for its
    thread until that thread's next ``buffer`` call.
    """

    def __init__(self, max_bytes: int = STAGING_BYTES) -> None:
        self._max_bytes = max_bytes
        self._local = threading.local()

    def buffer(self, nbytes: int) -> memoryview:
        """A writable byte buffer of at least ``nbytes`` (kept if within the cap)."""
        kept: memoryview | None = getattr(self._local, "buffer", None)
        if kept is not None and len(kept) >= nbytes:
            return kept
        fresh = memoryview(bytearray(nbytes))
        if nbytes <= self._max_bytes:
            self._local.buffer = fresh
        return fresh


def check_gather(keys: Sequence[bytes], src: Sequence[Sequence[memoryview]]) -> list[Runs]:
    """Validate a gather batch (ValueError: lengths, keys, a page with no runs, a run
    that is not C-contiguous) and return flat read-only-or-not byte views of each run."""
    if len(keys) != len(src):
        raise ValueError(f"got {len(keys)} keys but {len(src)} sources")
    check_keys(keys)
    out: list[Runs] = []
    for i, runs in enumerate(src):
        if isinstance(runs, memoryview | bytes | bytearray) or len(runs) == 0:
            raise ValueError(f"page {i} needs a sequence of at least one run, got {runs!r:.80}")
        out.append([byte_view(run, writable=False) for run in runs])
    return out


def gather(runs: Sequence[memoryview], page: memoryview) -> memoryview:
    """Copy ``runs`` in order into ``page`` (of their total length) and return it."""
    ends = list(accumulate(len(run) for run in runs))
    for run, end in zip(runs, ends, strict=True):
        page[end - len(run) : end] = run
    return page


def has_gather(backend: StorageBackend) -> bool:
    """Whether ``backend`` implements ``GatherPut`` (decided once per class)."""
    return _implements(backend, GatherPut)


def put_gather(
    backend: StorageBackend,
    keys: Sequence[bytes],
    src: list[Sequence[memoryview]],
    staging: Staging | None = None,
) -> list[bool]:
    """``backend.put_gather`` where the backend has it, else the runs of each page
    gathered into one staging page and ``put`` (a one-run page needs no staging).

    ``staging``: the caller's per-thread buffers to gather into (None: this call
    allocates its own). Promises and errors as ``GatherPut.put_gather`` (the batch
    is checked before ``put`` is called); thread-safe like the backend's ``put``.
    """
    if has_gather(backend):
        return backend.put_gather(keys, src)  # type: ignore[attr-defined]
    runs = check_gather(keys, src)
    need = _staged_bytes(runs)
    buffer = staging.buffer(need) if staging is not None else memoryview(bytearray(need))
    views = _flat_pages(runs, buffer)
    for view, page_runs in zip(views, runs, strict=True):
        if len(page_runs) > 1:
            gather(page_runs, view)
    return backend.put(keys, views)
