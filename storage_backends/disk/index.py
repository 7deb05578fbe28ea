"""The LMDB index: key -> location, recency, the allocator's free space, reservations.

Sub-databases (small values only): ``pages`` (key -> ``Location``), ``lru``
(8-byte big-endian stamp -> key, so a cursor's first entry is the least recently
used), ``meta`` (format version, fingerprint, bytes used: header + payload of every
page, as the other backends count; segment tails, the allocated total),
``free``/``free_class`` (the allocator's free extents: start -> length, and by
length; the second name is from when free slots were listed per size class) and
``pending`` (owner (pid, batch) -> slots reserved by a put of an earlier version
of this store, which committed a reservation before writing; a crash left them
there, and they are reclaimed once their process is gone. Puts now write inside
their one transaction and leave nothing here).
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import lmdb

from storage_backends.config import StorageConfig
from storage_backends.disk.allocator import Allocator, Extent, FreeDbs, from_u64, u64
from storage_backends.disk.layout import (
    LOCATION_STRUCT,
    PACK,
    Location,
    Slot,
    SlotClass,
    SlotRun,
)
from storage_backends.disk.room import KeyReader, Room, no_reader
from storage_backends.errors import StorageOpenError, StoreDamagedError
from storage_backends.lmdb.env import DAMAGE_ERRORS, open_env, raise_if_damage
from storage_backends.page_format import HEADER_BYTES
from storage_backends.store_dir import StoreMeta, reconcile_meta, stored_fingerprint

META_VERSION = b"format_version"
META_FINGERPRINT = b"fingerprint"
META_BYTES_USED = b"bytes_used"
META_SEGMENT_BYTES = b"segment_bytes"
DB_NAMES = (b"pages", b"lru", b"meta", b"free", b"free_class", b"pending")
_MIN_MAP = 64 << 20
_MAX_MAP = 1 << 46  # 64 TiB of address space (x86-64 user space is 128 TiB)
# A page's entries (key -> location, stamp -> key) with their B-tree share, a freed
# slot's two entries, and room for copy-on-write pages of a commit.
INDEX_BYTES_PER_PAGE = 512
_WHAT = "the disk store index"
_OWNER = struct.Struct(">IQ")
_STAMP = struct.Struct(">Q")  # lru keys: big-endian, so a cursor walks them oldest first


class IndexDbs(NamedTuple):
    pages: lmdb._Database
    lru: lmdb._Database
    meta: lmdb._Database
    free: lmdb._Database
    free_class: lmdb._Database
    pending: lmdb._Database


def map_size(config: StorageConfig) -> int:
    """Room for the index of as many pages as the store can hold (the smallest slot is
    ``PACK`` bytes), ``INDEX_BYTES_PER_PAGE`` each. Only address space is reserved: the
    index file grows with what it holds, so a large map costs nothing on disk."""
    pages = config.max_bytes // PACK + 1
    return config.map_size or max(_MIN_MAP, min(_MAX_MAP, pages * INDEX_BYTES_PER_PAGE))


class Located(NamedTuple):
    """A batch's raw index values (None: absent), with the newest recency stamp and the
    number of pages (read after this process's last index write, at most
    ``RECENCY_HINT_S`` before: another process's writes may not be counted yet)."""

    values: list[bytes | None]
    newest_stamp: int
    entries: int


class _Recency(NamedTuple):
    newest_stamp: int
    entries: int
    read_at: float  # time.monotonic()


# How long the newest stamp and page count read for one get serve the next ones: a get
# reads them from the index only when this process wrote since or they are older than
# this (reading them costs more than a 64 KiB page's checksum; they only decide whether
# a hit queues a recency touch, so another process's writes may be missed this long).
RECENCY_HINT_S = 0.1


class Reserved(NamedTuple):
    slot: Slot
    cls: SlotClass


_RESERVED = struct.Struct(">IQIH")  # Slot.pack() + SlotClass.pack(), in one call a slot


def _unpack_reserved(raw: bytes) -> list[Reserved]:
    whole = len(raw) - len(raw) % _RESERVED.size  # a damaged tail is ignored, as before
    return [
        Reserved(Slot(segment, offset), SlotClass(stride, align))
        for segment, offset, stride, align in _RESERVED.iter_unpack(raw[:whole])
    ]


class Owner(NamedTuple):
    """Who reserved a batch's slots: a process and its batch number."""

    pid: int
    batch: int

    def pack(self) -> bytes:
        return _OWNER.pack(self.pid, self.batch)

    @staticmethod
    def unpack(raw: bytes) -> Owner:
        pid, batch = _OWNER.unpack_from(raw)
        return Owner(pid, batch)


class IndexWriter:
    """Pages, recency, slots and size bookkeeping inside one write transaction."""

    def __init__(
        self, txn: lmdb.Transaction, dbs: IndexDbs, segment_bytes: int, max_bytes: int
    ) -> None:
        self._txn = txn
        self._dbs = dbs
        self.alloc = Allocator(
            txn, FreeDbs(dbs.free, dbs.free_class, dbs.meta), segment_bytes, max_bytes
        )
        self.bytes_used = from_u64(txn.get(META_BYTES_USED, db=dbs.meta))
        self._bytes_used_read = self.bytes_used  # written back by ``finish`` only if changed
        cursor = txn.cursor(db=dbs.lru)
        self._next_stamp = from_u64(cursor.key()) + 1 if cursor.last() else 0
        self._max_bytes = max_bytes
        self.reserved = 0  # record bytes reserved in this transaction
        self.evictions = 0
        self.removed: list[bytes] = []  # reported only once the transaction commits

    def location(self, key: bytes) -> Location | None:
        raw = self._txn.get(key, db=self._dbs.pages)
        return None if raw is None else Location.unpack(raw)

    def has(self, key: bytes) -> bool:
        return self._txn.get(key, db=self._dbs.pages) is not None

    def present(self, keys: Sequence[bytes]) -> list[bool]:
        """Per key, whether the index holds it."""
        get, db = self._txn.get, self._dbs.pages
        return [get(key, db=db) is not None for key in keys]

    def _stamp(self) -> int:
        stamp = self._next_stamp
        self._next_stamp += 1
        return stamp

    def touch(self, key: bytes) -> None:
        """Make ``key`` the most recently used page (no-op if it is gone)."""
        loc = self.location(key)
        if loc is None:
            return
        self._txn.delete(u64(loc.stamp), db=self._dbs.lru)
        self._link(key, loc._replace(stamp=self._stamp()))

    def touch_many(self, keys: Sequence[bytes]) -> None:
        """``touch`` each key in turn (the last touch of a repeated key counts), with the
        least work a key: the stamp is swapped in the stored value's bytes, the new
        recency entries go in with one call. Keys that are gone or damaged are skipped."""
        if not keys:
            return
        get, put, delete = self._txn.get, self._txn.put, self._txn.delete
        pages, lru = self._dbs.pages, self._dbs.lru
        size, at = LOCATION_STRUCT.size, LOCATION_STRUCT.size - 8  # the stamp: last, u64 LE
        recency: list[tuple[bytes, bytes]] = []
        for key in list(dict.fromkeys(reversed(keys)))[::-1]:
            raw = get(key, db=pages)
            if raw is None or len(raw) != size:
                continue
            head, old = bytes(raw[:at]), bytes(raw[at:])  # copied: ``raw`` is the map's
            stamp = self._stamp()
            delete(old[::-1], db=lru)  # the old stamp, big-endian: its recency key
            put(key, head + stamp.to_bytes(8, "little"), db=pages)
            recency.append((u64(stamp), key))
        if recency:
            self._txn.cursor(db=lru).putmulti(recency)

    def _link(self, key: bytes, loc: Location) -> None:
        self._txn.put(key, loc.pack(), db=self._dbs.pages)
        self._txn.put(u64(loc.stamp), key, db=self._dbs.lru)

    def remove(self, key: bytes) -> bool:
        """Delete a page and free its slot; False if it was not stored."""
        raw = self._txn.get(key, db=self._dbs.pages)
        if raw is None:
            return False
        loc = Location.unpack(raw)  # before the delete: ``raw`` points into the map
        self._txn.delete(key, db=self._dbs.pages)
        if loc is not None:  # a damaged entry's slot is unknown: leaked, not reused
            self._txn.delete(u64(loc.stamp), db=self._dbs.lru)
            self.alloc.release(loc.slot, loc.cls)
            self.bytes_used = max(0, self.bytes_used - loc.record_len)
        self.removed.append(key)
        return True

    def evict_one(self) -> bool:
        """Remove the least recently used page; False when none is left."""
        cursor = self._txn.cursor(db=self._dbs.lru)
        while cursor.first():
            key = bytes(cursor.value())
            if self.evict(key):
                return True
            cursor.delete()  # a stamp without a page: drop it so the loop advances
        return False

    def oldest(self) -> Location | None:
        """The least recently used page's location (None: no page, or a damaged entry)."""
        cursor = self._txn.cursor(db=self._dbs.lru)
        return self.location(bytes(cursor.value())) if cursor.first() else None

    def evict(self, key: bytes) -> bool:
        """``remove``, counted as an eviction."""
        if not self.remove(key):
            return False
        self.evictions += 1
        return True

    def holds(self, key: bytes, slot: Slot) -> bool:
        """Whether the index puts ``key``'s record at ``slot``."""
        loc = self.location(key)
        return loc is not None and loc.slot == slot

    def largest_free(self, limit: int) -> list[Extent]:
        return self.alloc.largest(limit)

    def reserve(
        self, cls: SlotClass, count: int, record_bytes: int, read_key: KeyReader = no_reader
    ) -> list[SlotRun]:
        """Up to ``count`` slots of ``cls`` (as runs) for records of ``record_bytes`` in
        all, evicting least recently used pages until the records fit ``max_bytes``, then
        pages that stand in the way of a free extent large enough for the slots
        (``room``; ``read_key`` reads the key of the record at a slot)."""
        while self.bytes_used + self.reserved + record_bytes > self._max_bytes:
            if not self.evict_one():
                break
        runs = self.alloc.take(cls, count)
        taken = sum(run.n_slots for run in runs)
        room = Room(self, cls, read_key) if taken < count else None
        while taken < count and room is not None and room.make():
            more = self.alloc.take(cls, count - taken)
            runs += more
            taken += sum(run.n_slots for run in more)
        self.reserved += record_bytes * taken // count
        return runs

    def unreserve(self, taken: Sequence[tuple[SlotClass, list[SlotRun]]]) -> None:
        """Give back every slot ``reserve`` handed out in this transaction (``taken``: all
        of them, per class)."""
        for cls, runs in taken:
            for run in runs:
                for slot in run.slots(cls.stride):
                    self.alloc.release(slot, cls)
        self.reserved = 0

    def insert_run(
        self, run: SlotRun, cls: SlotClass, keys: Sequence[bytes], lengths: Sequence[int]
    ) -> list[bool]:
        """Index written records: ``keys[n]``, a payload of ``lengths[n]`` bytes, in the
        n-th slot of ``run``; the recency entries in one call. False for a key that is
        stored already (nothing changed for it)."""
        stamp = self._next_stamp
        self._next_stamp += len(keys)
        raws = Location.packed_run(run, cls, lengths, stamp)
        if len(keys) == 1:
            return [self._insert_one(keys[0], raws[0], stamp, lengths[0])]
        pages = self._txn.cursor(db=self._dbs.pages)
        _, added = pages.putmulti(zip(keys, raws, strict=True), overwrite=False)
        if added == len(keys):
            fresh = [True] * len(keys)
        else:  # a stored entry kept its own (older) stamp, so it differs from ours
            get, db = self._txn.get, self._dbs.pages
            fresh = [get(key, db=db) == raw for key, raw in zip(keys, raws, strict=True)]
        recency = [(_STAMP.pack(stamp + n), key) for n, key in enumerate(keys) if fresh[n]]
        if recency:
            self._txn.cursor(db=self._dbs.lru).putmulti(recency)
        self.bytes_used += sum(HEADER_BYTES + n for n, ok in zip(lengths, fresh, strict=True) if ok)
        return fresh

    def _insert_one(self, key: bytes, raw: bytes, stamp: int, length: int) -> bool:
        """``insert_run`` of one record (its packed location ``raw``) without cursors."""
        if not self._txn.put(key, raw, db=self._dbs.pages, overwrite=False):
            return False
        self._txn.put(_STAMP.pack(stamp), key, db=self._dbs.lru)
        self.bytes_used += HEADER_BYTES + length
        return True

    def reclaim_pending(self, alive: bool | None) -> int:
        """Free reservations of owners that are gone (``alive`` None: ask the OS per owner;
        False: every owner is gone). Return how many slots were reclaimed."""
        stale: list[tuple[bytes, list[Reserved]]] = []
        for raw_owner, value in self._txn.cursor(db=self._dbs.pending):
            owner = Owner.unpack(bytes(raw_owner))
            if alive is False or not _pid_alive(owner.pid):
                stale.append((bytes(raw_owner), _unpack_reserved(bytes(value))))
        for raw_owner, reserved in stale:
            self._txn.delete(raw_owner, db=self._dbs.pending)
            for r in reserved:
                self.alloc.release(r.slot, r.cls)
        return sum(len(reserved) for _, reserved in stale)

    def finish(self) -> None:
        if self.bytes_used != self._bytes_used_read:
            self._txn.put(META_BYTES_USED, u64(self.bytes_used), db=self._dbs.meta)
        self.alloc.finish()


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DiskIndex:
    """The open LMDB environment of one store. Thread-safe as LMDB is; the caller
    serialises write transactions (one writer per process at a time)."""

    def __init__(self, path: Path, config: StorageConfig) -> None:
        self.path = path
        self._config = config
        self.damaged = False  # a transaction met structural damage: never marked clean
        self._recency: _Recency | None = None  # see RECENCY_HINT_S; None: read it anew
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            raise StorageOpenError(f"storage.path {path}: cannot open {_WHAT}: {exc}") from exc
        self._env = open_env(
            path, map_size(config), len(DB_NAMES), config.sync_level.fsync_index, _WHAT
        )
        try:
            self._env.reader_check()  # reader slots of processes killed while reading
            self.dbs = IndexDbs(*(self._env.open_db(name) for name in DB_NAMES))
            self.segment_bytes = self._init_meta()
        except lmdb.Error as exc:
            self._env.close()
            raise_if_damage(exc, f"{_WHAT} {path}")
            raise StorageOpenError(f"storage.path {path}: {exc}") from exc
        except BaseException:
            self._env.close()
            raise

    def _init_meta(self) -> int:
        with self._env.begin(write=True, db=self.dbs.meta) as txn:
            version = txn.get(META_VERSION)
            if version is not None and len(version) != 8:
                raise StoreDamagedError(f"the index's format version is damaged: {version!r}")
            stored = None
            if version is not None:
                stored = StoreMeta(
                    from_u64(version), stored_fingerprint(txn.get(META_FINGERPRINT), "the index")
                )
            meta = reconcile_meta(stored, self._config)
            txn.put(META_VERSION, u64(meta.format_version))
            txn.put(META_FINGERPRINT, meta.fingerprint.encode())
            segment_bytes = from_u64(txn.get(META_SEGMENT_BYTES)) or self._config.segment_bytes
            txn.put(META_SEGMENT_BYTES, u64(segment_bytes))
            if txn.get(META_BYTES_USED) is None:
                txn.put(META_BYTES_USED, u64(0))
            self._upgrade_free(txn, segment_bytes)
        return segment_bytes

    def _upgrade_free(self, txn: lmdb.Transaction, segment_bytes: int) -> None:
        """Free slots of a store of the first format become extents (once), inside the
        open's one write transaction."""
        dbs = FreeDbs(self.dbs.free, self.dbs.free_class, self.dbs.meta)
        alloc = Allocator(txn, dbs, segment_bytes, self._config.max_bytes)
        if alloc.upgrade():
            alloc.finish()

    @contextlib.contextmanager
    def reading(self) -> Iterator[lmdb.Transaction]:
        """A read transaction whose structural failures raise StoreDamagedError."""
        try:
            with self._env.begin(buffers=True) as txn:
                yield txn
        except lmdb.Error as exc:
            self._note_damage(exc)
            raise

    @contextlib.contextmanager
    def writing(self) -> Iterator[IndexWriter]:
        """A write transaction, committed when the block ends without an exception.
        lmdb.Error escapes (MapFullError: the index is full); damage is StoreDamagedError."""
        try:
            with self._env.begin(write=True, buffers=True) as txn:
                writer = IndexWriter(txn, self.dbs, self.segment_bytes, self._config.max_bytes)
                yield writer
                writer.finish()
        except lmdb.Error as exc:
            self._note_damage(exc)
            raise
        finally:
            self._recency = None  # stamps and entries may have changed

    def _note_damage(self, exc: lmdb.Error) -> None:
        """StoreDamagedError for structural damage (remembered); else nothing."""
        if isinstance(exc, DAMAGE_ERRORS):
            self.damaged = True
            raise_if_damage(exc, f"{_WHAT} {self.path}")

    def raw_locations(self, keys: Sequence[bytes]) -> Located:
        """Each key's index value as stored (None: absent), in one read transaction, with
        the newest recency stamp and the page count (``Located``; the get path unpacks
        the values itself, ``read_plan``, and leaves young pages' recency alone)."""
        try:
            with self._env.begin(db=self.dbs.pages) as txn:
                values = list(map(txn.get, keys))
                recency = self._recency
                if recency is None or time.monotonic() - recency.read_at > RECENCY_HINT_S:
                    recency = self._recency = self._read_recency(txn)
                return Located(values, recency.newest_stamp, recency.entries)
        except lmdb.Error as exc:
            self._note_damage(exc)
            raise

    def _read_recency(self, txn: lmdb.Transaction) -> _Recency:
        cursor = txn.cursor(db=self.dbs.lru)
        newest = from_u64(cursor.key()) if cursor.last() else 0
        return _Recency(newest, txn.stat(self.dbs.pages)["entries"], time.monotonic())

    def count_leading(self, keys: Sequence[bytes]) -> int:
        """How many leading keys the index holds (one read transaction)."""
        try:
            with self._env.begin(db=self.dbs.pages, buffers=True) as txn:
                get = txn.get
                for count, key in enumerate(keys):
                    if get(key) is None:
                        return count
                return len(keys)
        except lmdb.Error as exc:
            self._note_damage(exc)
            raise

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        """Per key, whether the index holds an entry (one read transaction)."""
        try:
            with self._env.begin(db=self.dbs.pages, buffers=True) as txn:
                get = txn.get
                return [get(key) is not None for key in keys]
        except lmdb.Error as exc:
            self._note_damage(exc)
            raise

    def size(self) -> tuple[int, int]:
        """(pages, bytes used)."""
        with self.reading() as txn:
            entries = txn.stat(self.dbs.pages)["entries"]
            return entries, from_u64(txn.get(META_BYTES_USED, db=self.dbs.meta))

    def payload_sizes(self, keys: Sequence[bytes]) -> list[int | None]:
        """Each key's stored payload length (None: absent, or a damaged entry), in one
        read transaction."""
        with self.reading() as txn:
            raws = [txn.get(key, db=self.dbs.pages) for key in keys]
            locations = [None if raw is None else Location.unpack(raw) for raw in raws]
        return [None if loc is None else loc.payload_len for loc in locations]

    def sync(self) -> None:
        self._env.sync(True)

    def data_file(self) -> Path:
        return self.path / "data.mdb"

    def close(self) -> None:
        self._env.close()
