"""create(): names, errors and lazy imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from storage_backends import StorageBackend, StorageConfig, create
from storage_backends.file.backend import FileBackend
from storage_backends.lmdb.backend import LmdbBackend
from storage_backends.memory import MemoryBackend


@pytest.mark.parametrize(
    ("name", "cls"), [("memory", MemoryBackend), ("lmdb", LmdbBackend), ("file", FileBackend)]
)
def test_create_known_backends(tmp_path: Path, name: str, cls: type) -> None:
    backend = create(name, StorageConfig(backend=name, path=str(tmp_path / "s")))
    try:
        assert isinstance(backend, cls)
        assert isinstance(backend, StorageBackend)
    finally:
        backend.close()


def test_unknown_name_lists_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown storage backend 'nope'.*file.*lmdb.*memory"):
        create("nope", StorageConfig())


def test_none_means_disabled() -> None:
    with pytest.raises(ValueError, match="disabled"):
        create("none", StorageConfig())


def test_importing_the_package_does_not_import_backends() -> None:
    code = (
        "import sys, storage_backends\n"
        "assert 'lmdb' not in sys.modules, 'lmdb imported eagerly'\n"
        "assert 'storage_backends.file.backend' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
