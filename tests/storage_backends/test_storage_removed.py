"""take_removed(): every page a backend drops is reported once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from storage_backends import StorageBackend, StorageConfig
from storage_backends.page_format import HEADER_BYTES


def test_evictions_and_deletes_are_reported(
    backend_name: str,
    tmp_path: Path,
    pages,  # type: ignore[no-untyped-def]
    make_backend: Callable[[StorageConfig], StorageBackend],
) -> None:
    size = 4096
    cfg = pages.config(backend_name, tmp_path, max_bytes=4 * (HEADER_BYTES + size))
    store = make_backend(cfg)
    assert store.put(pages.keys(range(4)), pages.payloads(range(4), size)) == [True] * 4
    assert store.take_removed() == []
    assert store.put(pages.keys(range(4, 6)), pages.payloads(range(4, 6), size)) == [True] * 2
    assert sorted(store.take_removed()) == sorted(pages.keys(range(2)))  # the two oldest
    assert store.delete(pages.keys([4])) == 1
    assert store.take_removed() == pages.keys([4])
    assert store.take_removed() == []
