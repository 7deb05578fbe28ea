"""Fixtures shared by the storage backend tests.

Helpers are handed out through fixtures rather than imported, so these tests
do not depend on how pytest puts test directories on ``sys.path``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage_backends import StorageBackend, StorageConfig, create

BACKEND_NAMES = ("memory", "lmdb", "file")

MakeBackend = Callable[[StorageConfig], StorageBackend]


class Pages:
    """Deterministic page keys, payloads and buffers."""

    @staticmethod
    def key(i: int) -> bytes:
        return hashlib.sha256(f"page-{i}".encode()).digest()

    @staticmethod
    def payload(i: int, size: int) -> bytes:
        seed = hashlib.sha256(f"payload-{i}".encode()).digest()
        return (seed * (size // len(seed) + 1))[:size]

    def keys(self, ids: range | list[int]) -> list[bytes]:
        return [self.key(i) for i in ids]

    def payloads(self, ids: range | list[int], size: int) -> list[memoryview]:
        return [memoryview(self.payload(i, size)) for i in ids]

    @staticmethod
    def buffers(count: int, size: int, fill: int = 0xAB) -> list[memoryview]:
        return [memoryview(bytearray([fill]) * size) for _ in range(count)]

    @staticmethod
    def config(name: str, root: Path, max_bytes: int = 64 << 20) -> StorageConfig:
        return StorageConfig(backend=name, path=str(root / f"{name}-store"), max_bytes=max_bytes)


@pytest.fixture
def pages() -> Pages:
    return Pages()


@pytest.fixture(params=BACKEND_NAMES)
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_backend() -> Iterator[MakeBackend]:
    """Create backends from configs; closes them all at teardown."""
    opened: list[StorageBackend] = []

    def make(config: StorageConfig) -> StorageBackend:
        backend = create(config.backend, config)
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        backend.close()


@pytest.fixture
def backend(
    backend_name: str, tmp_path: Path, pages: Pages, make_backend: MakeBackend
) -> StorageBackend:
    return make_backend(pages.config(backend_name, tmp_path))
