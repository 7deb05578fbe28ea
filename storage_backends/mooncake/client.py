"""Talking to a Mooncake Store: the endpoint, the client's setup, status codes, staging buffers.

Used by ``MooncakeBackend``; ``mooncake`` itself is imported only when a client is opened.
"""

from __future__ import annotations

import ctypes
import enum
import socket
import threading
from typing import NamedTuple, Protocol
from urllib.parse import parse_qs, urlsplit

from storage_backends.config import StorageConfig
from storage_backends.errors import StorageOpenError

MIN_STAGING = 16 << 20


class Status(enum.IntEnum):
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


GET_MISSES = frozenset(
    {Status.OBJECT_NOT_FOUND, Status.REPLICA_IS_NOT_READY, Status.INVALID_PARAMS}
)


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


def open_store(config: StorageConfig) -> MooncakeStore:
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
        MIN_STAGING,
        endpoint.protocol,
        "",
        endpoint.master,
    )
    if status != Status.OK:
        raise StorageOpenError(f"mooncake setup with master {endpoint.master} failed: {status}")
    return store


class StagingBuffer(NamedTuple):
    data: bytearray
    address: int

    def view(self, offset: int, size: int) -> memoryview:
        return memoryview(self.data)[offset : offset + size]


class StagingPool:
    """Registered host buffers, one per call in flight; thread-safe."""

    def __init__(self, store: MooncakeStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._free: list[StagingBuffer] = []
        self._abandoned: list[StagingBuffer] = []  # kept alive: a given-up transfer may still write

    def acquire(self, size: int) -> StagingBuffer:
        with self._lock:
            for i, buf in enumerate(self._free):
                if len(buf.data) >= size:
                    return self._free.pop(i)
        data = bytearray(max(MIN_STAGING, 1 << (size - 1).bit_length()))
        address = ctypes.addressof((ctypes.c_char * len(data)).from_buffer(data))
        if self._store.register_buffer(address, len(data)) != Status.OK:
            raise MemoryError("mooncake could not register a staging buffer")
        return StagingBuffer(data, address)

    def release(self, buf: StagingBuffer, reusable: bool) -> None:
        with self._lock:
            (self._free if reusable else self._abandoned).append(buf)


class Slots(NamedTuple):
    offsets: list[int]
    sizes: list[int]
    total: int


def layout(sizes: list[int]) -> Slots:
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += size
    return Slots(offsets, sizes, total)
