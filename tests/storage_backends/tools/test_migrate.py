"""``hicache store migrate``: an LMDB store becomes a disk store, page for page.

Pages arrive bit-exact, damaged ones are skipped and counted, and every bad path
is refused with a clear message before anything changes. A config that names
``disk`` for a directory still holding an LMDB store opens it as it is.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import lmdb
import pytest

from hicache.cli import main
from storage_backends import StorageConfig, create
from storage_backends.guard import open_guarded
from storage_backends.page_format import HEADER_BYTES

if TYPE_CHECKING:
    from conftest import Pages

SIZES = (5000, 70_000)  # a page per size alternately: several slot classes
COUNT = 12
DAMAGED = {1: "bad_checksum", 4: "wrong_key"}


def _lmdb_store(path: Path, pages: Pages) -> Path:
    config = StorageConfig(backend="lmdb", path=str(path), fingerprint="ab12")
    store = create("lmdb", config)
    ids = range(COUNT)
    store.put(pages.keys(ids), [pages.payloads([i], SIZES[i % 2])[0] for i in ids])
    store.close()
    return path


def _damage(path: Path, pages: Pages) -> None:
    """Flip a payload byte of page 1; give page 4's header another page's key."""
    env = lmdb.open(str(path), max_dbs=4)
    try:
        with env.begin(write=True, db=env.open_db(b"pages")) as txn:
            for i, what in DAMAGED.items():
                record = bytearray(txn.get(pages.key(i)))
                if what == "bad_checksum":
                    record[HEADER_BYTES + 10] ^= 0xFF
                else:
                    record[8:40] = pages.key(99)
                txn.put(pages.key(i), bytes(record))
    finally:
        env.close()


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file's bytes but LMDB's reader table (``lock.mdb``), which any reader writes."""
    files = [p for p in root.rglob("*") if p.is_file() and p.name != "lock.mdb"]
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def _served(path: Path, pages: Pages, backend: str) -> list[bool]:
    store = create(backend, StorageConfig(backend=backend, path=str(path), fingerprint="ab12"))
    try:
        dst = [memoryview(bytearray(SIZES[i % 2])) for i in range(COUNT)]
        hits = store.get(pages.keys(range(COUNT)), dst)
    finally:
        store.close()
    return [
        hit and bytes(d) == pages.payload(i, SIZES[i % 2])
        for i, (hit, d) in enumerate(zip(hits, dst, strict=True))
    ]


def test_migrate_in_place_copies_pages_bit_exact_and_skips_damaged(
    tmp_path: Path, pages: Pages, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _lmdb_store(tmp_path / "store", pages)
    _damage(store, pages)
    assert main(["store", "migrate", str(store), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["copied"] == COUNT - len(DAMAGED)
    assert result["damaged"] == {what: 1 for what in DAMAGED.values()}
    assert result["not_stored"] == 0
    assert _served(store, pages, "disk") == [i not in DAMAGED for i in range(COUNT)]
    (kept,) = tmp_path.glob("store.lmdb-*")  # the LMDB store, as it was
    assert Path(result["kept"]) == kept and (kept / "data.mdb").is_file()


def test_migrate_to_a_new_directory_leaves_the_source(
    tmp_path: Path, pages: Pages, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _lmdb_store(tmp_path / "store", pages)
    (tmp_path / "new").mkdir()
    assert main(["store", "migrate", str(store), "--to", str(tmp_path / "new")]) == 0
    assert "copied:      12 pages" in capsys.readouterr().out
    assert _served(tmp_path / "new", pages, "disk") == [True] * COUNT
    assert _served(store, pages, "lmdb") == [True] * COUNT


@pytest.mark.parametrize(
    "case", ["missing", "not lmdb", "target not empty", "no target parent", "damaged", "open"]
)
def test_bad_paths_are_refused_before_any_change(
    tmp_path: Path, pages: Pages, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    store = _lmdb_store(tmp_path / "store", pages)
    argv = ["store", "migrate", str(store)]
    holder = None
    if case == "missing":
        argv[2] = str(tmp_path / "nowhere")
    elif case == "not lmdb":
        (tmp_path / "empty").mkdir()
        argv[2] = str(tmp_path / "empty")
    elif case == "target not empty":
        (tmp_path / "full").mkdir()
        (tmp_path / "full" / "something").write_bytes(b"x")
        argv += ["--to", str(tmp_path / "full")]
    elif case == "no target parent":
        argv += ["--to", str(tmp_path / "no" / "such")]
    elif case == "damaged":
        data = store / "data.mdb"
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    else:
        holder = create("lmdb", StorageConfig(backend="lmdb", path=str(store)))
    before = _snapshot(tmp_path)
    try:
        assert main(argv) == 2
        after = _snapshot(tmp_path)
    finally:
        if holder is not None:
            holder.close()
    err = capsys.readouterr().err
    expected = {
        "missing": "is not a directory",
        "not lmdb": "does not hold an LMDB store",
        "target not empty": "not an empty directory",
        "no target parent": "is not a directory",
        "damaged": "damaged",
        "open": "open in another process",
    }
    assert expected[case] in err
    assert after == before


def test_disk_config_opens_an_lmdb_store_as_it_is(
    tmp_path: Path, pages: Pages, caplog: pytest.LogCaptureFixture
) -> None:
    store = _lmdb_store(tmp_path / "store", pages)
    config = StorageConfig(backend="disk", path=str(store), fingerprint="ab12")
    with caplog.at_level(logging.WARNING):
        guarded = open_guarded("disk", config)
    try:
        dst = [memoryview(bytearray(SIZES[i % 2])) for i in range(COUNT)]
        assert guarded.get(pages.keys(range(COUNT)), dst) == [True] * COUNT
    finally:
        guarded.close()
    assert "already holds a store of the lmdb backend" in caplog.text
    assert "hicache store migrate" in caplog.text
