"""Scatter reads: one stored page into several buffers (``ScatterGet``), natively or not.

A page can be several runs of memory where it lands (an MHA page in a
``page_first`` host pool is its K run and its V run). A backend that
implements ``ScatterGet`` verifies the stored record and copies it straight
into the runs; ``get_scatter`` here serves every other backend with ``get``
into one staging page and a copy into the runs, one copy more.
"""

from __future__ import annotations

from collections.abc import Sequence

from storage_backends.base import ScatterGet, StorageBackend
from storage_backends.batch import byte_view, check_keys
from storage_backends.page_format import HEADER_BYTES, Verdict, validate

Runs = list[memoryview]
# Whether a backend class has ``get_scatter``, by class: ``isinstance`` against a
# runtime-checkable Protocol walks the protocol's members on every call (about 9 us on
# Python 3.11, twice a call through the guard: ~3 % of reading one 512 KiB page), and
# a class does not change. Written from several threads at once; every writer writes the same value.
_NATIVE: dict[type, bool] = {}


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


def has_scatter(backend: StorageBackend) -> bool:
    """Whether ``backend`` implements ``ScatterGet`` (decided once per class)."""
    kind = type(backend)
    native = _NATIVE.get(kind)
    if native is None:
        native = _NATIVE[kind] = isinstance(backend, ScatterGet)
    return native


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
    sizes = [total(r) for r in runs]
    staging = memoryview(bytearray(sum(s for s, r in zip(sizes, runs, strict=True) if len(r) > 1)))
    views: list[memoryview] = []
    offset = 0
    for size, page_runs in zip(sizes, runs, strict=True):
        if len(page_runs) == 1:
            views.append(page_runs[0])
        else:
            views.append(staging[offset : offset + size])
            offset += size
    hits = backend.get(keys, views)
    for hit, view, page_runs in zip(hits, views, runs, strict=True):
        if hit and len(page_runs) > 1:
            scatter(view, page_runs)
    return hits
