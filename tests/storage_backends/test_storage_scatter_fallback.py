"""The scatter fallback (``scatter.get_scatter`` over a backend without its own
``get_scatter``: redis, mooncake, plug-ins): a miss leaves the caller's runs exactly
as they were, only hits write, whatever the backend left in the staging page of a
miss (an absent key, runs of the wrong total, a page found damaged)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from storage_backends import StorageBackend
from storage_backends.scatter import get_scatter, has_scatter

PAGE = 4096
FILL = 0xEE
# Split points of a page into runs: an MHA page's K and V, and an odd split.
SPLITS = ([PAGE // 2, PAGE // 2], [1, 2, PAGE - 3])


class GetOnly:
    """A plug-in with the protocol's ``get`` and nothing more (the fallback serves it)."""

    def __init__(self, inner: StorageBackend) -> None:
        self._inner = inner

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        return self._inner.get(keys, dst)


class ScribblingMisses(GetOnly):
    """A plug-in that reads a page into the buffer before checking it, as ``disk`` does:
    a page it finds damaged (``damaged`` keys) is a miss whose buffer holds junk, as
    ``StorageBackend.get`` allows."""

    def __init__(self, inner: StorageBackend, damaged: set[bytes]) -> None:
        super().__init__(inner)
        self._damaged = damaged

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        hits = super().get(keys, dst)
        for i, key in enumerate(keys):
            if key in self._damaged:
                dst[i][:] = b"\x5a" * len(dst[i])
                hits[i] = False
        return hits


def runs_of(splits: Sequence[int]) -> list[memoryview]:
    return [memoryview(bytearray([FILL]) * n) for n in splits]


def untouched(runs: Sequence[memoryview]) -> bool:
    return all(bytes(run) == bytes([FILL]) * len(run) for run in runs)


@pytest.fixture(params=["memory", "lmdb", "file", "disk", "redis"])
def stored(request: pytest.FixtureRequest, store_config, make_backend, pages) -> StorageBackend:
    """Pages 0-3 stored in a backend; redis has no ``get_scatter`` of its own, the
    local ones are used through ``GetOnly``."""
    backend = make_backend(store_config(request.param))
    assert backend.put(pages.keys(range(4)), pages.payloads(range(4), PAGE)) == [True] * 4
    return backend if request.param == "redis" else GetOnly(backend)  # type: ignore[return-value]


def test_misses_leave_every_run_as_it_was(stored: StorageBackend, pages) -> None:
    assert not has_scatter(stored)
    # Hits and misses interleaved, each page split into several runs: an absent key,
    # runs whose total is one byte short, one byte long, then hits after them.
    keys = [pages.key(0), pages.key(99), pages.key(1), pages.key(2), pages.key(98), pages.key(3)]
    dst = [
        runs_of(SPLITS[0]),
        runs_of(SPLITS[1]),
        runs_of([100, PAGE - 101]),  # page 1, one byte short
        runs_of([PAGE, 1]),  # page 2, one byte long
        runs_of([PAGE]),  # absent, one run: handed to the backend's get as it is
        runs_of(SPLITS[1]),
    ]
    hits = get_scatter(stored, keys, dst)  # type: ignore[arg-type]
    assert hits == [True, False, False, False, False, True]
    for i, hit in enumerate(hits):
        if not hit:
            assert untouched(dst[i]), f"miss {i} wrote into its runs"
    assert b"".join(bytes(r) for r in dst[0]) == pages.payload(0, PAGE)
    assert b"".join(bytes(r) for r in dst[5]) == pages.payload(3, PAGE)


@pytest.mark.parametrize("splits", SPLITS)
def test_a_damaged_page_read_before_its_check_is_a_miss_that_writes_nothing(
    splits: list[int], pages, make_backend, store_config
) -> None:
    inner = make_backend(store_config("memory"))
    assert inner.put(pages.keys(range(3)), pages.payloads(range(3), PAGE)) == [True] * 3
    backend = ScribblingMisses(inner, damaged={pages.key(1)})
    dst = [runs_of(splits) for _ in range(3)]
    hits = get_scatter(backend, pages.keys(range(3)), dst)  # type: ignore[arg-type]
    assert hits == [True, False, True]
    assert untouched(dst[1]), "the damaged page's junk reached the caller's runs"
    for i in (0, 2):
        assert b"".join(bytes(r) for r in dst[i]) == pages.payload(i, PAGE)
