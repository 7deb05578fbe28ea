"""A big, sound LMDB store comes back whole after a restart.

The structural check at open walks the whole file; it runs only when the store
was not closed cleanly (or changed since), and running out of time is not
damage. Real damage is still quarantined.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import storage_backends.lmdb.backend as lmdb_backend
from storage_backends import StorageConfig, create
from storage_backends.lmdb.check import CheckResult, check_store

if TYPE_CHECKING:
    from conftest import Pages

REPO = Path(__file__).resolve().parents[3]
COUNT, SIZE = 20, 5000
# Writes COUNT pages, then dies without closing (a crash, as far as the store can tell).
CRASH = textwrap.dedent(
    f"""
    import hashlib, os, sys
    from storage_backends import StorageConfig, create
    store = create("lmdb", StorageConfig(backend="lmdb", path=sys.argv[1]))
    keys = [hashlib.sha256(f"page-{{i}}".encode()).digest() for i in range({COUNT})]
    seeds = [hashlib.sha256(f"payload-{{i}}".encode()).digest() for i in range({COUNT})]
    blobs = [memoryview((s * ({SIZE} // 32 + 1))[:{SIZE}]) for s in seeds]
    assert store.put(keys, blobs) == [True] * {COUNT}
    os._exit(0)
    """
)


class CheckSpy:
    """Counts the structural checks run, running the real one."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, path: Path, timeout_s: float) -> CheckResult:
        self.calls += 1
        return check_store(path, timeout_s)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> CheckSpy:
    checks = CheckSpy()
    monkeypatch.setattr(lmdb_backend, "check_store", checks)
    return checks


def _crashed_store(path: Path) -> StorageConfig:
    done = subprocess.run(
        [sys.executable, "-c", CRASH, str(path)], cwd=REPO, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return StorageConfig(backend="lmdb", path=str(path))


def _served(config: StorageConfig, pages: Pages) -> int:
    """How many of the COUNT pages the store at ``config`` serves bit-exact (then closes it)."""
    store = create("lmdb", config)
    try:
        dst = [memoryview(bytearray(SIZE)) for _ in range(COUNT)]
        hits = store.get([pages.key(i) for i in range(COUNT)], dst)
        quarantined = store.stats().quarantined
    finally:
        store.close()
    assert quarantined == 0
    pairs = enumerate(zip(hits, dst, strict=True))
    return sum(hit and bytes(d) == pages.payload(i, SIZE) for i, (hit, d) in pairs)


def test_clean_closed_store_opens_without_the_check(
    tmp_path: Path, pages: Pages, spy: CheckSpy
) -> None:
    config = _crashed_store(tmp_path / "store")
    assert _served(config, pages) == COUNT  # not closed cleanly: checked
    assert spy.calls == 1
    assert _served(config, pages) == COUNT  # closed cleanly by the open above
    assert spy.calls == 1


def test_check_out_of_time_opens_the_store(
    tmp_path: Path,
    pages: Pages,
    spy: CheckSpy,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = replace(_crashed_store(tmp_path / "store"), timeout_s=1e-3)
    monkeypatch.setattr(lmdb_backend, "CHECK_MIN_S", 1e-3)  # no child starts that fast
    with caplog.at_level(logging.WARNING):
        assert _served(config, pages) == COUNT
    assert spy.calls == 1
    assert "did not finish" in caplog.text
    assert not list(tmp_path.glob("store.damaged-*"))


def test_store_changed_after_clean_close_is_checked_and_quarantined(
    tmp_path: Path, pages: Pages, spy: CheckSpy
) -> None:
    config = _crashed_store(tmp_path / "store")
    assert _served(config, pages) == COUNT
    data = tmp_path / "store" / "data.mdb"
    raw = bytearray(data.read_bytes())
    for offset in range(2 * 4096, len(raw), 4096):  # every page past the meta pages
        raw[offset : offset + 8] = (1 << 40).to_bytes(8, "little")  # names another page
    data.write_bytes(raw)  # same size, same meta pages: only the times tell
    store = create("lmdb", config)
    try:
        stats = store.stats()
    finally:
        store.close()
    assert spy.calls == 2
    assert (stats.entries, stats.quarantined) == (0, 1)
    assert len(list(tmp_path.glob("store.damaged-*"))) == 1
