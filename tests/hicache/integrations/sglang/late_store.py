"""A store whose one armed read answers late: after the linker gave up on it and while
the next load's read is in flight (a ``package.module:Class`` backend for the linker's
tests; pages live in this process, shared by every instance).

``LATE.arm()`` makes the next ``get`` wait until another ``get`` has read its own pages;
then the late one writes its pages into the buffers it was given (the late bytes), and
only then does the other return. So if the first load's buffers were reused by the
second, the late bytes land in them between the second read and its copy to the device.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from storage_backends.base import StorageStats
from storage_backends.config import StorageConfig

_BOUND_S = 30.0  # every wait here is bounded


class Late:
    """The read that answers late, and the one that lets it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed = False
        self._pending = False
        self._release = threading.Event()
        self.landed = threading.Event()  # the late read wrote its pages

    def arm(self) -> None:
        with self._lock:
            self._armed, self._pending = True, False
            self._release.clear()
            self.landed.clear()

    def claim(self) -> bool:
        """Whether this read is the late one."""
        with self._lock:
            late, self._armed = self._armed, False
            self._pending = self._pending or late
            return late

    def wait_turn(self) -> None:
        self._release.wait(_BOUND_S)

    def let_the_late_one_land(self) -> None:
        """From another read: let the late read write its pages, and wait until it has."""
        with self._lock:
            pending, self._pending = self._pending, False
        if pending:
            self._release.set()
            self.landed.wait(_BOUND_S)


LATE = Late()
PAGES: dict[bytes, bytes] = {}


class LateRead:
    """Pages in ``PAGES``; the read ``LATE`` armed answers late."""

    def __init__(self, config: StorageConfig) -> None:
        self.config = config

    def exists(self, keys: Sequence[bytes]) -> int:
        n = 0
        while n < len(keys) and keys[n] in PAGES:
            n += 1
        return n

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        return [key in PAGES for key in keys]

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        if LATE.claim():
            LATE.wait_turn()
            hits = self._copy(keys, dst)
            LATE.landed.set()
            return hits
        hits = self._copy(keys, dst)
        LATE.let_the_late_one_land()
        return hits

    @staticmethod
    def _copy(keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        hits = []
        for key, buf in zip(keys, dst, strict=True):
            page = PAGES.get(key)
            hit = page is not None and len(page) == len(buf)
            if hit:
                buf[:] = page
            hits.append(hit)
        return hits

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        for key, page in zip(keys, src, strict=True):
            PAGES.setdefault(key, bytes(page))
        return [True] * len(keys)

    def take_removed(self) -> list[bytes]:
        return []

    def delete(self, keys: Sequence[bytes]) -> int:
        return sum(PAGES.pop(key, None) is not None for key in keys)

    def stats(self) -> StorageStats:
        return StorageStats(len(PAGES), sum(map(len, PAGES.values())), 0, 0, 0, 0, 0, 0, 0, 0)

    def close(self) -> None:
        pass
