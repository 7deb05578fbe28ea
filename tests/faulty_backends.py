"""Storage backends that fail on purpose, shared by the storage and cache tests."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NoReturn

from storage_backends import StorageStats
from storage_backends.memory import MemoryBackend


class RaisingBackend:
    """A backend whose every method raises (a bug, a dead disk, a damaged file);
    ``calls`` counts the calls that reached it."""

    def __init__(self) -> None:
        self.calls = 0

    def _fail(self) -> NoReturn:
        self.calls += 1
        raise RuntimeError("backend exploded")

    def exists(self, keys: Sequence[bytes]) -> int:
        self._fail()

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        self._fail()

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        self._fail()

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self._fail()

    def delete(self, keys: Sequence[bytes]) -> int:
        self._fail()

    def take_removed(self) -> list[bytes]:
        self._fail()

    def stats(self) -> StorageStats:
        self._fail()

    def close(self) -> None:
        self._fail()


class ScatterOnlyMemory(MemoryBackend):
    """A memory store whose plain ``get`` refuses a batch: a caller that should read
    pages straight into their runs (``get_scatter``) gets misses if it stages them."""

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        raise RuntimeError("get() called where get_scatter() was expected")


class GatherOnlyMemory(MemoryBackend):
    """A memory store whose plain ``put`` refuses a batch: a caller that should store
    pages straight from their runs (``put_gather``) gets failures if it stages them."""

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        raise RuntimeError("put() called where put_gather() was expected")

    def put_gather(self, keys: Sequence[bytes], src: list[Sequence[memoryview]]) -> list[bool]:
        pages = [memoryview(b"".join(bytes(run) for run in runs)) for runs in src]
        return MemoryBackend.put(self, keys, pages)


class SlowMemory(MemoryBackend):
    """A memory store whose every read call takes ``DELAY_S`` more (a slow link)."""

    DELAY_S = 0.05

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        time.sleep(self.DELAY_S)
        return MemoryBackend.get(self, keys, dst)

    def get_scatter(self, keys: Sequence[bytes], dst: list[Sequence[memoryview]]) -> list[bool]:
        time.sleep(self.DELAY_S)
        return MemoryBackend.get_scatter(self, keys, dst)
