"""GuardedBackend: backend failures are misses, damage replaces the store, misuse still raises."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from storage_backends import StorageClosedError
from storage_backends.errors import StoreDamagedError
from storage_backends.guard import GuardedBackend, open_guarded
from tests.faulty_backends import RaisingBackend

if TYPE_CHECKING:
    from conftest import Pages

SIZE = 256


def test_every_failure_is_a_counted_miss(pages: Pages, caplog: pytest.LogCaptureFixture) -> None:
    inner = RaisingBackend()
    guard = GuardedBackend(inner)
    keys = pages.keys(range(4))
    dst = pages.buffers(4, SIZE)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert guard.exists(keys) == 0
            assert guard.get(keys, dst) == [False] * 4
            assert guard.put(keys, pages.payloads(range(4), SIZE)) == [False] * 4
            assert guard.delete(keys) == 0
            assert guard.take_removed() == []
    assert all(bytes(d) == b"\xab" * SIZE for d in dst)
    # One traceback per kind of call, not one per failure.
    assert len(caplog.records) == 5
    assert all(record.exc_info for record in caplog.records)
    stats = guard.stats()
    assert stats.errors == inner.calls == 16  # 15 calls above and stats() itself
    assert (stats.entries, stats.hits) == (0, 0)
    guard.close()
    assert inner.calls == 17


def test_misuse_still_raises(pages: Pages) -> None:
    inner = RaisingBackend()
    guard = GuardedBackend(inner)
    with pytest.raises(ValueError, match="32-byte"):
        guard.exists([b"short"])
    with pytest.raises(ValueError, match="keys but"):
        guard.get(pages.keys(range(2)), pages.buffers(1, SIZE))
    with pytest.raises(ValueError, match="writable"):
        guard.get(pages.keys(range(1)), [memoryview(b"x" * SIZE)])
    assert inner.calls == 0  # rejected at the door
    guard.close()
    with pytest.raises(StorageClosedError):
        guard.exists(pages.keys(range(1)))
    guard.close()  # idempotent


def test_runtime_damage_moves_the_store_aside(
    tmp_path: Path, pages: Pages, caplog: pytest.LogCaptureFixture
) -> None:
    config = pages.config("lmdb", tmp_path)
    guard = open_guarded("lmdb", config)
    assert guard.put(pages.keys(range(4)), pages.payloads(range(4), SIZE)) == [True] * 4
    damaged = guard.backend

    def structure_failed(keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        raise StoreDamagedError("MDB_CORRUPTED: Located page was wrong type")

    damaged.get = structure_failed  # type: ignore[method-assign]
    dst = pages.buffers(4, SIZE)
    with caplog.at_level(logging.ERROR):
        assert guard.get(pages.keys(range(4)), dst) == [False] * 4
    assert "damaged" in caplog.text
    (moved,) = tmp_path.glob("lmdb-store.damaged-*")
    assert (moved / "data.mdb").exists()
    assert guard.backend is not damaged
    with pytest.raises(StorageClosedError):
        damaged.exists(pages.keys(range(1)))  # the damaged store was closed
    stats = guard.stats()
    assert (stats.entries, stats.quarantined, stats.errors) == (0, 1, 1)
    assert guard.exists(pages.keys(range(4))) == 0  # started empty
    assert guard.put(pages.keys(range(2)), pages.payloads(range(2), SIZE)) == [True] * 2
    assert guard.get(pages.keys(range(2)), dst[:2]) == [True] * 2
    assert [bytes(d) for d in dst[:2]] == [pages.payload(i, SIZE) for i in range(2)]
    guard.close()


def test_guard_passes_a_healthy_backend_through(
    tmp_path: Path, pages: Pages, backend_name: str
) -> None:
    guard = open_guarded(backend_name, pages.config(backend_name, tmp_path))
    assert guard.put(pages.keys(range(3)), pages.payloads(range(3), SIZE)) == [True] * 3
    dst = pages.buffers(3, SIZE)
    assert guard.get(pages.keys(range(3)), dst) == [True] * 3
    assert [bytes(d) for d in dst] == [pages.payload(i, SIZE) for i in range(3)]
    assert guard.exists(pages.keys(range(5))) == 3
    assert guard.delete(pages.keys([0])) == 1
    assert guard.take_removed() == pages.keys([0])
    stats = guard.stats()
    assert (stats.entries, stats.hits, stats.errors, stats.quarantined) == (2, 3, 0, 0)
    guard.close()
