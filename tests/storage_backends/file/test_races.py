"""File backend under concurrent deletes and a broken page directory."""

from __future__ import annotations

import logging
import random
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import MakeBackend, Pages

SIZE = 1024


def _files(root: str) -> int:
    return sum(1 for p in Path(root, "pages").rglob("*") if p.is_file())


def test_rescan_racing_deletes_counts_each_removal_once(
    tmp_path: Path, pages: Pages, make_backend: MakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """One thread stores (rescanning often: a small store), another deletes:
    no rescan fails, and every stored page ends up on disk, evicted or
    deleted, exactly once."""
    config = pages.config("file", tmp_path, max_bytes=48 * (SIZE + 64))
    store = make_backend(config)
    total, batch = 1200, 8
    stop = threading.Event()

    def deleter() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            store.delete(pages.keys(rng.sample(range(total), 16)))

    thread = threading.Thread(target=deleter)
    with caplog.at_level(logging.INFO):
        thread.start()
        try:
            for start in range(0, total, batch):
                ids = range(start, start + batch)
                store.put(pages.keys(ids), pages.payloads(ids, SIZE))
        finally:
            stop.set()
            thread.join(timeout=60)
    assert not thread.is_alive()
    assert "could not rescan" not in caplog.text
    stats = store.stats()
    assert stats.puts == total
    assert _files(config.path) + stats.evictions + stats.deletes == stats.puts


def test_broken_page_directory_logs_one_traceback(
    tmp_path: Path, pages: Pages, make_backend: MakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    config = pages.config("file", tmp_path)
    store = make_backend(config)
    # A regular file wherever a first-level page directory belongs: every write fails.
    for prefix in range(256):
        Path(config.path, "pages", f"{prefix:02x}").write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        for start in range(0, 64, 8):
            ids = range(start, start + 8)
            assert store.put(pages.keys(ids), pages.payloads(ids, SIZE)) == [False] * 8
    assert store.stats().put_failures == 64
    assert len(caplog.records) == 1
    assert caplog.records[0].exc_info is not None
    assert store.exists(pages.keys(range(64))) == 0
