"""Stores that never answer, for the linker's bounded waits (``package.module:Class``
backends; ``RELEASE`` lets the stuck calls return at the end of a test)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from storage_backends.base import StorageStats
from storage_backends.config import StorageConfig

RELEASE = threading.Event()
_BOUND_S = 60.0  # a stuck call returns by then anyway


class StuckRead:
    """Every page is present; reading one blocks until ``RELEASE`` (then a miss)."""

    def __init__(self, config: StorageConfig) -> None:
        self.config = config

    def exists(self, keys: Sequence[bytes]) -> int:
        return len(keys)

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        RELEASE.wait(_BOUND_S)
        return [False] * len(keys)

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        return [True] * len(keys)

    def take_removed(self) -> list[bytes]:
        return []

    def delete(self, keys: Sequence[bytes]) -> int:
        return 0

    def stats(self) -> StorageStats:
        return StorageStats(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)

    def close(self) -> None:
        pass


class StuckLookup(StuckRead):
    """A lookup blocks until ``RELEASE`` (then finds nothing)."""

    def exists(self, keys: Sequence[bytes]) -> int:
        RELEASE.wait(_BOUND_S)
        return 0
