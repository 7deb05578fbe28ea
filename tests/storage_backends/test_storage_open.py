"""Opening stores: bad paths, fingerprints, and warm restart in another process."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from storage_backends import (
    FingerprintMismatchError,
    StorageConfig,
    StorageOpenError,
    create,
)

if TYPE_CHECKING:
    from conftest import MakeBackend, Pages

PERSISTENT = ["lmdb", "file", "disk"]


@pytest.mark.parametrize("name", PERSISTENT)
def test_missing_parent_directory(tmp_path: Path, name: str) -> None:
    config = StorageConfig(backend=name, path=str(tmp_path / "absent" / "store"))
    with pytest.raises(StorageOpenError, match=r"parent directory .* is missing"):
        create(name, config)


@pytest.mark.parametrize("name", PERSISTENT)
def test_path_under_a_regular_file(tmp_path: Path, name: str) -> None:
    (tmp_path / "plain").write_bytes(b"x")
    config = StorageConfig(backend=name, path=str(tmp_path / "plain" / "store"))
    with pytest.raises(StorageOpenError, match="plain"):
        create(name, config)


@pytest.mark.parametrize("name", PERSISTENT)
def test_path_is_a_regular_file(tmp_path: Path, name: str) -> None:
    (tmp_path / "store").write_bytes(b"x")
    with pytest.raises(StorageOpenError, match="cannot create directory"):
        create(name, StorageConfig(backend=name, path=str(tmp_path / "store")))


@pytest.mark.parametrize("name", PERSISTENT)
def test_empty_path_is_the_user_cache_dir(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    config = StorageConfig(backend=name, fingerprint="ab" * 32)
    assert config.store_dir() == tmp_path / "xdg" / "hicache" / "store" / ("ab" * 8)
    create(name, config).close()
    assert config.store_dir().is_dir()
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # ignored, as the XDG spec asks
    assert config.store_dir() == Path.home() / ".cache" / "hicache" / "store" / ("ab" * 8)


def test_lmdb_garbage_data_file_is_quarantined(
    tmp_path: Path, pages: Pages, make_backend: MakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    garbage = b"not an lmdb file" * 512
    (store / "data.mdb").write_bytes(garbage)
    with caplog.at_level(logging.ERROR):
        backend = make_backend(StorageConfig(backend="lmdb", path=str(store)))
    assert [r.levelno for r in caplog.records].count(logging.ERROR) == 1
    assert "damaged" in caplog.text
    (moved,) = tmp_path.glob("store.damaged-*")
    assert (moved / "data.mdb").read_bytes() == garbage
    stats = backend.stats()
    assert (stats.entries, stats.quarantined) == (0, 1)
    assert backend.put(pages.keys([0]), pages.payloads([0], 64)) == [True]


@pytest.mark.parametrize("name", PERSISTENT)
def test_fingerprint_rules(
    tmp_path: Path,
    pages: Pages,
    make_backend: MakeBackend,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = replace(pages.config(name, tmp_path), fingerprint="aa11")
    make_backend(config).close()
    with pytest.raises(FingerprintMismatchError, match=r"aa11.*bb22"):
        make_backend(replace(config, fingerprint="bb22"))
    make_backend(config).close()
    make_backend(replace(config, fingerprint="")).close()
    with caplog.at_level(logging.WARNING):
        allowed = make_backend(replace(config, fingerprint="bb22", allow_fingerprint_mismatch=True))
    assert "allow_fingerprint_mismatch" in caplog.text
    allowed.close()
    # The override did not adopt the new fingerprint.
    with pytest.raises(FingerprintMismatchError):
        make_backend(replace(config, fingerprint="bb22"))


@pytest.mark.parametrize("name", PERSISTENT)
def test_store_without_fingerprint_adopts_the_first_one(
    tmp_path: Path, pages: Pages, make_backend: MakeBackend, name: str
) -> None:
    config = pages.config(name, tmp_path)
    make_backend(config).close()
    make_backend(replace(config, fingerprint="cc33")).close()
    with pytest.raises(FingerprintMismatchError):
        make_backend(replace(config, fingerprint="dd44"))


@pytest.mark.parametrize("name", PERSISTENT)
def test_warm_restart_across_processes(
    tmp_path: Path, pages: Pages, make_backend: MakeBackend, name: str
) -> None:
    config = replace(pages.config(name, tmp_path), fingerprint="ee55")
    size = 32 << 10
    writer = textwrap.dedent(
        f"""
        import hashlib
        from storage_backends import StorageConfig, create

        def blob(tag, i):
            seed = hashlib.sha256(f"{{tag}}-{{i}}".encode()).digest()
            return (seed * ({size} // 32 + 1))[:{size}]

        config = StorageConfig(backend={name!r}, path={config.path!r}, fingerprint="ee55")
        store = create({name!r}, config)
        keys = [hashlib.sha256(f"page-{{i}}".encode()).digest() for i in range(8)]
        assert store.put(keys, [memoryview(blob("payload", i)) for i in range(8)]) == [True] * 8
        store.close()
        """
    )
    subprocess.run([sys.executable, "-c", writer], check=True, timeout=60)
    store = make_backend(config)
    dst = pages.buffers(8, size)
    assert store.get(pages.keys(range(8)), dst) == [True] * 8
    assert [bytes(d) for d in dst] == [pages.payload(i, size) for i in range(8)]
    assert store.stats().entries == 8


def test_lmdb_store_open_twice_in_one_process(
    tmp_path: Path, pages: Pages, make_backend: MakeBackend
) -> None:
    config = pages.config("lmdb", tmp_path)
    make_backend(config)
    with pytest.raises(StorageOpenError, match="already open"):
        make_backend(config)


@pytest.mark.parametrize("name", PERSISTENT)
def test_unsynced_store_round_trips(
    tmp_path: Path, pages: Pages, make_backend: MakeBackend, name: str
) -> None:
    config = replace(pages.config(name, tmp_path), sync=False)
    store = make_backend(config)
    assert store.put(pages.keys(range(3)), pages.payloads(range(3), 4096)) == [True] * 3
    store.close()
    dst = pages.buffers(3, 4096)
    assert make_backend(config).get(pages.keys(range(3)), dst) == [True] * 3
    assert [bytes(d) for d in dst] == [pages.payload(i, 4096) for i in range(3)]
