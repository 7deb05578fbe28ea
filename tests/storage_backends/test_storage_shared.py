"""Two processes sharing one file store keep it near max_bytes, not 2×."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from storage_backends import StorageConfig, create
from storage_backends.page_format import HEADER_BYTES


def key(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()


def stored_bytes(pages_dir: Path) -> int:
    return sum(f.stat().st_size for f in pages_dir.rglob("*") if f.is_file())


def test_two_file_backends_share_one_capacity(tmp_path: Path) -> None:
    page = 1024
    cap = 64 * (HEADER_BYTES + page)
    cfg = StorageConfig(backend="file", path=str(tmp_path / "s"), max_bytes=cap, sync=False)
    # Two instances, two indexes: what two engine processes on one directory have.
    first, second = create("file", cfg), create("file", cfg)
    data = memoryview(os.urandom(page))
    for i in range(400):
        assert (first if i % 2 else second).put([key(i)], [data]) == [True]
    # Each may overshoot by an eighth of the capacity between rescans; without
    # rescans each would keep a full capacity of its own (2× in total).
    assert stored_bytes(tmp_path / "s" / "pages") <= cap * 1.25
    assert first.exists([key(399)]) == 1 and second.exists([key(398)]) == 1
    first.close()
    second.close()
