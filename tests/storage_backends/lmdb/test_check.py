"""The child-process structural check: its typed report, every named database walked,
the cases where it reports no verdict (out of time, budget spent, cannot start) logged,
and what it reads: the B-tree pages, a sample of the large values' first pages."""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import struct
import subprocess
from pathlib import Path

import lmdb
import pytest

from hicache.bench.common.page_cache import drop_page_cache, resident_bytes
from storage_backends import StorageConfig, create
from storage_backends.lmdb.check import WalkReport, check_store, mapped, walk
from storage_backends.lmdb.pages import walk_pages


def _disk_store(path: Path) -> Path:
    store = create("disk", StorageConfig(backend="disk", path=str(path), max_bytes=8 << 20))
    try:
        assert store.put([bytes(32)], [memoryview(bytes(100))]) == [True]
    finally:
        store.close()
    return path / "index"


def test_walk_covers_every_named_database_of_the_disk_index(tmp_path: Path) -> None:
    report = walk(str(_disk_store(tmp_path / "store")))
    assert report.damage is None
    assert {"pages", "lru", "meta", "free", "free_class", "pending"} <= set(report.databases)
    assert report.entries >= 3  # the page, its recency entry, the meta entries


def test_walk_of_a_store_without_databases_reports_none(tmp_path: Path) -> None:
    lmdb.open(str(tmp_path), map_size=1 << 20).close()  # data.mdb, nothing created yet
    assert walk(str(tmp_path)) == WalkReport(None, (), 0)
    assert check_store(tmp_path, 60).damage is None


def test_damage_in_the_meta_table_is_found(tmp_path: Path) -> None:
    path = tmp_path / "store"
    env = lmdb.open(str(path), map_size=1 << 20, max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"fingerprint", b"\x00\xff", db=env.open_db(b"meta", txn=txn))
    env.close()
    assert walk(str(path)).damage == "meta fingerprint is not printable text"
    assert check_store(path, 60).damage == "meta fingerprint is not printable text"


def test_report_round_trips_and_rejects_other_lines() -> None:
    report = WalkReport("a page is reached twice", ("pages",), 7)
    assert WalkReport.from_json(report.to_json()) == report
    for line in ("", "not json", "[]", '{"damage": null}', "Traceback (most recent call last):"):
        assert WalkReport.from_json(line) is None


def test_a_check_out_of_time_is_no_verdict_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    index = _disk_store(tmp_path / "store")
    with caplog.at_level(logging.WARNING, logger="storage_backends.lmdb.check"):
        result = check_store(index, 1e-3)  # no child starts that fast
    assert (result.damage, result.finished) == (None, False)
    assert "did not finish" in caplog.text


def test_a_check_that_cannot_start_is_no_verdict_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = _disk_store(tmp_path / "store")

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(subprocess, "run", refuse)
    with caplog.at_level(logging.WARNING, logger="storage_backends.lmdb.check"):
        assert check_store(index, 60).damage is None
    assert "could not start" in caplog.text


def test_a_child_that_fails_without_a_report_is_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = _disk_store(tmp_path / "store")

    def crash(*args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess([], 1, "", "lmdb.Error: mdb_env_open: corrupted")

    monkeypatch.setattr(subprocess, "run", crash)
    assert check_store(index, 60).damage == "lmdb.Error: mdb_env_open: corrupted"


def _lmdb_store(path: Path, values: int, size: int = 64 << 10) -> Path:
    """An LMDB store of ``values`` large values (each an overflow run of pages)."""
    config = StorageConfig(backend="lmdb", path=str(path), max_bytes=64 << 20, sync=False)
    store = create("lmdb", config)
    try:
        keys = [hashlib.sha256(b"%d" % i).digest() for i in range(values)]
        assert all(store.put(keys, [memoryview(os.urandom(size)) for _ in keys]))
    finally:
        store.close()
    return path


def test_a_spent_budget_is_no_verdict_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = _lmdb_store(tmp_path / "store", 8)
    report = walk(str(store), budget_s=0.0)  # spent before the page-level walk ends
    assert (report.damage, report.finished) == (None, False)
    with caplog.at_level(logging.WARNING, logger="storage_backends.lmdb.check"):
        result = check_store(store, 60, budget_s=0.0)
    assert (result.damage, result.finished) == (None, False)
    assert "spent its 0 s budget" in caplog.text
    whole = walk(str(store), budget_s=60.0)
    assert (whole.damage, whole.finished, whole.cursor_done) == (None, True, True)
    assert whole.overflow == whole.sampled == 8  # every large value's first page, in time


def test_the_walk_reads_the_trees_not_the_values(tmp_path: Path) -> None:
    """After the page cache is dropped, the page-level walk of a store of 300 values of
    64 KiB brings in its B-tree pages, not the values' pages (17 a value)."""
    store = _lmdb_store(tmp_path / "store", 300)
    data = store / "data.mdb"
    if not drop_page_cache(store).took_effect:
        pytest.skip("the page cache cannot be dropped here")
    with mapped(str(data)) as view:
        assert view is not None
        pages = walk_pages(view)
        resident = resident_bytes(data)
    assert (pages.damage, pages.finished, pages.overflow_runs) == (None, True, 300)
    assert resident is not None and resident < 300 * 4096  # not even a page a value


def test_damage_only_the_sample_can_see_is_found_by_it(tmp_path: Path) -> None:
    """A value's first page naming the wrong page count (what a delete frees) is found
    when that value is in the sample: with no budget, every one is."""
    store = _lmdb_store(tmp_path / "store", 20)
    raw = bytearray((store / "data.mdb").read_bytes())
    first = walk_pages(bytes(raw))
    assert first.damage is None and first.runs is not None
    pgno = int(first.runs[0][7])
    struct.pack_into("<I", raw, pgno * mmap.PAGESIZE + 12, int(first.runs[1][7]) + 1)
    (store / "data.mdb").write_bytes(raw)
    assert walk_pages(bytes(raw)).damage is None  # the page-level walk does not read it
    assert "overflow page" in str(walk(str(store)).damage)
