"""MooncakeBackend: pages in a Mooncake Store (the optional ``mooncake`` backend).

``storage.endpoint`` is ``mooncake://<master host>:<rpc port>`` with optional
query fields ``metadata`` (default ``P2PHANDSHAKE``), ``local_hostname``
(default ``127.0.0.1``), ``protocol`` (default ``tcp``) and ``segment_bytes``
(memory this client lends to the store; default 0: other clients, such as a
``mooncake_client`` holder, hold the pages). Each page is one object named
``<key_prefix>:<fingerprint>:<page key hex>`` holding the usual header +
payload, checked on every read.

Transfers go through registered staging buffers: ``batch_get_into`` lands the
stored header + payload there, and the payload is copied into ``dst`` only
after the checks (the protocol's rule that ``dst`` changes only on a hit rules
out reading straight into it). Every call runs on a worker thread and is given
up after ``timeout_s``; its staging buffer is then never reused, since the
transfer may still write into it. Mooncake answers with status codes, mapped
one by one (``client.Status``); anything unexpected is a miss or a failed put, logged.

A Mooncake Store cannot be listed: ``stats()`` reports the counters, with
``entries`` and ``bytes_used`` 0. A damaged object that a read cannot remove
(its own read lease protects it for a while) is removed by a later call; until
then a put of its key fails.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import NamedTuple

from storage_backends.base import StorageStats
from storage_backends.batch import check_batch, check_keys, count_leading
from storage_backends.config import StorageConfig
from storage_backends.counters import StatCounters
from storage_backends.errors import StorageClosedError
from storage_backends.mooncake.client import (
    GET_MISSES,
    StagingPool,
    Status,
    layout,
    open_store,
)
from storage_backends.page_format import (
    HEADER_BYTES,
    Verdict,
    build_header,
    copy_verified,
)

logger = logging.getLogger(__name__)


class _Read(NamedTuple):
    hits: list[bool]
    damaged: list[bytes]


class _Removal(NamedTuple):
    removed: list[bytes]  # removed now
    absent: list[bytes]  # removed now or already gone


class _Written(NamedTuple):
    results: list[bool]
    stored: int


class _Answer(NamedTuple):
    codes: list[int] | None  # None: the call failed or timed out
    finished: bool  # False: given up while the transfer may still run


class MooncakeBackend:
    """Pages in a Mooncake Store; see the module docstring. Thread-safe."""

    def __init__(self, config: StorageConfig) -> None:
        self._config = config
        self._prefix = f"{config.key_prefix}:{config.fingerprint}:"
        self._store = open_store(config)
        self._staging = StagingPool(self._store)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mooncake-io")
        self._counters = StatCounters()
        self._lock = threading.Lock()
        # Damaged objects a read could not remove (its own lease protects them for a while).
        self._damaged: set[bytes] = set()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError("MooncakeBackend is closed")

    def _names(self, keys: Sequence[bytes]) -> list[str]:
        return [self._prefix + key.hex() for key in keys]

    def _call(self, call: Callable[[], list[int]], count: int, what: str) -> _Answer:
        """Run one store call on a worker; wait at most ``timeout_s``."""
        future = self._pool.submit(call)
        try:
            codes = [int(code) for code in future.result(timeout=self._config.timeout_s)]
        except FutureTimeout:
            logger.warning("mooncake %s gave up after %.1f s", what, self._config.timeout_s)
            return _Answer(None, finished=False)
        except Exception as exc:  # a failed call is a miss, whatever the binding raised
            logger.warning("mooncake %s failed: %r", what, exc)
            return _Answer(None, finished=True)
        if len(codes) != count:
            logger.warning("mooncake %s answered %d codes for %d keys", what, len(codes), count)
            return _Answer(None, finished=True)
        return _Answer(codes, finished=True)

    def exists(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        if not keys:
            return 0
        names = self._names(keys)
        codes = self._call(lambda: self._store.batch_is_exist(names), len(names), "exists").codes
        return count_leading(code == 1 for code in codes or [])

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        self._check_open()
        check_keys(keys)
        if not keys:
            return []
        names = self._names(keys)
        codes = self._call(lambda: self._store.batch_is_exist(names), len(names), "contains").codes
        return [code == 1 for code in codes] if codes is not None else [False] * len(keys)

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        self._check_open()
        views = check_batch(keys, dst, writable=True)
        read = self._read(keys, views) if keys else _Read([], [])
        corrupt = len(read.damaged)
        if read.damaged:
            logger.warning("found %d damaged pages in mooncake", corrupt)
            with self._lock:
                self._damaged.update(read.damaged)
            self._remove_damaged()
        n_hits = sum(read.hits)
        self._counters.record_get(n_hits, len(keys) - n_hits, corrupt)
        return read.hits

    def _read(self, keys: Sequence[bytes], views: list[memoryview]) -> _Read:
        """Fetch into staging, check, and copy intact pages of the right size into ``views``."""
        slots = layout([HEADER_BYTES + len(view) for view in views])
        buf = self._staging.acquire(slots.total)
        names = self._names(keys)
        ptrs = [buf.address + offset for offset in slots.offsets]
        answer = self._call(
            lambda: self._store.batch_get_into(names, ptrs, slots.sizes), len(keys), "get"
        )
        hits, damaged = [False] * len(keys), []
        for i, code in enumerate(answer.codes or []):
            if code > 0:
                verdict = copy_verified(buf.view(slots.offsets[i], code), keys[i], views[i])
                hits[i] = verdict is Verdict.OK
                if verdict.corrupt:
                    damaged.append(keys[i])
            elif code not in GET_MISSES:
                logger.warning("mooncake get of %s: status %d (a miss)", names[i], code)
        self._staging.release(buf, reusable=answer.finished)
        return _Read(hits, damaged)

    def _remove(self, keys: Sequence[bytes]) -> _Removal:
        """Remove objects (a leased one stays: OBJECT_HAS_LEASE)."""
        names = self._names(keys)
        codes = self._call(lambda: self._store.batch_remove(names), len(names), "remove").codes
        if codes is None:
            return _Removal([], [])
        removed = [key for key, code in zip(keys, codes, strict=True) if code == Status.OK]
        self._counters.note_removed(removed)
        gone = [
            key for key, code in zip(keys, codes, strict=True) if code == Status.OBJECT_NOT_FOUND
        ]
        return _Removal(removed, removed + gone)

    def _remove_damaged(self) -> None:
        """Retry removing damaged objects; until then, a put of their keys fails."""
        with self._lock:
            pending = list(self._damaged)
        if pending:
            absent = self._remove(pending).absent
            with self._lock:
                self._damaged.difference_update(absent)

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self._check_open()
        views = check_batch(keys, src, writable=False)
        self._remove_damaged()
        limit = min(self._config.max_page_bytes, self._config.max_bytes - HEADER_BYTES)
        with self._lock:
            damaged = set(self._damaged)
        first: dict[bytes, int] = {}
        for i, view in enumerate(views):
            if len(view) <= limit and keys[i] not in damaged:
                first.setdefault(keys[i], i)
        done = self._write([keys[i] for i in first.values()], [views[i] for i in first.values()])
        ok = dict(zip(first, done.results, strict=True))
        results = [ok.get(key, False) for key in keys]
        failures = results.count(False)
        self._counters.record_put(done.stored, failures, 0)
        return results

    def _write(self, keys: list[bytes], views: list[memoryview]) -> _Written:
        """Put the pages not yet present (``batch_is_exist`` first, then ``batch_put_from``)."""
        if not keys:
            return _Written([], 0)
        names = self._names(keys)
        present = self._call(lambda: self._store.batch_is_exist(names), len(names), "exists")
        if present.codes is None:
            return _Written([False] * len(keys), 0)
        results = [code == 1 for code in present.codes]
        todo = [i for i, code in enumerate(present.codes) if code == 0]
        if not todo:
            return _Written(results, 0)
        slots = layout([HEADER_BYTES + len(views[i]) for i in todo])
        buf = self._staging.acquire(slots.total)
        for i, offset in zip(todo, slots.offsets, strict=True):
            buf.data[offset : offset + HEADER_BYTES] = build_header(keys[i], views[i])
            start = offset + HEADER_BYTES
            buf.data[start : start + len(views[i])] = views[i]
        put_names = [names[i] for i in todo]
        ptrs = [buf.address + offset for offset in slots.offsets]
        answer = self._call(
            lambda: self._store.batch_put_from(put_names, ptrs, slots.sizes), len(todo), "put"
        )
        self._staging.release(buf, reusable=answer.finished)
        if answer.codes is None:
            return _Written(results, 0)  # todo entries stay False
        stored = 0
        for i, code in zip(todo, answer.codes, strict=True):
            results[i] = code in (Status.OK, Status.OBJECT_ALREADY_EXISTS)
            stored += code == Status.OK
            if not results[i]:
                logger.warning("mooncake put of %s: status %d (not stored)", names[i], code)
        return _Written(results, stored)

    def delete(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        removed = len(self._remove(keys).removed) if keys else 0
        self._counters.record_deletes(removed)
        return removed

    def take_removed(self) -> list[bytes]:
        return self._counters.take_removed()

    def stats(self) -> StorageStats:
        """Counters only: a Mooncake Store cannot be listed, so entries and bytes_used are 0."""
        self._check_open()
        return self._counters.snapshot(0, 0, self._config.max_bytes)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._store.close()
