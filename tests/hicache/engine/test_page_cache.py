"""Dropping a file from the page cache, and telling whether it worked."""

from __future__ import annotations

import os
from pathlib import Path

from hicache.bench.common.page_cache import RESIDENT_TOLERANCE, drop_page_cache, resident_bytes


def test_drop_reports_what_it_measured(tmp_path: Path) -> None:
    data = tmp_path / "store" / "data.mdb"
    data.parent.mkdir()
    data.write_bytes(os.urandom(4 << 20))
    assert data.read_bytes()  # make it resident
    before = resident_bytes(data)
    result = drop_page_cache(tmp_path / "store")
    assert result.files == 1 and result.nbytes == 4 << 20
    if before is None:  # no mincore here: never claims a cold store
        assert not result.took_effect
        return
    assert result.resident_before is not None and result.resident_after is not None
    assert result.resident_before >= result.resident_after
    cold = result.resident_after <= RESIDENT_TOLERANCE * result.nbytes
    assert result.took_effect == cold
    assert data.read_bytes()  # the file itself is intact


def test_empty_or_missing_store(tmp_path: Path) -> None:
    assert drop_page_cache(tmp_path / "missing").files == 0
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "zero").write_bytes(b"")
    assert resident_bytes(tmp_path / "empty" / "zero") == 0
    assert drop_page_cache(tmp_path / "empty").nbytes == 0
