"""The lmdb backend's write transactions: page, LRU and size bookkeeping, a batch's pages.

Sub-databases (opened by the backend): ``pages`` (key → header+payload), ``lru``
(8-byte big-endian access stamp → key, so a cursor's first entry is the least
recently used), ``atime`` (key → its stamp) and ``meta`` (format version,
fingerprint, bytes used). ``TxnWriter`` keeps them consistent inside one write
transaction; ``write_pages`` runs a put batch in one, committing the prefix that
fits when the map is full. The caller holds the backend's write lock.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from typing import NamedTuple

import lmdb

from storage_backends.config import StorageConfig
from storage_backends.lmdb.env import raise_if_damage
from storage_backends.page_format import HEADER_BYTES, encode_page, header_for

logger = logging.getLogger(__name__)

META_VERSION = b"format_version"
META_FINGERPRINT = b"fingerprint"
META_BYTES_USED = b"bytes_used"


def u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def from_u64(raw: bytes | memoryview) -> int:
    return int.from_bytes(raw, "big")


class Dbs(NamedTuple):
    pages: lmdb._Database
    lru: lmdb._Database
    atime: lmdb._Database
    meta: lmdb._Database


class PutOutcome(NamedTuple):
    """What a put batch did; ``removed``: keys evicted by its committed transaction."""

    results: list[bool]
    puts: int
    failures: int
    evictions: int
    removed: list[bytes]


class _PutResult(enum.Enum):
    STORED = "stored"
    PRESENT = "present"
    REJECTED = "rejected"


class _MapFull(Exception):
    """LMDB ran out of map (or disk) while writing page ``index`` of a batch."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class TxnWriter:
    """Page, LRU and size bookkeeping inside one write transaction (opened with buffers=True)."""

    def __init__(self, txn: lmdb.Transaction, dbs: Dbs) -> None:
        self._txn = txn
        self._dbs = dbs
        used = txn.get(META_BYTES_USED, db=dbs.meta)
        self.bytes_used = from_u64(used) if used is not None else 0
        cursor = txn.cursor(db=dbs.lru)
        self._next_stamp = from_u64(cursor.key()) + 1 if cursor.last() else 0
        self.evictions = 0
        self.removed: list[bytes] = []  # reported only once the transaction commits

    def has(self, key: bytes) -> bool:
        return self._txn.get(key, db=self._dbs.pages) is not None

    def _stamp(self, key: bytes) -> None:
        stamp = u64(self._next_stamp)
        self._next_stamp += 1
        self._txn.put(stamp, key, db=self._dbs.lru)
        self._txn.put(key, stamp, db=self._dbs.atime)

    def touch(self, key: bytes) -> None:
        """Make ``key`` the most recently used page (no-op if it is gone)."""
        old = self._txn.get(key, db=self._dbs.atime)
        if old is not None:
            self._txn.delete(bytes(old), db=self._dbs.lru)
            self._stamp(key)

    def insert(self, key: bytes, value: bytes) -> None:
        self._txn.put(key, value, db=self._dbs.pages)
        self._stamp(key)
        self.bytes_used += len(value)

    def remove(self, key: bytes) -> bool:
        """Delete a page and its recency entries; False if it was not stored."""
        value = self._txn.get(key, db=self._dbs.pages)
        if value is None:
            return False
        size = len(value)
        self._txn.delete(key, db=self._dbs.pages)
        stamp = self._txn.get(key, db=self._dbs.atime)
        if stamp is not None:
            self._txn.delete(bytes(stamp), db=self._dbs.lru)
            self._txn.delete(key, db=self._dbs.atime)
        self.bytes_used = max(0, self.bytes_used - size)
        self.removed.append(key)
        return True

    def evict_until(self, limit: int) -> None:
        """Remove least-recently-used pages until at most ``limit`` bytes are used."""
        cursor = self._txn.cursor(db=self._dbs.lru)
        while self.bytes_used > limit and cursor.first():
            key = bytes(cursor.value())
            if self.remove(key):
                self.evictions += 1
            else:
                # A stamp without a page: drop it so the loop advances.
                cursor.delete()
                self._txn.delete(key, db=self._dbs.atime)

    def finish(self) -> None:
        self._txn.put(META_BYTES_USED, u64(self.bytes_used), db=self._dbs.meta)


def write_pages(
    env: lmdb.Environment,
    dbs: Dbs,
    config: StorageConfig,
    touched: list[bytes],
    keys: Sequence[bytes],
    views: list[memoryview],
    sums: Sequence[int | None],
) -> PutOutcome:
    """Write the batch (after the queued ``touched`` recency updates); when the map is
    full, commit the prefix that fit and fail the rest. ``sums``: each payload's xxh3
    when known (None: hash it). StoreDamagedError for a structural failure."""
    limit = len(keys)
    while True:
        try:
            part = keys[:limit], views[:limit], sums[:limit]
            done = _write_batch(env, dbs, config, touched, *part)
            break
        except _MapFull as full:
            # Always shrink, so a store too full even for bookkeeping still terminates.
            limit = full.index if full.index < limit else limit - 1
            logger.warning(
                "LMDB store %s is full; %d pages not stored",
                config.store_dir(),
                len(keys) - max(limit, 0),
            )
            if limit < 0:
                done = PutOutcome([], 0, 0, 0, [])
                limit = 0
                break
        except lmdb.Error as exc:
            raise_if_damage(exc, f"LMDB store {config.path}")
            logger.exception("LMDB write of %d pages failed", limit)
            done = PutOutcome([], 0, 0, 0, [])
            limit = 0
            break
    unstored = len(keys) - limit
    return done._replace(
        results=done.results + [False] * unstored, failures=done.failures + unstored
    )


def _write_batch(
    env: lmdb.Environment,
    dbs: Dbs,
    config: StorageConfig,
    touched: list[bytes],
    keys: Sequence[bytes],
    views: list[memoryview],
    sums: Sequence[int | None],
) -> PutOutcome:
    """One write transaction: queued touches, then the pages; raises _MapFull(index)."""
    done: list[_PutResult] = []
    with env.begin(write=True, buffers=True) as txn:
        writer = TxnWriter(txn, dbs)
        for key in touched:
            writer.touch(key)
        for i, (key, view, checksum) in enumerate(zip(keys, views, sums, strict=True)):
            try:
                done.append(_put_one(writer, config, key, view, checksum))
            except lmdb.MapFullError as exc:
                raise _MapFull(i) from exc
        try:
            writer.finish()
        except lmdb.MapFullError as exc:
            raise _MapFull(len(keys)) from exc
    return PutOutcome(
        results=[result is not _PutResult.REJECTED for result in done],
        puts=done.count(_PutResult.STORED),
        failures=done.count(_PutResult.REJECTED),
        evictions=writer.evictions,
        removed=writer.removed,
    )


def _put_one(
    writer: TxnWriter, config: StorageConfig, key: bytes, view: memoryview, checksum: int | None
) -> _PutResult:
    if writer.has(key):
        writer.touch(key)
        return _PutResult.PRESENT
    size = HEADER_BYTES + len(view)
    if len(view) > config.max_page_bytes or size > config.max_bytes:
        return _PutResult.REJECTED
    writer.evict_until(config.max_bytes - size)
    if checksum is None:
        writer.insert(key, encode_page(key, view))
    else:  # a record the caller verified: its checksum, the store's key
        writer.insert(key, b"".join((header_for(key, len(view), checksum), view)))
    return _PutResult.STORED
