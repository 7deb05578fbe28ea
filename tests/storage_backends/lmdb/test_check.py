"""The child-process structural check: its typed report, every named database walked,
and the cases where it reports no verdict (out of time, cannot start) logged."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import lmdb
import pytest

from storage_backends import StorageConfig, create
from storage_backends.lmdb.check import WalkReport, check_store, walk


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
