"""StoreSlot: the daemon's store at one path, replaced by an empty one when it turns out
damaged or when its directory was deleted or replaced under the running daemon."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TypeVar

from hicache.daemon.record_store import RecordStore, open_record_store
from storage_backends.base import StorageStats
from storage_backends.config import StorageConfig
from storage_backends.errors import StoreDamagedError
from storage_backends.store_dir import quarantine_store

logger = logging.getLogger(__name__)
_R = TypeVar("_R")


class _DirIdentity(NamedTuple):
    device: int
    inode: int


def _identity(path: Path) -> _DirIdentity | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _DirIdentity(st.st_dev, st.st_ino)


class _Current(NamedTuple):
    """The store in use and how many were replaced before it (read as one object, so a
    caller never pairs a store with another's generation)."""

    store: RecordStore
    generation: int


class StoreSlot:
    """Holds the RecordStore of one path, whatever its kind.

    ``run`` calls into the current store; a ``StoreDamagedError`` moves the store
    aside (``<path>.damaged-<time>``, logged) for an empty one and runs the call
    once more there. ``run_write`` first checks that the directory is still the one
    opened: one deleted or replaced meanwhile is logged and a new store is opened
    there, so no write is acknowledged into files no one can open again.
    Thread-safe: any thread may call ``run``/``run_write``/``stats``; ``close`` once
    nothing else runs. A replaced store is left open (not closed) until the process
    exits: readers may still be inside it, and a damaged store may abort in the
    write that closing it would make. Raises what opening a store raises.
    """

    def __init__(
        self, config: StorageConfig, opener: Callable[[StorageConfig], RecordStore] | None = None
    ) -> None:
        self._config = config
        self._open = opener or open_record_store
        self._path = config.store_dir()
        self._lock = threading.Lock()
        self._current = _Current(self._open(config), 0)
        self._identity = _identity(self._path)
        self._retired: list[RecordStore] = []

    @property
    def replaced(self) -> int:
        """How many stores this slot replaced (damaged, or their directory gone)."""
        return self._current.generation

    def run(self, call: Callable[[RecordStore], _R]) -> _R:
        """``call`` on the current store; on damage, once more on an empty one."""
        current = self._current
        try:
            return call(current.store)
        except StoreDamagedError as exc:
            self._replace(current.generation, f"damaged ({exc})", quarantine=True)
        return call(self._current.store)

    def run_write(self, call: Callable[[RecordStore], _R]) -> _R:
        """``run`` after checking that the store's directory is still the one opened."""
        if _identity(self._path) != self._identity:
            why = "deleted or replaced while open"
            self._replace(self._current.generation, why, quarantine=False)
        return self.run(call)

    def _replace(self, generation: int, why: str, quarantine: bool) -> None:
        with self._lock:
            if generation != self._current.generation:
                return  # another thread replaced it already
            moved = quarantine_store(self._path) if quarantine else None
            logger.error(
                "daemon store %s was %s: its pages are gone; %sstarting an empty store there",
                self._path,
                why,
                f"moved to {moved}, " if moved is not None else "",
            )
            fresh = self._open(self._config)
            self._retired.append(self._current.store)
            self._current = _Current(fresh, generation + 1)
            self._identity = _identity(self._path)

    def stats(self) -> StorageStats:
        return self.run(lambda store: store.stats())

    def close(self) -> None:
        self._current.store.close()
