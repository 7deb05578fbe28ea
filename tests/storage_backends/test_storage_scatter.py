"""Scatter reads (``ScatterGet``): a page read straight into several runs, natively by the
memory, lmdb and file backends, and through the generic fallback for any other backend."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from storage_backends import StorageBackend
from storage_backends.base import ScatterGet
from storage_backends.guard import GuardedBackend
from storage_backends.scatter import get_scatter

PAGE = 4096


class GetOnly:
    """A backend that only has the protocol's ``get`` (the fallback serves it)."""

    def __init__(self, inner: StorageBackend) -> None:
        self._inner = inner

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        return self._inner.get(keys, dst)


def runs_of(splits: Sequence[int]) -> list[memoryview]:
    return [memoryview(bytearray(b"\xee" * n)) for n in splits]


@pytest.fixture
def stored(backend_name: str, pages, make_backend, tmp_path: Path) -> StorageBackend:
    backend = make_backend(pages.config(backend_name, tmp_path))
    assert backend.put(pages.keys(range(3)), pages.payloads(range(3), PAGE)) == [True] * 3
    return backend


@pytest.mark.parametrize("wrap", ["native", "guarded", "fallback"])
def test_pages_land_in_their_runs(stored: StorageBackend, pages, wrap: str) -> None:
    backend = {"native": stored, "guarded": GuardedBackend(stored), "fallback": GetOnly(stored)}
    chosen = backend[wrap]
    assert isinstance(chosen, ScatterGet) == (wrap != "fallback")
    dst = [runs_of([1000, PAGE - 1000]), runs_of([PAGE]), runs_of([1, 2, PAGE - 3]), runs_of([8])]
    keys = [*pages.keys(range(3)), pages.key(99)]
    hits = get_scatter(chosen, keys, dst)  # type: ignore[arg-type]
    assert hits == [True, True, True, False]
    for i in range(3):
        assert b"".join(bytes(r) for r in dst[i]) == pages.payload(i, PAGE)
    assert bytes(dst[3][0]) == b"\xee" * 8


def test_runs_of_the_wrong_total_are_a_miss_and_untouched(stored: StorageBackend, pages) -> None:
    dst = [runs_of([100, PAGE - 101]), runs_of([PAGE, 1])]
    assert get_scatter(stored, pages.keys(range(2)), dst) == [False, False]  # type: ignore[arg-type]
    assert all(bytes(r) == b"\xee" * len(r) for runs in dst for r in runs)
    assert stored.exists(pages.keys(range(3))) == 3  # a length mismatch is not damage


def test_bad_arguments_are_refused(stored: StorageBackend, pages) -> None:
    with pytest.raises(ValueError):
        get_scatter(stored, pages.keys(range(2)), [runs_of([PAGE])])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        get_scatter(stored, pages.keys(range(1)), [[memoryview(b"x" * PAGE)]])  # read-only
