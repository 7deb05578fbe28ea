"""A store directory that holds more than one kind of store (an LMDB store and a disk
store side by side, a file store with them, what a migration leaves): the kind the
config names is opened with its pages; a kind that is not there is a clear error
naming the kinds that are; never an empty store of another kind in their place, and
every store there keeps its pages. Opened as the cache and the engine adapters open
a store (``open_guarded``)."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from storage_backends import StorageBackend, StorageConfig, create
from storage_backends.errors import StorageOpenError
from storage_backends.guard import open_guarded
from storage_backends.tools.migrate import migrate

if TYPE_CHECKING:
    from conftest import Pages

SIZE = 4096
KINDS = ("disk", "lmdb", "file")
IDS = {"lmdb": range(0, 4), "disk": range(10, 14), "file": range(20, 24)}
# What marks each kind's directory (the file a store of that kind cannot be without).
MARKS = {"disk": Path("index") / "data.mdb", "lmdb": Path("data.mdb"), "file": Path("store.json")}
MIXES = [mix for n in (2, 3) for mix in itertools.combinations(KINDS, n)]


def _config(path: Path, kind: str) -> StorageConfig:
    return StorageConfig(backend=kind, path=str(path), max_bytes=16 << 20, sync="none")


def _fill(path: Path, kind: str, pages: Pages) -> None:
    """A store of ``kind`` at ``path`` holding its own pages (``IDS[kind]``)."""
    store = create(kind, _config(path, kind))
    try:
        assert store.put(pages.keys(IDS[kind]), pages.payloads(IDS[kind], SIZE)) == [True] * 4
    finally:
        store.close()


def _hits(store: StorageBackend, kind: str, pages: Pages) -> list[bool]:
    """Hits of ``kind``'s pages (every hit bit-exact)."""
    ids = IDS[kind]
    dst = pages.buffers(len(ids), SIZE)
    hits = store.get(pages.keys(ids), dst)
    for i, hit, buf in zip(ids, hits, dst, strict=True):
        assert not hit or bytes(buf) == pages.payload(i, SIZE), f"{kind} page {i}: wrong bytes"
    return hits


def _each_keeps_its_pages(path: Path, kinds: tuple[str, ...], pages: Pages) -> None:
    for kind in kinds:
        store = create(kind, _config(path, kind))
        try:
            assert _hits(store, kind, pages) == [True] * 4, f"the {kind} store lost its pages"
        finally:
            store.close()


@pytest.mark.parametrize("there", MIXES, ids=["+".join(mix) for mix in MIXES])
@pytest.mark.parametrize("named", KINDS)
def test_the_named_kind_is_opened_or_the_kinds_there_are_named(
    tmp_path: Path, pages: Pages, named: str, there: tuple[str, ...]
) -> None:
    path = tmp_path / "store"
    for kind in there:
        _fill(path, kind, pages)
    config = _config(path, named)
    if named in there:
        store = open_guarded(named, config)
        try:
            assert _hits(store, named, pages) == [True] * 4, "not the store the config names"
            for other in set(there) - {named}:
                assert store.exists(pages.keys(IDS[other])) == 0
        finally:
            store.close()
    else:
        with pytest.raises(StorageOpenError) as refused:
            open_guarded(named, config)
        for kind in there:
            assert kind in str(refused.value)
        assert not (path / MARKS[named]).exists(), f"an empty {named} store was made there"
    _each_keeps_its_pages(path, there, pages)


def test_an_lmdb_config_after_an_in_place_migration_opens_the_disk_store(
    tmp_path: Path, pages: Pages, caplog: pytest.LogCaptureFixture
) -> None:
    """What ``hicache store migrate`` leaves: the disk store at the path (the LMDB store
    kept beside it); a config that still says ``lmdb`` opens the disk store, pages and
    all, and the LMDB store's leftover lock and marker files change nothing."""
    path = tmp_path / "store"
    _fill(path, "lmdb", pages)
    result = migrate(path)
    assert result.copied == 4 and result.kept != path
    for leftover in ("lock.mdb", "hicache-open.lock", "hicache-clean-close"):
        (path / leftover).write_bytes(b"")  # an old process's files, copied back
    with caplog.at_level(logging.WARNING):
        store = open_guarded("lmdb", _config(path, "lmdb"))
    try:
        assert _hits(store, "lmdb", pages) == [True] * 4
        assert store.put(pages.keys([99]), pages.payloads([99], SIZE)) == [True]
    finally:
        store.close()
    assert "already holds a store of the disk backend" in caplog.text
    assert not (path / MARKS["lmdb"]).exists()
