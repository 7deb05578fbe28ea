"""StoreSlot: a store found damaged is moved aside and replaced once, whatever its kind; a
store whose directory went is reopened before a write; a replaced store is never closed."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from hicache.daemon.record_store import OPENERS, RecordStore
from hicache.daemon.store_slot import StoreSlot
from storage_backends import StorageConfig
from storage_backends.errors import StoreDamagedError


class _Opened:
    """Opens real stores, and can make the stores opened so far report damage."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.stores: list[RecordStore] = []
        self.damaged: set[int] = set()  # positions in ``stores``
        self.inside = threading.Barrier(4)  # calls that meet the damage wait for each other

    def __call__(self, config: StorageConfig) -> RecordStore:
        store = OPENERS[self.backend](config)
        self.stores.append(store)
        return store

    def contains(self, store: RecordStore, keys: list[bytes]) -> list[bool]:
        if self.stores.index(store) in self.damaged:
            self.inside.wait(timeout=30)  # every caller saw the damaged store
            raise StoreDamagedError("planted")
        return store.contains(keys)


@pytest.fixture(params=sorted(OPENERS))
def opened(request: pytest.FixtureRequest):
    opener = _Opened(request.param)
    yield opener
    for store in opener.stores:
        store.close()


def _slot(tmp_path: Path, opener: _Opened) -> StoreSlot:
    config = StorageConfig(backend=opener.backend, path=str(tmp_path / "store"), max_bytes=1 << 20)
    return StoreSlot(config, opener)


def test_damage_moves_the_store_aside_once_and_the_call_runs_again(
    tmp_path: Path, opened: _Opened
) -> None:
    slot = _slot(tmp_path, opened)
    key = bytes(32)
    assert slot.run_write(lambda s: s.put([key], [memoryview(b"page")])) == [True]
    opened.damaged.add(0)
    answers: list[list[bool]] = []

    def probe() -> None:
        answers.append(slot.run(lambda s: opened.contains(s, [key])))

    threads = [threading.Thread(target=probe) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert answers == [[False]] * 4  # each call ran again, on the one empty store
    assert slot.replaced == 1 and len(opened.stores) == 2
    assert len(list(tmp_path.glob("store.damaged-*"))) == 1


def test_a_deleted_directory_is_reopened_before_the_next_write(
    tmp_path: Path, opened: _Opened
) -> None:
    slot = _slot(tmp_path, opened)
    keys = [bytes([i]) * 32 for i in range(2)]
    assert slot.run_write(lambda s: s.put(keys[:1], [memoryview(b"one")])) == [True]
    shutil.rmtree(tmp_path / "store")
    assert slot.run(lambda s: s.contains(keys[:1])) == [True]  # reads: the old store, as it is
    assert slot.run_write(lambda s: s.put(keys[1:], [memoryview(b"two")])) == [True]
    assert slot.replaced == 1
    slot.close()
    reopened = OPENERS[opened.backend](
        StorageConfig(backend=opened.backend, path=str(tmp_path / "store"), max_bytes=1 << 20)
    )
    try:
        assert reopened.contains(keys) == [False, True]  # the acknowledged write is on disk
    finally:
        reopened.close()
