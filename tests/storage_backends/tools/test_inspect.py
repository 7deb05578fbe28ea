"""``hicache store inspect|verify``: read-only scans of disk, lmdb and file stores."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import lmdb
import pytest

from hicache.cli import main
from hicache.config.cache import CacheConfig
from hicache.keys.hashing import model_fingerprint
from storage_backends import StorageConfig, create
from storage_backends.disk.scan import locate
from storage_backends.tools.inspect import summarize, verify

PAGE = 4096
N = 12


def _fingerprint() -> str:
    config = CacheConfig()
    return model_fingerprint(config.model, config.device.page_size).hex()


def _store(tmp_path: Path, backend: str) -> Path:
    path = tmp_path / backend
    config = StorageConfig(backend=backend, path=str(path), fingerprint=_fingerprint(), sync=False)
    store = create(backend, config)
    keys = [hashlib.sha256(f"page-{i}".encode()).digest() for i in range(N)]
    pages = [memoryview(bytes([i]) * PAGE) for i in range(N)]
    assert all(store.put(keys, pages))
    store.close()
    return path


def _damage_one(path: Path, backend: str) -> None:
    """Flip one payload byte of one page, behind the backend's back."""
    if backend == "disk":
        place = locate(path, hashlib.sha256(b"page-3").digest())
        assert place is not None
        with open(place.segment, "r+b") as f:
            f.seek(place.offset + place.length - 1)
            last = f.read(1)[0]
            f.seek(place.offset + place.length - 1)
            f.write(bytes([last ^ 0xFF]))
        return
    if backend == "file":
        page = next(p for p in (path / "pages").rglob("*") if p.is_file())
        raw = bytearray(page.read_bytes())
        raw[-1] ^= 0xFF
        page.write_bytes(bytes(raw))
        return
    env = lmdb.open(str(path), max_dbs=4, subdir=True)
    with env.begin(write=True, db=env.open_db(b"pages")) as txn:
        key, value = next(iter(txn.cursor()))
        raw = bytearray(value)
        raw[-1] ^= 0xFF
        txn.put(key, bytes(raw))
    env.close()


@pytest.mark.parametrize("backend", ["disk", "lmdb", "file"])
def test_summary_counts_pages_and_names_the_fingerprint(tmp_path: Path, backend: str) -> None:
    s = summarize(_store(tmp_path, backend))
    assert (s.kind, s.pages, s.payload_bytes) == (backend, N, N * PAGE)
    assert s.bytes > s.payload_bytes and s.page_sizes == {PAGE: N}
    assert s.fingerprint == _fingerprint() and s.format_version == 1


@pytest.mark.parametrize("backend", ["disk", "lmdb", "file"])
def test_verify_finds_a_flipped_byte_and_changes_nothing(tmp_path: Path, backend: str) -> None:
    path = _store(tmp_path, backend)
    assert verify(path).ok and verify(path).checked == N
    _damage_one(path, backend)
    result = verify(path)
    assert not result.ok and result.verdicts == {"ok": N - 1, "bad_checksum": 1}
    assert len(result.damaged) == 1
    assert summarize(path).pages == N  # reported, not deleted


@pytest.mark.parametrize("backend", ["disk", "lmdb", "file"])
def test_store_commands(tmp_path: Path, backend: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = _store(tmp_path, backend)
    assert main(["store", "inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"pages:       {N}" in out and "as the config says" in out
    assert main(["store", "inspect", str(path), "--set", "model.num_layers=2"]) == 0
    assert "another model" in capsys.readouterr().out
    assert main(["store", "verify", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    _damage_one(path, backend)
    assert main(["store", "verify", str(path)]) == 1
    assert "bad_checksum" in capsys.readouterr().out


def test_not_a_store_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["store", "verify", str(tmp_path)]) == 2
    assert "not a disk, lmdb or file store" in capsys.readouterr().err


def test_a_directory_of_several_kinds_is_read_only_as_the_kind_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An lmdb store and a file store in one directory (a migration's leftovers, a config
    # changed under the same path): which one is meant is the user's to say.
    path = _store(tmp_path, "lmdb")
    file_store = _store(tmp_path, "file")
    for entry in file_store.iterdir():
        entry.rename(path / entry.name)
    for command in ("inspect", "verify"):
        assert main(["store", command, str(path)]) == 2
        assert "several kinds (lmdb, file): name the one to read with --kind" in (
            capsys.readouterr().err
        )
    assert main(["store", "inspect", str(path), "--kind", "file", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "file"
    assert summarize(path, "lmdb").pages == N and verify(path, "file").checked == N
    assert main(["store", "verify", str(path), "--kind", "disk"]) == 2
    assert "holds no disk store (found: lmdb, file)" in capsys.readouterr().err
