"""The daemon's store directory holding more than one kind of store (its LMDB and its
disk store side by side, or one of them beside an engine's file store): the kind
``store.backend`` names is opened with its pages; a kind that is not there is a clear
error at start naming the kinds that are; never an empty store of another kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache.config.daemon import StoreConfig
from hicache.daemon.record_store import OPENERS
from hicache.daemon.store import DaemonStore, scoped_key
from storage_backends import StorageConfig, create
from storage_backends.errors import StorageOpenError

from .conftest import page_key, page_record

# Each kind's pages in the mixed directory (the file store is an engine's: any pages).
SALTS = {"lmdb": "lmdb-", "disk": "disk-", "file": "file-"}


def _records(kind: str) -> tuple[list[bytes], list[bytes], list[bytes]]:
    client = [page_key(i, SALTS[kind]) for i in range(3)]
    records = [page_record(key, i, 4096) for i, key in enumerate(client)]
    return client, [scoped_key("t", key) for key in client], records


def _fill(path: Path, kind: str) -> None:
    config = StorageConfig(backend=kind, path=str(path), max_bytes=16 << 20, max_page_bytes=1 << 20)
    client, scoped, records = _records(kind)
    if kind == "file":
        store = create("file", config)
        assert store.put(client, [memoryview(r) for r in records]) == [True] * 3
    else:  # as the daemon writes: whole records under the scoped keys
        store = OPENERS[kind](config)
        assert store.put_records(scoped, [memoryview(r) for r in records]) == [True] * 3
    store.close()


def _open(path: Path, kind: str) -> DaemonStore:
    config = StoreConfig(backend=kind, path=str(path), max_bytes=16 << 20, memory_bytes=0)
    return DaemonStore(config, max_page_bytes=1 << 20)


MIXES = [("disk", "lmdb"), ("disk", "file"), ("lmdb", "file")]


@pytest.mark.parametrize("there", MIXES, ids=["+".join(mix) for mix in MIXES])
@pytest.mark.parametrize("named", sorted(OPENERS))
def test_the_named_kind_is_served_or_the_kinds_there_are_named(
    tmp_path: Path, named: str, there: tuple[str, ...]
) -> None:
    path = tmp_path / "store"
    for kind in there:
        _fill(path, kind)
    if named not in there:
        with pytest.raises(StorageOpenError) as refused:
            _open(path, named)
        assert all(kind in str(refused.value) for kind in there)
    else:
        store = _open(path, named)
        try:
            client, scoped, records = _records(named)
            assert store.get(scoped, client, 1 << 30).records == records
            for other in set(there) - {named, "file"}:
                assert store.exists(_records(other)[1]) == 0
        finally:
            store.close()
    for kind in set(there) - {"file"}:  # the daemon's stores there keep their pages
        store = _open(path, kind)
        try:
            client, scoped, records = _records(kind)
            assert store.get(scoped, client, 1 << 30).records == records
        finally:
            store.close()
