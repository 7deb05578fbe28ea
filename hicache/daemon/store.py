"""DaemonStore: tenant-scoped page records in a memory LRU in front of an LmdbBackend."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, TypeVar

from hicache.config.daemon import StoreConfig
from hicache.daemon.memory_lru import ByteLRU
from storage_backends import StorageConfig
from storage_backends.config import user_cache_dir
from storage_backends.errors import StoreDamagedError
from storage_backends.lmdb_backend import LmdbBackend
from storage_backends.page_format import HEADER_BYTES, Verdict, check_header, validate
from storage_backends.remote.protocol import Frame

logger = logging.getLogger(__name__)
_R = TypeVar("_R")

# GET keys read from LMDB per transaction, so a reply over its byte cap stops reading early.
_READ_CHUNK = 16
# Records smaller than this are copied before the memory tier keeps them (see _own).
_COPY_BELOW = 64 << 10


def scoped_key(tenant: str, key: bytes) -> bytes:
    """The store key of ``key`` for ``tenant``: a 32-byte digest, so tenants never collide
    (tenant names hold no NUL, so ``tenant NUL key`` is unambiguous)."""
    return hashlib.blake2b(tenant.encode() + b"\0" + key, digest_size=32).digest()


class Lookup(NamedTuple):
    """Records of a GET, None for a miss, with where the hits came from."""

    records: list[Frame | None]
    memory_hits: int
    store_hits: int
    truncated: bool  # later keys reported as misses because of the byte cap


class TenantSize(NamedTuple):
    """The store of one tenant that has a quota."""

    store_entries: int
    store_bytes: int
    store_capacity_bytes: int
    store_evictions: int


class StoreSize(NamedTuple):
    memory_entries: int
    memory_bytes: int
    memory_evictions: int
    store_entries: int
    store_bytes: int
    store_evictions: int
    store_corrupt: int
    store_put_failures: int
    store_capacity_bytes: int


def tenant_store_path(path: str, tenant: str) -> str:
    """Where the store of a tenant with a quota lives: beside the shared store (not inside
    it, so a quarantine of one never moves the other)."""
    return f"{path.rstrip('/')}.tenant-{tenant}"


def _lookup(records: list[Frame | None], from_memory: list[bool], truncated: bool) -> Lookup:
    memory_hits = sum(r is not None and m for r, m in zip(records, from_memory, strict=True))
    store_hits = sum(r is not None for r in records) - memory_hits
    return Lookup(records, memory_hits, store_hits, truncated)


def _own(record: Frame) -> Frame:
    """A small record copied out of its received frame: ZeroMQ packs small frames into
    shared receive buffers, and a view keeps the whole buffer alive (kilobytes per page)."""
    return bytes(record) if len(record) < _COPY_BELOW else record


def check_record(record: Frame, key: bytes) -> Verdict:
    """Header and checksum of a PUT's page record against the client's key."""
    return validate(memoryview(record), key, None)


class DaemonStore:
    """Page records (header + payload as the client framed them) by (tenant, key).

    Thread-safety: ``exists``/``get``/``size`` may run on any thread while one
    writer thread calls ``put``/``delete``; ``close`` once nothing else runs.
    A store found damaged at run time is moved aside for an empty one and the
    call is run there once more (a miss, or a write into the fresh store).
    The LRU caches only committed records. Records are stored in LMDB as the
    payload of an LMDB page, whose own checksum is verified on every read.
    Raises what the LmdbBackend raises on open (StorageOpenError).
    """

    def __init__(
        self, config: StoreConfig, max_page_bytes: int, quotas: Mapping[str, int] | None = None
    ) -> None:
        self._memory = ByteLRU(config.memory_bytes)
        path = config.path
        if not path:  # the per-user default, never the working directory
            default = user_cache_dir() / "daemon-store"
            default.parent.mkdir(parents=True, exist_ok=True)
            path = str(default)
        storage = StorageConfig(
            backend="lmdb",
            path=path,
            max_bytes=config.max_bytes,
            max_page_bytes=max_page_bytes,
            sync=config.sync,
        )
        self._lmdb = LmdbBackend(storage)
        # A tenant with a quota has a store of its own beside the shared one, so that its
        # pages are evicted only by its own writes and never evict anyone else's.
        self._tenants: dict[str, LmdbBackend] = {}
        try:
            for tenant, quota in (quotas or {}).items():
                own = dataclasses.replace(storage, path=tenant_store_path(path, tenant))
                self._tenants[tenant] = LmdbBackend(dataclasses.replace(own, max_bytes=quota))
        except BaseException:
            self.close()
            raise

    def _lmdb_for(self, tenant: str | None) -> LmdbBackend:
        return self._tenants.get(tenant, self._lmdb) if tenant is not None else self._lmdb

    def _guarded(self, tenant: str | None, call: Callable[[LmdbBackend], _R]) -> _R:
        """Run ``call`` on the tenant's store; a store found damaged is moved aside for an
        empty one (logged, counted) and ``call`` runs once more there."""
        lmdb = self._lmdb_for(tenant)
        generation = lmdb.generation
        try:
            return call(lmdb)
        except StoreDamagedError as exc:
            lmdb.replace_damaged(str(exc), generation)
        return call(lmdb)

    def exists(self, keys: Sequence[bytes], tenant: str | None = None) -> int:
        """How many leading (scoped) keys are present. Mutates nothing."""
        return self._guarded(tenant, lambda lmdb: self._exists(lmdb, keys))

    def _exists(self, lmdb: LmdbBackend, keys: Sequence[bytes]) -> int:
        for count, key in enumerate(keys):
            if key not in self._memory and not lmdb.exists([key]):
                return count
        return len(keys)

    def contains(self, keys: Sequence[bytes], tenant: str | None = None) -> list[bool]:
        """Per (scoped) key, whether it is present. Mutates nothing."""
        return self._guarded(tenant, lambda lmdb: self._contains(lmdb, keys))

    def _contains(self, lmdb: LmdbBackend, keys: Sequence[bytes]) -> list[bool]:
        cached = [key in self._memory for key in keys]
        stored = lmdb.contains([key for key, hit in zip(keys, cached, strict=True) if not hit])
        answers = iter(stored)
        return [hit or next(answers) for hit in cached]

    def get(
        self,
        keys: Sequence[bytes],
        client_keys: Sequence[bytes],
        max_bytes: int,
        tenant: str | None = None,
    ) -> Lookup:
        """Records of scoped ``keys``; store hits are checked and then cached in memory.

        The records returned add up to at most ``max_bytes``: from the first key
        that would exceed it, every later key is reported as a miss (and not read).
        """
        return self._guarded(tenant, lambda lmdb: self._get(lmdb, keys, client_keys, max_bytes))

    def _get(
        self,
        lmdb: LmdbBackend,
        keys: Sequence[bytes],
        client_keys: Sequence[bytes],
        max_bytes: int,
    ) -> Lookup:
        records: list[Frame | None] = [self._memory.get(key) for key in keys]
        from_memory = [record is not None for record in records]
        generation = self._memory.generation
        used = 0
        for start in range(0, len(keys), _READ_CHUNK):
            chunk = range(start, min(start + _READ_CHUNK, len(keys)))
            missing = [i for i in chunk if records[i] is None]
            stored = lmdb.read([keys[i] for i in missing]) if missing else []
            for i, record in zip(missing, stored, strict=True):
                if record is not None and self._intact(record, client_keys[i]):
                    records[i] = record
                    self._memory.put(keys[i], record, generation)
            for i in chunk:
                used += len(records[i] or b"")
                if used > max_bytes:
                    records[i:] = [None] * (len(keys) - i)
                    return _lookup(records, from_memory, truncated=True)
        return _lookup(records, from_memory, truncated=False)

    @staticmethod
    def _intact(record: bytes, client_key: bytes) -> bool:
        # The LMDB checksum covered these bytes; this only rechecks the client's header.
        verdict = check_header(record, client_key, len(record) - HEADER_BYTES, None)
        if verdict is not Verdict.OK:
            logger.warning("stored record does not match its key (%s); reported a miss", verdict)
        return verdict is Verdict.OK

    def put(
        self, keys: Sequence[bytes], records: Sequence[Frame], tenant: str | None = None
    ) -> list[bool]:
        """Commit records (one LMDB transaction), then cache them; per-key success."""
        return self._guarded(tenant, lambda lmdb: self._put(lmdb, keys, records))

    def _put(
        self, lmdb: LmdbBackend, keys: Sequence[bytes], records: Sequence[Frame]
    ) -> list[bool]:
        views = [memoryview(record) for record in records]
        # A key already held (or repeated in this batch) keeps its first page, as in LMDB.
        held = {key for key in keys if key in self._memory or lmdb.exists([key]) == 1}
        stored = lmdb.put(keys, views)
        for key, record, ok in zip(keys, records, stored, strict=True):
            if ok and key not in held:
                self._memory.put(key, _own(record))
                held.add(key)
        return stored

    def delete(self, keys: Sequence[bytes], tenant: str | None = None) -> int:
        """Remove scoped keys from both tiers; return how many were present in either.

        LMDB first, then memory: the memory pop bumps the LRU's generation after the
        delete committed, so a concurrent read-through that read the old page cannot
        cache it again. Raises StorageWriteError (nothing deleted) if LMDB failed.
        """
        return self._guarded(tenant, lambda lmdb: self._delete(lmdb, keys))

    def _delete(self, lmdb: LmdbBackend, keys: Sequence[bytes]) -> int:
        unique = list(dict.fromkeys(keys))
        stored = {key for key in unique if lmdb.exists([key]) == 1}
        lmdb.remove(unique)
        cached = {key for key in unique if self._memory.pop(key)}
        return len(stored | cached)

    def size(self) -> StoreSize:
        """The memory tier and every store together."""
        memory = self._memory.size()
        stores = [self._lmdb.stats(), *(own.stats() for own in self._tenants.values())]
        return StoreSize(
            memory.entries,
            memory.bytes_used,
            memory.evictions,
            sum(store.entries for store in stores),
            sum(store.bytes_used for store in stores),
            sum(store.evictions for store in stores),
            sum(store.corrupt for store in stores),
            sum(store.put_failures for store in stores),
            sum(store.capacity_bytes for store in stores),
        )

    def tenant_size(self, tenant: str) -> TenantSize | None:
        """The store of a tenant with a quota; None for a tenant in the shared store
        (whose share of it is not known)."""
        own = self._tenants.get(tenant)
        if own is None:
            return None
        stats = own.stats()
        return TenantSize(stats.entries, stats.bytes_used, stats.capacity_bytes, stats.evictions)

    def close(self) -> None:
        for own in self._tenants.values():
            own.close()
        self._lmdb.close()
