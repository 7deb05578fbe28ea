"""DaemonStore: tenant-scoped page records in a memory LRU in front of a page store
(``store.backend``: ``lmdb`` or ``disk``, a ``RecordStore``; the daemon does not care which)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from hicache.config.daemon import StoreConfig
from hicache.daemon.admission import keepable
from hicache.daemon.memory_lru import ByteLRU
from hicache.daemon.record_framing import for_client, stored_size
from hicache.daemon.record_store import RecordStore
from hicache.daemon.store_slot import StoreSlot
from storage_backends import StorageConfig
from storage_backends.config import user_cache_dir
from storage_backends.errors import StorageWriteError
from storage_backends.page_format import HEADER_BYTES, Verdict, check_header
from storage_backends.remote.protocol import Frame

logger = logging.getLogger(__name__)


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


def check_record(record: Frame, key: bytes) -> Verdict:
    """The header of a PUT's page record against the client's key: magic, version, key
    and the length the record holds. Not the checksum: no pass over the payload here.
    Every read of the stored record checks it (the store's, before a record is served
    or cached), so a record whose checksum lies is dropped at its first read and never
    served."""
    return check_header(record, key, len(record) - HEADER_BYTES, None)


class ReplyBuffers(Protocol):
    """Where a GET's store reads land: buffers the caller owns (the reply frames).

    ``take`` and ``give_back`` are called on the reader thread that runs the GET.
    """

    def take(self, size: int) -> memoryview:
        """A writable buffer of exactly ``size`` bytes."""
        ...

    def give_back(self, buffer: memoryview) -> None:
        """A buffer from ``take`` that holds no page (its read missed)."""
        ...


class FreshBuffers:
    """``ReplyBuffers`` as new memory for every read (the default of ``DaemonStore.get``)."""

    def take(self, size: int) -> memoryview:
        return memoryview(bytearray(size))

    def give_back(self, buffer: memoryview) -> None:
        buffer.release()


def _read(
    store: RecordStore, keys: list[bytes], sizes: list[int], buffers: ReplyBuffers
) -> list[memoryview | None]:
    """The stored records of ``keys`` read whole straight into buffers of their ``sizes``
    (``record_framing.stored_size``)."""
    dst = [buffers.take(size) for size in sizes]
    try:
        hits = store.get_records(keys, dst)
    except BaseException:
        for buffer in dst:
            buffers.give_back(buffer)
        raise
    found: list[memoryview | None] = []
    for buffer, hit in zip(dst, hits, strict=True):
        if not hit:
            buffers.give_back(buffer)
        found.append(buffer if hit else None)
    return found


class _Where(NamedTuple):
    """A GET's key found in the stores: which one (its place in the read order), and the
    size of its record read whole (the reply is this long, or a header shorter)."""

    store: int
    size: int


class DaemonStore:
    """Page records (header + payload as the client framed them) by (tenant, key).

    The store holds each record as the client framed it with the scoped key in its
    header (``record_framing``), or, written by an older daemon, wrapped whole as a store
    record's payload. The memory tier holds records read back from the store (verified
    there) and framed for the client (what a GET sends), keyed by the scoped key: the two
    tiers never disagree on a page's bytes, and nothing the store has not verified is
    served from memory.

    Thread-safety: ``exists``/``contains``/``get``/``size`` may run on any thread
    while one writer thread calls ``put``/``delete``; ``close`` once nothing else
    runs. A store found damaged at run time is moved aside for an empty one and
    the call is run there once more (a miss, or a write into the fresh store);
    one whose directory was deleted under the daemon is reopened empty before the
    next write (``StoreSlot``). The LRU caches only committed, verified records.

    A tenant with a quota has a store of its own; the pages it wrote into the
    shared store before it had one stay readable to it (GET, EXISTS, CONTAINS
    fall back to the shared store) until the shared store evicts them; a PUT of
    such a page keeps it there (the first page wins); DELETE removes from both.
    Raises what opening a store raises (StorageOpenError).
    """

    def __init__(
        self, config: StoreConfig, max_page_bytes: int, quotas: Mapping[str, int] | None = None
    ) -> None:
        self._memory = ByteLRU(config.memory_bytes)
        storage = _storage_config(config, max_page_bytes)
        self._shared = StoreSlot(storage)
        # A tenant with a quota has a store of its own beside the shared one, so that its
        # pages are evicted only by its own writes and never evict anyone else's.
        self._tenants: dict[str, StoreSlot] = {}
        try:
            for tenant, quota in (quotas or {}).items():
                path = tenant_store_path(storage.path, tenant)
                own = dataclasses.replace(storage, path=path, max_bytes=quota)
                self._tenants[tenant] = StoreSlot(own)
        except BaseException:
            self.close()
            raise

    def _stores(self, tenant: str | None) -> list[StoreSlot]:
        """Where ``tenant``'s pages are read: its own store, then the shared one."""
        own = self._tenants.get(tenant) if tenant is not None else None
        return [self._shared] if own is None else [own, self._shared]

    def _present(self, keys: Sequence[bytes], tenant: str | None) -> list[bool]:
        present = [key in self._memory for key in keys]
        for slot in self._stores(tenant):
            missing = [i for i, hit in enumerate(present) if not hit]
            if not missing:
                break
            found = _contains_in(slot, [keys[i] for i in missing])
            for i, hit in zip(missing, found, strict=True):
                present[i] = hit
        return present

    def exists(self, keys: Sequence[bytes], tenant: str | None = None) -> int:
        """How many leading (scoped) keys are present. Mutates nothing."""
        present = self._present(keys, tenant)
        return present.index(False) if False in present else len(keys)

    def contains(self, keys: Sequence[bytes], tenant: str | None = None) -> list[bool]:
        """Per (scoped) key, whether it is present. Mutates nothing."""
        return self._present(keys, tenant)

    def cached(self, keys: Sequence[bytes]) -> list[Frame] | None:
        """The records of every (scoped) key when the memory tier holds them all (each
        made most recently used), else None: an answer without store I/O, cheap enough
        for the socket thread. Thread-safe."""
        records: list[Frame] = []
        for key in keys:
            record = self._memory.get(key)
            if record is None:
                return None
            records.append(record)
        return records

    def all_cached(self, keys: Sequence[bytes]) -> bool:
        """Whether the memory tier holds every (scoped) key (so each is present). Mutates
        nothing; thread-safe."""
        return all(key in self._memory for key in keys)

    def get(
        self,
        keys: Sequence[bytes],
        client_keys: Sequence[bytes],
        max_bytes: int,
        tenant: str | None = None,
        buffers: ReplyBuffers | None = None,
    ) -> Lookup:
        """Records of scoped ``keys``: from memory (the cached objects themselves), else
        read whole from the store straight into buffers taken from ``buffers`` (default:
        fresh memory) and framed for ``client_keys`` there (``record_framing``: the key
        field rewritten; a record written wrapped is a view into its buffer). Store hits
        join the memory tier (read-through LRU) on their second read (``ByteLRU.admit``):
        fresh memory as it is, a caller's buffer as a copy (the caller reuses its
        buffers), made only when the record fits the tier. Buffers of reads that missed,
        or whose record does not match its client key, are given back before this
        returns.

        The records returned add up to at most ``max_bytes``: from the first key
        that would exceed it, every later key is reported as a miss (and not read). A
        record written wrapped counts a header more than it is long.
        """
        records: list[Frame | None] = [self._memory.get(key) for key in keys]
        from_memory = [record is not None for record in records]
        generation = self._memory.generation
        slots = self._stores(tenant)
        where = self._locate(keys, records, slots)
        cut = _cut(records, where, max_bytes)
        records[cut:] = [None] * (len(keys) - cut)
        source = buffers or FreshBuffers()
        for n, slot in enumerate(slots):
            wanted = [i for i, found in enumerate(where[:cut]) if found and found.store == n]
            if not wanted:
                continue
            read = _read_in(slot, [keys[i] for i in wanted], [where[i] for i in wanted], source)
            for i, stored in zip(wanted, read, strict=True):
                record = for_client(stored, client_keys[i]) if stored is not None else None
                if stored is not None and record is None:
                    source.give_back(stored)
                elif record is not None:
                    records[i] = record
                    self._promote(keys[i], record, generation, copy=buffers is not None)
        return _lookup(records, from_memory, truncated=cut < len(keys))

    def _promote(self, key: bytes, record: Frame, generation: int, copy: bool) -> None:
        """Cache a store hit read the second time (``ByteLRU.admit``); a copy when
        ``record`` is a caller's (reused) buffer."""
        if not self._memory.admit(key) or not self._memory.admits(len(record)):
            return
        if copy:
            record = bytes(record)
        self._memory.put(key, record, generation)

    def _locate(
        self, keys: Sequence[bytes], records: list[Frame | None], slots: list[StoreSlot]
    ) -> list[_Where | None]:
        """Per key not in memory, the first store that holds it and its stored size."""
        where: list[_Where | None] = [None] * len(keys)
        for n, slot in enumerate(slots):
            missing = [i for i, r in enumerate(records) if r is None and where[i] is None]
            if not missing:
                break
            sizes = _sizes_in(slot, [keys[i] for i in missing])
            for i, size in zip(missing, sizes, strict=True):
                if size is not None:
                    where[i] = _Where(n, stored_size(size))
        return where

    def put(
        self,
        keys: Sequence[bytes],
        records: Sequence[Frame],
        tenant: str | None = None,
        client_keys: Sequence[bytes] = (),
    ) -> list[bool]:
        """Commit records into the tenant's store (one store transaction); per-key success.
        A key already held (in that store, or in the shared store a tenant with a quota
        still reads) keeps its first page and reports True.

        Each record must have passed ``check_record`` against the client key that
        ``keys[i]`` scopes (the writer checks): the store keeps it with the scoped key in
        its header and its checksum as the client computed it, not hashed here (the
        store's reads check it), and a GET frames it for the client key it is asked for.
        With ``client_keys`` (the PUT's own keys, one per record), each record this call
        stored joins the memory tier's new pages once verified there (key, length,
        checksum: ``admission.keepable``), as the frame it came in (no copy), so a GET
        that follows is answered from memory; a record that fails, or whose memory is not
        the daemon's alone (a shared-memory put area), is not kept, and the tier drops any
        older page of its key. ValueError, storing nothing, for a record that is not a
        whole page record."""
        views = [memoryview(record) for record in records]
        target, *older = self._stores(tenant)
        new = list(range(len(keys)))
        for slot in older:  # the shared store, behind a tenant's own: its pages stay there
            held = _contains_in(slot, [keys[i] for i in new])
            new = [i for i, hit in zip(new, held, strict=True) if not hit]
        put = target.run_write(
            lambda store: store.store_records([keys[i] for i in new], [views[i] for i in new])
        )
        results = [True] * len(keys)
        for i, ok in zip(new, put.stored, strict=True):
            results[i] = ok
        written = [i for i, fresh in zip(new, put.written, strict=True) if fresh]
        for i in written:  # the store holds this record now: memory must not hold another
            kept = keepable(records[i], client_keys[i]) if client_keys else None
            if kept is None or not self._memory.put(keys[i], kept, new=True):
                self._memory.pop(keys[i])
        return results

    def delete(self, keys: Sequence[bytes], tenant: str | None = None) -> int:
        """Remove scoped keys from memory and every store the tenant reads; return how
        many were present in any of them.

        Stores first, then memory: the memory pop bumps the LRU's generation after the
        delete committed, so a concurrent read-through that read the old page cannot
        cache it again. Raises StorageWriteError when a key is still stored after the
        store's delete (it did not commit), before memory is touched.
        """
        unique = list(dict.fromkeys(keys))
        stored: set[bytes] = set()
        for slot in self._stores(tenant):
            stored |= slot.run_write(lambda store: _delete(store, unique))
        cached = {key for key in unique if self._memory.pop(key)}
        return len(stored | cached)

    def size(self) -> StoreSize:
        """The memory tier and every store together."""
        memory = self._memory.size()
        stores = [slot.stats() for slot in (self._shared, *self._tenants.values())]
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
        self._shared.close()


