"""GuardedBackend: whatever a backend raises, the cache sees a miss or a failed put.

A store is a cache, not a database. The cache talks to its backend only
through this wrapper, so a backend that fails (a damaged LMDB file, a full
disk, a bug) costs hits, never the engine: every exception is counted in
``StorageStats.errors`` and reported as the method's "nothing" result. A
``StoreDamagedError`` (the store's structure failed) also closes the backend,
moves its store aside and opens an empty one in its place.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from storage_backends.base import FailedCalls, StorageBackend, StorageStats
from storage_backends.batch import check_batch, check_keys
from storage_backends.config import StorageConfig
from storage_backends.counters import StatCounters
from storage_backends.errors import StorageClosedError, StoreDamagedError
from storage_backends.log_limit import LogLimiter
from storage_backends.registry import create
from storage_backends.scatter import Staging, check_gather, check_scatter, get_scatter, put_gather
from storage_backends.store_dir import quarantine_store
from storage_backends.store_kind import as_found

logger = logging.getLogger(__name__)

_R = TypeVar("_R")
Opener = Callable[[], StorageBackend]


class GuardedBackend:
    """A StorageBackend that never raises for a backend failure.

    Misuse is still the caller's error: malformed arguments raise ValueError
    (checked here, before the backend sees them) and calls after ``close()``
    raise StorageClosedError. ``replace`` (None: damage only makes misses)
    opens the store anew after a damaged one was closed; it runs on the I/O
    worker that met the damage, after the calls in flight finished (at most
    ``timeout_s``). Thread-safe like the protocol.
    """

    def __init__(
        self, backend: StorageBackend, replace: Opener | None = None, timeout_s: float = 5.0
    ) -> None:
        self._backend = backend
        self._replace = replace
        self._timeout_s = timeout_s
        self._cond = threading.Condition()
        self._active = 0
        self._broken = False  # damage met: misses until the store is replaced
        self._closed = False
        self._counters = StatCounters()
        self._last_stats: StorageStats | None = None
        self._log = LogLimiter(logger)
        self._staging = Staging()  # put_gather's, for a backend without GatherPut

    @property
    def backend(self) -> StorageBackend:
        """The backend currently behind the guard (for diagnostics and tests)."""
        return self._backend

    def exists(self, keys: Sequence[bytes]) -> int:
        check_keys(keys)
        return self._call("exists", lambda b: b.exists(keys), 0)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        check_keys(keys)
        return self._call("contains", lambda b: _contains(b, keys), [False] * len(keys))

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        check_batch(keys, dst, writable=True)
        return self._call("get", lambda b: b.get(keys, dst), [False] * len(keys))

    def get_scatter(self, keys: Sequence[bytes], dst: list[Sequence[memoryview]]) -> list[bool]:
        check_scatter(keys, dst)
        return self._call("get", lambda b: get_scatter(b, keys, dst), [False] * len(keys))

    def failed_calls(self) -> int:
        """Calls that raised here plus the backend's own failed calls, where it counts
        them without I/O (``FailedCalls``); no I/O, thread-safe."""
        backend = self._backend
        inner = backend.failed_calls() if isinstance(backend, FailedCalls) else 0
        return self._counters.snapshot(0, 0, 0).errors + inner

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        check_batch(keys, src, writable=False)
        return self._call("put", lambda b: b.put(keys, src), [False] * len(keys))

    def put_gather(self, keys: Sequence[bytes], src: list[Sequence[memoryview]]) -> list[bool]:
        check_gather(keys, src)
        return self._call(
            "put", lambda b: put_gather(b, keys, src, self._staging), [False] * len(keys)
        )

    def delete(self, keys: Sequence[bytes]) -> int:
        check_keys(keys)
        return self._call("delete", lambda b: b.delete(keys), 0)

    def take_removed(self) -> list[bytes]:
        return self._call("take_removed", lambda b: b.take_removed(), [])

    def stats(self) -> StorageStats:
        stats = self._call("stats", lambda b: b.stats(), None)
        if stats is not None:
            self._last_stats = stats
        base = stats or self._last_stats or StatCounters().snapshot(0, 0, 0)
        mine = self._counters.snapshot(0, 0, 0)
        return dataclasses.replace(
            base,
            errors=base.errors + mine.errors,
            quarantined=base.quarantined + mine.quarantined,
        )

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            idle = self._wait_idle(0)
        if idle:  # else a call still runs on it: leave the store open (crash-safe) rather
            self._close_backend(self._backend)  # than pull its memory map away
        else:
            logger.warning("storage calls still running after %.1f s; not closed", self._timeout_s)

    def _call(self, name: str, call: Callable[[StorageBackend], _R], miss: _R) -> _R:
        with self._cond:
            if self._closed:
                raise StorageClosedError("storage backend is closed")
            if self._broken:
                return miss
            self._active += 1
            backend = self._backend
        try:
            return call(backend)
        except StoreDamagedError as exc:
            self._counters.record_error()
            self._on_damage(backend, exc)
        except Exception as exc:  # a store is a cache: any failure is a miss
            self._counters.record_error()
            self._log.failure(f"storage {name} failed; reported as a miss", exc)
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()
        return miss

    def _on_damage(self, backend: StorageBackend, exc: StoreDamagedError) -> None:
        """Close the damaged store, move it aside and open an empty one."""
        with self._cond:
            if self._broken or backend is not self._backend or self._closed:
                return  # another worker already handles it
            self._broken = True
            logger.error("storage is damaged (%s); replacing it with an empty store", exc)
            idle = self._wait_idle(1)
        if idle:  # never close under a call still in flight: its memory map would vanish
            self._close_backend(backend)
        self._counters.record_quarantine()
        fresh = self._open_replacement()
        with self._cond:
            if fresh is not None and not self._closed:
                self._backend, self._broken = fresh, False
            elif fresh is not None:
                self._close_backend(fresh)

    def _wait_idle(self, own: int) -> bool:
        """Wait (holding the condition) until only ``own`` calls are active."""
        return self._cond.wait_for(lambda: self._active <= own, timeout=self._timeout_s)

    def _open_replacement(self) -> StorageBackend | None:
        if self._replace is None:
            return None
        try:
            return self._replace()
        except Exception:
            logger.exception("could not open an empty store in place of the damaged one")
            return None

    def _close_backend(self, backend: StorageBackend) -> None:
        try:
            backend.close()
        except Exception as exc:
            self._counters.record_error()
            self._log.failure("storage close failed", exc)


def open_guarded(name: str, config: StorageConfig) -> GuardedBackend:
    """Create backend ``name`` (``storage_backends.create``) behind a guard
    that, when the store turns out damaged at run time, moves it aside and
    starts an empty one. A local store directory that already holds another
    kind of store (``store_kind``) is opened as that kind, logged, never
    replaced by an empty one (the empty store after a quarantine is ``name``'s).
    Raises what ``create`` raises."""

    def replace() -> StorageBackend:
        if config.path:
            moved = quarantine_store(Path(config.path))
            logger.error("damaged store moved to %s", moved)
        return create(name, config)

    found = as_found(config) if name == config.backend else None
    first = create(found.backend, found) if found is not None else create(name, config)
    return GuardedBackend(first, replace, config.timeout_s)


def _contains(backend: StorageBackend, keys: Sequence[bytes]) -> list[bool]:
    """``backend.contains``; a plugin written before it existed is asked key by key."""
    if hasattr(backend, "contains"):
        return backend.contains(keys)
    return [backend.exists([key]) == 1 for key in keys]
