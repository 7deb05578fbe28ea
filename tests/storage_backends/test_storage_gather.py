"""Gather writes (``GatherPut``): a page stored from several runs, through the generic
fallback (``put_gather``: the runs gathered into one staging page, then ``put``) for every
in-process backend, directly and behind the guard."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from storage_backends import StorageBackend
from storage_backends.base import GatherPut
from storage_backends.guard import GuardedBackend
from storage_backends.scatter import Staging, put_gather

PAGE = 4096
# Each page's runs (their lengths add up to PAGE): two halves, one run, many uneven ones.
SPLITS = ([1000, PAGE - 1000], [PAGE], [1, 2, 3, PAGE - 6], [PAGE // 4] * 4)


def runs_of(data: bytes, splits: Sequence[int]) -> list[memoryview]:
    """``data`` cut into runs of ``splits`` bytes, each in a buffer of its own."""
    out, offset = [], 0
    for n in splits:
        out.append(memoryview(bytearray(data[offset : offset + n])))
        offset += n
    return out


def read_back(backend: StorageBackend, keys: list[bytes]) -> list[bytes | None]:
    dst = [memoryview(bytearray(PAGE)) for _ in keys]
    hits = backend.get(keys, dst)
    return [bytes(d) if hit else None for d, hit in zip(dst, hits, strict=True)]


@pytest.fixture
def store(backend_name: str, pages, make_backend, tmp_path: Path) -> StorageBackend:
    backend: StorageBackend = make_backend(pages.config(backend_name, tmp_path))
    return backend


@pytest.mark.parametrize("wrap", ["plain", "guarded", "staged"])
def test_multi_run_pages_read_back_bit_exact(store: StorageBackend, pages, wrap: str) -> None:
    chosen = GuardedBackend(store) if wrap == "guarded" else store
    assert isinstance(chosen, GatherPut) == (wrap == "guarded")
    staging = Staging() if wrap == "staged" else None
    for batch in range(2):  # a second batch reuses the staging buffer of the first
        ids = [10 * batch + i for i in range(len(SPLITS))]
        src = [runs_of(pages.payload(i, PAGE), s) for i, s in zip(ids, SPLITS, strict=True)]
        if wrap == "staged":
            stored = put_gather(chosen, pages.keys(ids), src, staging)  # type: ignore[arg-type]
        else:
            stored = put_gather(chosen, pages.keys(ids), src)  # type: ignore[arg-type]
        assert stored == [True] * len(ids)
    for batch in range(2):
        ids = [10 * batch + i for i in range(len(SPLITS))]
        assert read_back(store, pages.keys(ids)) == [pages.payload(i, PAGE) for i in ids]
    assert store.stats().puts == 2 * len(SPLITS)


def _bad_batches(pages) -> dict[str, tuple[list[bytes], list[list[memoryview]]]]:
    good = runs_of(pages.payload(0, PAGE), [100, PAGE - 100])
    strided = memoryview(bytearray(2 * PAGE))[::2]
    return {
        "lengths": (pages.keys(range(2)), [good]),
        "no runs": (pages.keys(range(2)), [good, []]),
        "bad key": ([pages.key(0), b"short"], [good, good]),
        "strided run": (pages.keys(range(2)), [good, [strided]]),
        "flat page": (pages.keys(range(2)), [good, memoryview(bytearray(PAGE))]),  # not runs
    }


@pytest.mark.parametrize("case", ["lengths", "no runs", "bad key", "strided run", "flat page"])
@pytest.mark.parametrize("guarded", [False, True])
def test_bad_batches_are_refused_and_store_nothing(
    store: StorageBackend, pages, case: str, guarded: bool
) -> None:
    keys, src = _bad_batches(pages)[case]
    chosen = GuardedBackend(store) if guarded else store
    with pytest.raises(ValueError):
        put_gather(chosen, keys, src)  # type: ignore[arg-type]
    assert store.contains(pages.keys(range(2))) == [False, False]
    assert store.stats().puts == 0


def test_staging_keeps_one_buffer_per_thread_within_its_cap() -> None:
    staging = Staging(max_bytes=100)
    first = staging.buffer(60)
    assert staging.buffer(40) is first and len(first) >= 60
    big = staging.buffer(200)  # over the cap: its own buffer, not kept
    assert len(big) == 200 and staging.buffer(50) is first