def _storage_config(config: StoreConfig, max_page_bytes: int) -> StorageConfig:
    """The shared store's StorageConfig (an empty path: the per-user default, never the
    working directory). One I/O thread: a request's pages are written (or read) with one
    ``pwritev`` (``preadv``) per run on the thread that serves it; the daemon's
    parallelism is its requests (readers, pipelined writes), and handing a batch's
    parts to a pool cost ~20 % more CPU per byte on 2 cores (measured)."""
    path = config.path
    if not path:
        default = user_cache_dir() / "daemon-store"
        default.parent.mkdir(parents=True, exist_ok=True)
        path = str(default)
    return StorageConfig(
        backend=config.backend,
        path=path,
        max_bytes=config.max_bytes,
        max_page_bytes=max_page_bytes,
        sync=config.sync,
        io_threads=1,
    )


def _contains_in(slot: StoreSlot, keys: list[bytes]) -> list[bool]:
    return slot.run(lambda store: store.contains(keys))


def _sizes_in(slot: StoreSlot, keys: list[bytes]) -> list[int | None]:
    return slot.run(lambda store: store.sizes(keys))


def _read_in(
    slot: StoreSlot, keys: list[bytes], where: list[_Where | None], buffers: ReplyBuffers
) -> list[memoryview | None]:
    sizes = [found.size for found in where if found is not None]
    return slot.run(lambda store: _read(store, keys, sizes, buffers))


def _cut(records: list[Frame | None], where: list[_Where | None], max_bytes: int) -> int:
    """How many leading keys of a GET fit ``max_bytes`` (memory and stored sizes)."""
    used = 0
    for i, (record, found) in enumerate(zip(records, where, strict=True)):
        used += len(record) if record is not None else (found.size if found is not None else 0)
        if used > max_bytes:
            return i
    return len(records)


def _delete(store: RecordStore, keys: list[bytes]) -> set[bytes]:
    """Delete ``keys`` from ``store``; the ones that were present. StorageWriteError when
    any is still there afterwards (the delete did not commit)."""
    present = {key for key, hit in zip(keys, store.contains(keys), strict=True) if hit}
    if not present:
        return present
    store.delete(keys)
    if any(store.contains(keys)):
        raise StorageWriteError(f"delete of {len(keys)} pages did not commit")
    return present
