"""LmdbBackend: pages in one LMDB environment per store directory.

Sub-databases: ``pages`` (key → header+payload), ``lru``, ``atime`` and ``meta``
(``writes`` keeps them consistent inside each write transaction). Size
bookkeeping is read and written inside each write transaction, so several
processes may share one store. This module opens the store (the structural
check, quarantine, a reopen when its file was replaced), reads pages and
serialises writes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import lmdb

from storage_backends.base import StorageStats
from storage_backends.batch import check_batch, check_keys
from storage_backends.config import StorageConfig
from storage_backends.counters import StatCounters
from storage_backends.errors import (
    StorageClosedError,
    StorageError,
    StorageOpenError,
    StorageWriteError,
    StoreDamagedError,
)
from storage_backends.lmdb.check import check_store
from storage_backends.lmdb.clean import OpenLock, OpenState
from storage_backends.lmdb.env import open_env, raise_if_damage
from storage_backends.lmdb.writes import (
    META_BYTES_USED,
    META_FINGERPRINT,
    META_VERSION,
    Dbs,
    TxnWriter,
    from_u64,
    u64,
    write_pages,
)
from storage_backends.page_format import HEADER_BYTES, Verdict, validate
from storage_backends.recency import FLUSH_AT, PendingTouches
from storage_backends.scatter import Runs, check_scatter, copy_verified_runs
from storage_backends.store_dir import (
    StoreMeta,
    prepare_store_dir,
    quarantine_store,
    reconcile_meta,
    stored_fingerprint,
)
from storage_backends.trusted_records import check_record_buffers, trusted_records

logger = logging.getLogger(__name__)

# Recency updates from gets are applied in the next write transaction, or
# in a transaction of their own once this many have piled up.
# LMDB rounds large values up to whole pages and needs room for B-tree pages
# and transaction copies; the map gets this much beyond max_bytes.
_MIN_HEADROOM = 64 << 20
# The structural check of a store not closed cleanly (``lmdb.check``) spends at most
# this long, whatever the store's size: what an open after a crash may cost. It reads
# the B-tree pages (tens of bytes a stored page), never the values, and checks the
# first page of as many large values as the rest of the budget allows; one that runs
# out first is not damage: the store is opened as it is, every page still verified when
# read. (An 8 GiB store of 64 KiB pages took 14.6 s to open when the check read every
# value's pages.)
CHECK_BUDGET_S = 2.0
# The child is killed after this long (one that does not stop at its budget is stuck).
CHECK_MIN_S = 60.0


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the store's ``data.mdb``, None if it is gone."""
    try:
        st = os.stat(path / "data.mdb")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _raise_if_damage(exc: lmdb.Error, path: str) -> None:
    raise_if_damage(exc, f"LMDB store {path}")


