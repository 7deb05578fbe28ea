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
one by one in ``_Code``; anything unexpected is a miss or a failed put, logged.

``stats()`` cannot list a Mooncake Store: ``entries`` and ``bytes_used`` count
the pages this object stored minus those it removed (other clients' pages and
the store's own evictions are not seen).
"""

from __future__ import annotations

import ctypes
import enum
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import NamedTuple, Protocol, TypeVar
from urllib.parse import parse_qs, urlsplit

from storage_backends.base import StorageStats
from storage_backends.batch import check_batch, check_keys, count_leading
from storage_backends.config import StorageConfig
from storage_backends.counters import StatCounters
from storage_backends.errors import StorageClosedError, StorageOpenError
from storage_backends.page_format import (
    HEADER_BYTES,
    Verdict,
    build_header,
    copy_verified,
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_MIN_STAGING = 16 << 20


class _Code(enum.IntEnum):
    """Mooncake Store status codes this backend tells apart (mooncake-store types.h)."""

    OK = 0
    INVALID_PARAMS = -600  # a get buffer smaller than the object: another page size
    REPLICA_IS_NOT_READY = -703  # being written by another client: a miss for now
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706  # being read: cannot be removed yet
    LEASE_EXPIRED = -707  # a read outlived its lease and was discarded: a miss, logged
    TRANSFER_FAIL = -800  # the holder is gone, or the object is not the size asked for
    RPC_FAIL = -900  # the master is unreachable


_GET_MISSES = frozenset({_Code.OBJECT_NOT_FOUND, _Code.REPLICA_IS_NOT_READY, _Code.INVALID_PARAMS})


class MooncakeStore(Protocol):
    """The slice of ``mooncake.store.MooncakeDistributedStore`` this backend calls."""

    def setup(
        self, host: str, metadata: str, segment: int, buffer: int, proto: str, dev: str, addr: str
    ) -> int: ...
    def register_buffer(self, ptr: int, size: int) -> int: ...
    def batch_is_exist(self, keys: list[str]) -> list[int]: ...
    def batch_get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]: ...
    def batch_put_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]: ...
    def batch_remove(self, keys: list[str]) -> list[int]: ...
    def close(self) -> int: ...


class Endpoint(NamedTuple):
    master: str  # host:port
    host: str
    port: int
    metadata: str
    local_hostname: str
    protocol: str
    segment_bytes: int


def parse_endpoint(endpoint: str) -> Endpoint:
    """``mooncake://host:port[?metadata=…&local_hostname=…&protocol=…&segment_bytes=…]``."""
    parts = urlsplit(endpoint)
    if parts.scheme != "mooncake" or not parts.hostname or parts.port is None:
        raise ValueError(f"storage.endpoint must be mooncake://host:port[?...], got {endpoint!r}")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(query) - {"metadata", "local_hostname", "protocol", "segment_bytes"}
    if unknown:
        raise ValueError(f"storage.endpoint: unknown mooncake option(s) {sorted(unknown)}")
    segment = query.get("segment_bytes", "0")
    if not segment.isdigit():
        raise ValueError(f"storage.endpoint: segment_bytes must be an integer, got {segment!r}")
    return Endpoint(
        master=f"{parts.hostname}:{parts.port}",
        host=parts.hostname,
        port=parts.port,
        metadata=query.get("metadata", "P2PHANDSHAKE"),
        local_hostname=query.get("local_hostname", "127.0.0.1"),
        protocol=query.get("protocol", "tcp"),
        segment_bytes=int(segment),
    )


def _open_store(config: StorageConfig) -> MooncakeStore:
    """A set-up client; StorageOpenError if the master is unreachable (setup would block ~90 s)."""
    endpoint = parse_endpoint(config.endpoint)
    try:
        socket.create_connection((endpoint.host, endpoint.port), config.timeout_s).close()
    except OSError as exc:
        raise StorageOpenError(f"mooncake master {endpoint.master} unreachable: {exc}") from exc
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        raise StorageOpenError(f"the mooncake backend needs mooncake installed: {exc}") from exc
    store: MooncakeStore = MooncakeDistributedStore()
    status = store.setup(
        endpoint.local_hostname,
        endpoint.metadata,
        endpoint.segment_bytes,
        _MIN_STAGING,
        endpoint.protocol,
        "",
        endpoint.master,
    )
    if status != _Code.OK:
        raise StorageOpenError(f"mooncake setup with master {endpoint.master} failed: {status}")
    return store


class _Buffer(NamedTuple):
    data: bytearray
    address: int

    def view(self, offset: int, size: int) -> memoryview:
        return memoryview(self.data)[offset : offset + size]


class _StagingPool:
    """Registered host buffers, one per call in flight; thread-safe."""

    def __init__(self, store: MooncakeStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._free: list[_Buffer] = []
        self._abandoned: list[_Buffer] = []  # kept alive: a given-up transfer may still write

    def acquire(self, size: int) -> _Buffer:
        with self._lock:
            for i, buf in enumerate(self._free):
                if len(buf.data) >= size:
                    return self._free.pop(i)
        data = bytearray(max(_MIN_STAGING, 1 << (size - 1).bit_length()))
        address = ctypes.addressof((ctypes.c_char * len(data)).from_buffer(data))
        if self._store.register_buffer(address, len(data)) != _Code.OK:
            raise MemoryError("mooncake could not register a staging buffer")
        return _Buffer(data, address)

    def release(self, buf: _Buffer, reusable: bool) -> None:
        with self._lock:
            (self._free if reusable else self._abandoned).append(buf)


class _Slots(NamedTuple):
    offsets: list[int]
    sizes: list[int]
    total: int


def _slots(sizes: list[int]) -> _Slots:
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += size
    return _Slots(offsets, sizes, total)


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
        self._store = _open_store(config)
        self._staging = _StagingPool(self._store)
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
        slots = _slots([HEADER_BYTES + len(view) for view in views])
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
            elif code not in _GET_MISSES:
                logger.warning("mooncake get of %s: status %d (a miss)", names[i], code)
        self._staging.release(buf, reusable=answer.finished)
        return _Read(hits, damaged)

    def _remove(self, keys: Sequence[bytes]) -> _Removal:
        """Remove objects (a leased one stays: OBJECT_HAS_LEASE)."""
        names = self._names(keys)
        codes = self._call(lambda: self._store.batch_remove(names), len(names), "remove").codes
        if codes is None:
            return _Removal([], [])
        removed = [key for key, code in zip(keys, codes, strict=True) if code == _Code.OK]
        self._counters.note_removed(removed)
        gone = [
            key for key, code in zip(keys, codes, strict=True) if code == _Code.OBJECT_NOT_FOUND
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
        slots = _slots([HEADER_BYTES + len(views[i]) for i in todo])
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
            results[i] = code in (_Code.OK, _Code.OBJECT_ALREADY_EXISTS)
            stored += code == _Code.OK
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
