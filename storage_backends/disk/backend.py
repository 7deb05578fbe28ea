"""DiskBackend: page records in segment files, located through an LMDB index.

A put is one index write transaction around the batch's record writes (``writes``);
gets are ``reads``'s. The backend opens, checks and closes the store and holds what
the two paths share.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import lmdb

from storage_backends.base import StorageStats
from storage_backends.batch import check_batch, check_keys
from storage_backends.config import StorageConfig
from storage_backends.counters import StatCounters
from storage_backends.disk.index import DiskIndex
from storage_backends.disk.io_pool import IoPool
from storage_backends.disk.layout import INDEX_DIR
from storage_backends.disk.owners import Ownership
from storage_backends.disk.parts import DiskParts
from storage_backends.disk.reads import DiskReads
from storage_backends.disk.segments import SegmentFiles, check_direct_io
from storage_backends.disk.writes import DiskWrites, FaultHook
from storage_backends.errors import StorageClosedError, StoreDamagedError
from storage_backends.lmdb.check import check_store
from storage_backends.log_limit import LogLimiter
from storage_backends.recency import PendingTouches
from storage_backends.store_dir import prepare_store_dir, quarantine_store
from storage_backends.trusted_records import RecordsPut, trusted_records

logger = logging.getLogger(__name__)

# Recency updates from gets ride on the next put's transaction, or get one of
# their own once this many have piled up.
# The index's structural check reads every B-tree page of the index (~170 bytes a
# page of data): seconds for millions of pages. Its time limit grows with the index,
# read at a pace any disk keeps, so that running out of time means a check that is
# stuck, not an index that is merely large.
_MIN_CHECK_S = 60.0
_CHECK_BYTES_PER_S = 16 << 20


class DiskBackend:
    """The ``disk`` backend (see the module docstring and DESIGN §11).

    Thread-safe as the protocol asks; several processes may share one store path (one
    DiskBackend per path per process: an LMDB rule).
    Unlike the in-memory backends, a get reads into ``dst`` before checking it:
    a damaged page's buffer may have been written, but it is reported as a miss.
    ``fault_hook`` (None in use) is called with each ``PutPhase`` of a put.
    """

    def __init__(self, config: StorageConfig) -> None:
        self._config = config
        self._counters = StatCounters()
        self._log = LogLimiter(logger)
        root = prepare_store_dir(config)
        if config.direct_io:
            check_direct_io(root)  # before anything is opened that would need closing
        self._root, self._owners, self._index = self._open(root)
        file_bytes = min(self._index.segment_bytes, config.max_bytes)
        lead = self._index.record_lead
        self._segments = SegmentFiles(self._root, file_bytes, config.direct_io, lead)
        self._pool = IoPool(config.io_threads)
        self._write_lock = threading.Lock()
        self._touches = PendingTouches()
        self._closed = False
        parts = DiskParts(
            config,
            self._root,
            self._index,
            self._segments,
            self._pool,
            self._counters,
            self._log,
            self._touches,
            self._write_lock,
        )
        self._reads = DiskReads(parts)
        self._writes = DiskWrites(parts)

    # -- opening -------------------------------------------------------------------------

    def _open(self, root: Path) -> tuple[Path, Ownership, DiskIndex]:
        owners = Ownership(root, self._config.timeout_s)
        index_dir = root / INDEX_DIR
        damage = None
        if owners.alone and not owners.closed_cleanly(index_dir / "data.mdb"):
            damage = check_store(index_dir, self._check_limit(index_dir)).damage
        try:
            if damage is not None:
                raise StoreDamagedError(damage)
            index = DiskIndex(index_dir, self._config)
        except StoreDamagedError as exc:
            owners.release(None)
            root = self._quarantine(root, str(exc))
            owners = Ownership(root, self._config.timeout_s)
            index = DiskIndex(root / INDEX_DIR, self._config)
        except BaseException:
            owners.release(None)
            raise
        owners.opened()
        self._reclaim(index, owners.alone)
        return root, owners, index

    def _check_limit(self, index_dir: Path) -> float:
        try:
            size = (index_dir / "data.mdb").stat().st_size
        except OSError:
            size = 0
        return max(_MIN_CHECK_S, self._config.timeout_s, size / _CHECK_BYTES_PER_S)

    def _reclaim(self, index: DiskIndex, alone: bool) -> None:
        """Free slots reserved by puts whose process died before committing them."""
        try:
            with index.writing() as writer:
                reclaimed = writer.reclaim_pending(False if alone else None)
        except lmdb.Error:
            logger.warning("could not reclaim reserved slots of %s", index.path, exc_info=True)
            return
        if reclaimed:
            logger.info("reclaimed %d slots left reserved by crashed writers", reclaimed)

    def _quarantine(self, root: Path, damage: str) -> Path:
        moved = quarantine_store(root)
        logger.error(
            "disk store %s is damaged (%s); moved to %s, starting empty", root, damage, moved
        )
        self._counters.record_quarantine()
        return prepare_store_dir(self._config)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError("DiskBackend is closed")

    # -- reads ---------------------------------------------------------------------------

    def exists(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        return self._index.count_leading(keys)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        self._check_open()
        check_keys(keys)
        return self._index.contains(keys)

    def sizes(self, keys: Sequence[bytes]) -> list[int | None]:
        """Each key's stored payload length, None when absent (one index read, no data
        read, mutates nothing): what a reader that does not know the page sizes (the
        daemon) allocates before ``get``. A page replaced meanwhile is a miss of ``get``."""
        self._check_open()
        check_keys(keys)
        return self._index.payload_sizes(keys)

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        self._check_open()
        return self._reads.get(keys, dst)

    def get_scatter(self, keys: Sequence[bytes], dst: list[Sequence[memoryview]]) -> list[bool]:
        """Read each key's payload into the runs ``dst[i]``, in order (their lengths must
        add up to the stored payload length, else a miss). As ``get`` otherwise."""
        self._check_open()
        return self._reads.get_scatter(keys, dst)

    def get_records(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        """Read each key's whole record (header + payload, the header naming the store's
        key) into ``dst[i]``, whose length must be ``HEADER_BYTES`` + the stored payload
        length (else a miss). Verified as ``get`` verifies; ValueError for a buffer shorter
        than a header. For a caller that hands the record on as it is (the daemon)."""
        self._check_open()
        return self._reads.get_records(keys, dst)

    # -- writes --------------------------------------------------------------------------

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self._check_open()
        views = check_batch(keys, src, writable=False)
        if not views:
            return []
        with self._write_lock:
            self._check_open()
            return self._writes.put_locked(keys, views).stored

    def put_records(self, keys: Sequence[bytes], records: Sequence[memoryview]) -> list[bool]:
        """``put`` of whole records as the caller framed them (header + payload, as
        ``trusted_records`` says): each is stored under its key with its header's
        checksum, not hashed (reads check it); the header's key becomes the store
        key. ValueError (nothing stored) for a record that is not a whole record; as
        ``put`` otherwise."""
        return self.store_records(keys, records).stored

    def store_records(self, keys: Sequence[bytes], records: Sequence[memoryview]) -> RecordsPut:
        """``put_records``, also telling which keys now hold this call's record (not one
        stored before, whose first page is kept)."""
        self._check_open()
        trusted = trusted_records(keys, records)
        if not trusted:
            return RecordsPut([], [])
        payloads = [record.payload for record in trusted]
        checksums = [record.checksum for record in trusted]
        with self._write_lock:
            self._check_open()
            return self._writes.put_locked(keys, payloads, checksums)

    @property
    def fault_hook(self) -> FaultHook | None:
        """Called with each ``PutPhase`` of a put (crash tests); None in use."""
        return self._writes.fault_hook

    @fault_hook.setter
    def fault_hook(self, hook: FaultHook | None) -> None:
        self._writes.fault_hook = hook

    # -- the rest ------------------------------------------------------------------------

    def delete(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        try:
            with self._write_lock, self._index.writing() as writer:
                removed = sum(writer.remove(key) for key in keys)
        except lmdb.Error:
            logger.exception("disk store delete of %d pages failed", len(keys))
            return 0
        self._counters.note_removed(writer.removed)
        self._counters.record_deletes(removed)
        return removed

    def take_removed(self) -> list[bytes]:
        return self._counters.take_removed()

    def stats(self) -> StorageStats:
        self._check_open()
        entries, bytes_used = self._index.size()
        return self._counters.snapshot(entries, bytes_used, self._config.max_bytes)

    def close(self) -> None:
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
            self._pool.close()
            clean = self._close_index()
            self._segments.close()
            self._owners.release(self._index.data_file() if clean else None)

    def _close_index(self) -> bool:
        """Apply queued touches, sync and close the index; whether it closed sound."""
        clean = not self._index.damaged
        try:
            if clean:
                with self._index.writing() as writer:
                    for key in self._touches.take():
                        writer.touch(key)
                self._index.sync()
        except (lmdb.Error, StoreDamagedError):
            logger.exception("closing the disk store index of %s", self._root)
            clean = False
        finally:
            self._index.close()
        return clean