def _open_env(path: Path, config: StorageConfig) -> lmdb.Environment:
    map_size = config.map_size or config.max_bytes + max(config.max_bytes // 4, _MIN_HEADROOM)
    return open_env(path, map_size, 4, config.sync_level.fsync_index, "LMDB store")


class LmdbBackend:
    """Pages in LMDB with LRU eviction at ``max_bytes``; see the module docstring for layout.

    Reads are zero-copy: each get batch runs in one read transaction, checks
    the page in the memory map and copies the payload straight into ``dst``.
    Write transactions are serialised by a lock held only around them. One
    LmdbBackend per directory per process (an LMDB rule).
    """

    def __init__(self, config: StorageConfig) -> None:
        self._config = config
        self._counters = StatCounters()
        self._hold: OpenLock | None = None
        path = self._checked_dir(prepare_store_dir(config))
        try:
            self._env, self._dbs = self._open_or_quarantine(path)
        except BaseException:
            self._let_go(mark_clean=False)
            raise
        self._write_lock = threading.Lock()
        self._touches = PendingTouches()
        self._closed = False
        self._identity = _file_identity(Path(self._env.path()))
        self._retired: list[lmdb.Environment] = []  # replaced by a reopen; closed at close()
        self._generation = 0  # environments replaced so far

    def _open_or_quarantine(self, path: Path) -> tuple[lmdb.Environment, Dbs]:
        try:
            return self._open(path)
        except StoreDamagedError as exc:  # damage the child's walk could not see
            return self._open(self._quarantine(path, str(exc)))

    def _checked_dir(self, path: Path) -> Path:
        """Hold ``path`` open and run the structural check unless the store is known sound;
        a store the check finds damaged is quarantined (the returned path is then empty)."""
        state = self._take_hold(path)
        if state is not OpenState.UNKNOWN:
            if state is not OpenState.NEW:
                logger.debug("LMDB store %s: %s, not checked", path, state.value)
            return path
        bound = max(CHECK_MIN_S, self._config.timeout_s)
        result = check_store(path, bound, CHECK_BUDGET_S)  # out of time: logged, not damage
        if result.damage is not None:
            return self._quarantine(path, result.damage)
        return path

    def _take_hold(self, path: Path) -> OpenState:
        try:
            self._hold = OpenLock(path)
        except OSError as exc:
            logger.warning("LMDB store %s: no open lock (%s); checking it", path, exc)
            return OpenState.UNKNOWN
        return self._hold.state

    def _let_go(self, mark_clean: bool) -> None:
        if self._hold is not None:
            self._hold.release(mark_clean)
            self._hold = None

    def _reopen_if_replaced(self) -> bool:
        """Reopen the store if its ``data.mdb`` was deleted or replaced since it was opened
        (the caller holds the write lock), so no write is acknowledged into a file no one
        can open again. False when it cannot be reopened: the write is then refused."""
        path = Path(self._env.path())
        if _file_identity(path) == self._identity:
            return True
        logger.error(
            "LMDB store %s was deleted or replaced while open: its pages are gone; "
            "opening a new store there",
            path,
        )
        try:
            env, dbs = self._open(prepare_store_dir(self._config))
        except StorageError as exc:
            logger.error("cannot reopen the LMDB store %s (%s); writes are refused", path, exc)
            return False
        self._swap(env, dbs)
        self._counters.record_quarantine()
        return True

    def _swap(self, env: lmdb.Environment, dbs: Dbs) -> None:
        self._retired.append(self._env)  # readers may still hold transactions on it
        self._env, self._dbs = env, dbs
        self._identity = _file_identity(Path(env.path()))
        self._generation += 1

    @property
    def generation(self) -> int:
        """How often the environment was replaced (deleted store, ``replace_damaged``)."""
        return self._generation

    def replace_damaged(self, damage: str, generation: int) -> None:
        """Move the store aside and go on in an empty one at the same path, for callers
        without a ``GuardedBackend`` (the daemon). ``generation`` is what the failed call
        saw: a store already replaced since is left alone. StorageOpenError if impossible."""
        with self._write_lock:
            self._check_open()
            if generation != self._generation:
                return
            path = self._quarantine(Path(self._env.path()), damage)
            self._swap(*self._open(path))

    def _quarantine(self, path: Path, damage: str) -> Path:
        """Move the damaged store aside, count it, and return the (new, empty) store path."""
        self._let_go(mark_clean=False)  # its lock file moves with it
        moved = quarantine_store(path)
        logger.error(
            "LMDB store %s is damaged (%s); moved to %s, starting empty", path, damage, moved
        )
        self._counters.record_quarantine()
        fresh = prepare_store_dir(self._config)
        self._take_hold(fresh)
        return fresh

    def _open(self, path: Path) -> tuple[lmdb.Environment, Dbs]:
        env = _open_env(path, self._config)
        try:
            names = (b"pages", b"lru", b"atime", b"meta")
            dbs = Dbs(*(env.open_db(name) for name in names))
            self._init_meta(env, dbs)
        except lmdb.Error as exc:
            env.close()
            _raise_if_damage(exc, str(path))
            raise StorageOpenError(f"storage.path {path}: {exc}") from exc
        except BaseException:
            env.close()
            raise
        return env, dbs

    def _init_meta(self, env: lmdb.Environment, dbs: Dbs) -> None:
        with env.begin(write=True, db=dbs.meta) as txn:
            version = txn.get(META_VERSION)
            stored = None
            if version is not None and len(version) != 8:
                raise StoreDamagedError(f"the meta table's format version is damaged: {version!r}")
            if version is not None:
                stored = StoreMeta(
                    from_u64(version),
                    stored_fingerprint(txn.get(META_FINGERPRINT), "the meta table"),
                )
            meta = reconcile_meta(stored, self._config)
            txn.put(META_VERSION, u64(meta.format_version))
            txn.put(META_FINGERPRINT, meta.fingerprint.encode())
            if txn.get(META_BYTES_USED) is None:
                txn.put(META_BYTES_USED, u64(0))

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError("LmdbBackend is closed")

    @contextlib.contextmanager
    def _reading(self) -> Iterator[lmdb.Transaction]:
        """A transaction whose structural failures raise StoreDamagedError."""
        try:
            with self._env.begin(buffers=True) as txn:
                yield txn
        except lmdb.Error as exc:
            _raise_if_damage(exc, self._config.path)
            raise

    def exists(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        with self._reading() as txn:
            for count, key in enumerate(keys):
                if txn.get(key, db=self._dbs.pages) is None:
                    return count
        return len(keys)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        self._check_open()
        check_keys(keys)
        with self._reading() as txn:
            return [txn.get(key, db=self._dbs.pages) is not None for key in keys]

    def sizes(self, keys: Sequence[bytes]) -> list[int | None]:
        """Each key's stored payload length, None when absent (mutates nothing): what a
        reader that does not know the page sizes (the daemon) allocates before ``get``."""
        self._check_open()
        check_keys(keys)
        with self._reading() as txn:
            blobs = [txn.get(key, db=self._dbs.pages) for key in keys]
            return [None if blob is None else max(len(blob) - HEADER_BYTES, 0) for blob in blobs]

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        self._check_open()
        return self._read_runs(keys, [[view] for view in check_batch(keys, dst, writable=True)])

    def get_scatter(self, keys: Sequence[bytes], dst: list[Sequence[memoryview]]) -> list[bool]:
        self._check_open()
        return self._read_runs(keys, check_scatter(keys, dst))

    def _read_runs(self, keys: Sequence[bytes], dst: list[Runs]) -> list[bool]:
        """Verified copies of the pages into their runs (``get`` and ``get_scatter``)."""
        hits = [False] * len(keys)
        damaged: list[bytes] = []
        with self._reading() as txn:
            for i, (key, runs) in enumerate(zip(keys, dst, strict=True)):
                blob = txn.get(key, db=self._dbs.pages)
                if blob is None:
                    continue
                verdict = copy_verified_runs(memoryview(blob), key, runs)  # a view: no copy
                hits[i] = verdict is Verdict.OK
                if verdict.corrupt:
                    damaged.append(key)
        self._finish_read(keys, hits, damaged)
        return hits

    def get_records(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        """Read each key's whole record (header + payload, the header naming the store's
        key) into ``dst[i]``, whose length must be the stored record's (else a miss).
        The bytes copied are the bytes verified; recency, counters and damage as in
        ``get``. ValueError for a buffer shorter than a header. For a caller that hands
        the record on as it is (the daemon)."""
        self._check_open()
        views = check_record_buffers(keys, dst)
        hits = [False] * len(keys)
        damaged: list[bytes] = []
        with self._reading() as txn:
            for i, (key, view) in enumerate(zip(keys, views, strict=True)):
                blob = txn.get(key, db=self._dbs.pages)
                if blob is None or len(blob) != len(view):
                    continue
                view[:] = blob
                verdict = validate(view, key, None)
                hits[i] = verdict is Verdict.OK
                if verdict.corrupt:
                    damaged.append(key)
        self._finish_read(keys, hits, damaged)
        return hits

    def read(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Verified payloads of ``keys`` (copies), None for a miss: for readers that do not
        know the page sizes (the daemon). Recency, counters and damage as in ``get``."""
        self._check_open()
        check_keys(keys)
        pages: list[bytes | None] = [None] * len(keys)
        damaged: list[bytes] = []
        with self._env.begin(db=self._dbs.pages, buffers=True) as txn:
            for i, key in enumerate(keys):
                blob = txn.get(key)
                if blob is None:
                    continue
                verdict = validate(blob, key, None)
                if verdict is Verdict.OK:
                    pages[i] = bytes(blob[HEADER_BYTES:])
                elif verdict.corrupt:
                    damaged.append(key)
        self._finish_read(keys, [page is not None for page in pages], damaged)
        return pages

    def _finish_read(self, keys: Sequence[bytes], hits: list[bool], damaged: list[bytes]) -> None:
        corrupt = self._drop_damaged(damaged) if damaged else 0
        n_hits = sum(hits)
        self._counters.record_get(n_hits, len(keys) - n_hits, corrupt)
        self._touch([key for key, hit in zip(keys, hits, strict=True) if hit])

    def _drop_damaged(self, keys: list[bytes]) -> int:
        """Delete pages found damaged (re-checked under the write lock); return how many."""
        dropped = 0
        try:
            with self._write_lock, self._env.begin(write=True, buffers=True) as txn:
                writer = TxnWriter(txn, self._dbs)
                for key in keys:
                    blob = txn.get(key, db=self._dbs.pages)
                    if blob is not None and validate(blob, key, None).corrupt:
                        dropped += writer.remove(key)
                writer.finish()
        except lmdb.Error as exc:
            _raise_if_damage(exc, self._config.path)
            logger.exception("could not delete %d damaged pages", len(keys))
            return 0
        self._counters.note_removed(writer.removed)
        logger.warning("deleted %d damaged pages from %s", dropped, self._config.store_dir())
        return dropped

    def _touch(self, keys: list[bytes]) -> None:
        """Queue recency updates; flush them now only if many are pending and no write runs."""
        if not keys:
            return
        if self._touches.add(keys) >= FLUSH_AT and self._write_lock.acquire(blocking=False):
            try:
                self._flush_touches()
            finally:
                self._write_lock.release()

    def _flush_touches(self) -> None:
        """Apply queued recency updates; the caller holds the write lock."""
        keys = self._touches.take()
        if not keys:
            return
        try:
            with self._env.begin(write=True, buffers=True) as txn:
                writer = TxnWriter(txn, self._dbs)
                for key in keys:
                    writer.touch(key)
                writer.finish()
        except lmdb.Error as exc:
            _raise_if_damage(exc, self._config.path)
            logger.exception("dropped %d recency updates", len(keys))

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self._check_open()
        views = check_batch(keys, src, writable=False)
        return self._put_payloads(keys, views, [None] * len(views))

    def put_records(self, keys: Sequence[bytes], records: Sequence[memoryview]) -> list[bool]:
        """``put`` of whole records as the caller framed them (header + payload, as
        ``trusted_records`` says): each is stored under its key with its header's
        checksum, not hashed (reads check it); the header's key becomes the store
        key. ValueError (nothing stored) for a record that is not a whole record; as
        ``put`` otherwise."""
        self._check_open()
        trusted = trusted_records(keys, records)
        payloads = [record.payload for record in trusted]
        return self._put_payloads(keys, payloads, [record.checksum for record in trusted])

    def _put_payloads(
        self, keys: Sequence[bytes], views: list[memoryview], sums: Sequence[int | None]
    ) -> list[bool]:
        """``put`` of checked payloads; ``sums``: each one's xxh3 when known (None: hash it)."""
        with self._write_lock:
            self._check_open()
            if not self._reopen_if_replaced():
                self._counters.record_put(0, len(keys), 0)
                return [False] * len(keys)
            touched = self._touches.take()
            outcome = write_pages(self._env, self._dbs, self._config, touched, keys, views, sums)
            self._counters.note_removed(outcome.removed)
        self._counters.record_put(outcome.puts, outcome.failures, outcome.evictions)
        return outcome.results

    def delete(self, keys: Sequence[bytes]) -> int:
        try:
            return self.remove(keys)
        except StorageWriteError:
            logger.exception("LMDB delete of %d pages failed", len(keys))
            return 0

    def remove(self, keys: Sequence[bytes]) -> int:
        """``delete`` for callers that must not acknowledge a failed delete (the daemon):
        StorageWriteError when the transaction did not commit (nothing was removed)."""
        self._check_open()
        check_keys(keys)
        try:
            with self._write_lock:
                if not self._reopen_if_replaced():
                    raise StorageWriteError(f"the LMDB store {self._config.path} is gone")
                with self._env.begin(write=True, buffers=True) as txn:
                    writer = TxnWriter(txn, self._dbs)
                    removed = sum(writer.remove(key) for key in keys)
                    writer.finish()
        except lmdb.Error as exc:
            _raise_if_damage(exc, self._config.path)
            raise StorageWriteError(f"LMDB delete of {len(keys)} pages failed: {exc}") from exc
        self._counters.note_removed(writer.removed)
        self._counters.record_deletes(removed)
        return removed

    def take_removed(self) -> list[bytes]:
        return self._counters.take_removed()

    def stats(self) -> StorageStats:
        self._check_open()
        with self._reading() as txn:
            entries = txn.stat(self._dbs.pages)["entries"]
            used = txn.get(META_BYTES_USED, db=self._dbs.meta)
            bytes_used = from_u64(used) if used is not None else 0
        return self._counters.snapshot(entries, bytes_used, self._config.max_bytes)

    def close(self) -> None:
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
            flushed = False
            try:
                self._flush_touches()
                self._env.sync(True)  # the marker promises the file as it is on disk
                flushed = True
            except lmdb.Error:
                logger.exception("LMDB store %s: flush at close failed", self._config.path)
            finally:
                self._env.close()
                for env in self._retired:
                    env.close()
                self._let_go(mark_clean=flushed and self._marks_current_store())

    def _marks_current_store(self) -> bool:
        """The hold is on the directory of the open environment (no swap since open)."""
        return self._hold is not None and self._generation == 0
