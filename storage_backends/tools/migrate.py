"""Converting an LMDB store into a disk store (``hicache store migrate``).

Every check runs before anything is written: the source is an LMDB store of
this page format, structurally sound (``lmdb.check``), not open in another
process; the target is new or empty, on a file system with room. Pages are
then read in recency order (least recently used first, so the new store's LRU
keeps the old order), each verified (header, key, checksum); damaged ones are
skipped and counted. The new store is built in a sibling directory and moved
into place only when complete, so a failure leaves the source as it was. In
place (no target), the LMDB store is kept beside it as ``<path>.lmdb-<time>``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import lmdb

from storage_backends.base import StorageBackend
from storage_backends.config import StorageConfig
from storage_backends.errors import StorageError, StorageOpenError
from storage_backends.lmdb.check import check_store
from storage_backends.lmdb.clean import OPEN_LOCK
from storage_backends.page_format import FORMAT_VERSION, HEADER_BYTES, Verdict, validate
from storage_backends.registry import create
from storage_backends.store_kind import detect

logger = logging.getLogger(__name__)

_CHECK_S = 600.0  # the structural check of a big store on a cold disk
_BATCH_BYTES = 64 << 20
_HEADROOM = 1.25  # the new store's max_bytes over the pages' bytes (slot rounding, segments)


class MigrateError(StorageOpenError):
    """A migration refused before any change (or undone): the message says why."""


class MigrateResult(NamedTuple):
    """``kept``: where the LMDB store is now (the source itself unless migrated in place)."""

    target: Path
    kept: Path
    copied: int
    payload_bytes: int
    damaged: dict[str, int]  # verdict -> pages skipped
    not_stored: int  # pages the disk store refused (too big for its max_bytes)


class _Source(NamedTuple):
    fingerprint: str
    bytes_used: int


def migrate(source: Path, target: Path | None = None, max_bytes: int = 0) -> MigrateResult:
    """Convert the LMDB store at ``source`` into a disk store at ``target`` (``None``:
    in place). ``max_bytes`` of the new store (0: room for every page). Raises
    MigrateError, before any change, when the paths or the source are not fit."""
    source = source.expanduser().absolute()
    in_place = target is None or target.expanduser().absolute() == source
    final = source if in_place else Path(target or source).expanduser().absolute()
    with _exclusive(source):
        _check_target(final, in_place, (source / "data.mdb").stat().st_size)
        meta = _check_source(source)
        building = final.with_name(f"{final.name}.migrating")
        shutil.rmtree(building, ignore_errors=True)  # what an interrupted migration left
        limit = max_bytes or int(meta.bytes_used * _HEADROOM) + (64 << 20)
        config = StorageConfig(
            backend="disk", path=str(building), max_bytes=limit, fingerprint=meta.fingerprint
        )
        try:
            result = _copy(source, config)
        except (StorageError, OSError, lmdb.Error) as exc:
            shutil.rmtree(building, ignore_errors=True)
            raise MigrateError(f"migration of {source} failed, nothing changed: {exc}") from exc
    kept = _move_into_place(source, building, final, in_place)
    return result._replace(target=final, kept=kept)


@contextlib.contextmanager
def _exclusive(source: Path) -> Iterator[None]:
    """Hold the store's open lock exclusively: no process has it open, none opens it."""
    if not source.is_dir():
        raise MigrateError(f"{source} is not a directory")
    found = detect(source)
    if found != "lmdb":
        held = f"it holds a {found} store" if found else "no data.mdb, or stores of several kinds"
        raise MigrateError(f"{source} does not hold an LMDB store ({held})")
    try:
        fd = os.open(source / OPEN_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise MigrateError(f"{source}: cannot take its lock: {exc}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise MigrateError(f"{source} is open in another process; stop it first") from None
        yield
    finally:
        os.close(fd)


def _check_source(source: Path) -> _Source:
    damage = check_store(source, _CHECK_S).damage
    if damage is not None:
        raise MigrateError(f"{source}: the LMDB store is damaged ({damage}); nothing changed")
    env = _open_readonly(source)
    try:
        with env.begin() as txn:
            meta = env.open_db(b"meta", txn=txn, create=False)
            version = txn.get(b"format_version", db=meta)
            fingerprint = txn.get(b"fingerprint", b"", db=meta)
            used = txn.get(b"bytes_used", b"", db=meta)
    except lmdb.Error as exc:
        raise MigrateError(f"{source}: not a hicache LMDB store ({exc})") from exc
    finally:
        env.close()
    if version is None or int.from_bytes(version, "big") != FORMAT_VERSION:
        raise MigrateError(f"{source}: page format {version!r} is not v{FORMAT_VERSION}")
    return _Source(fingerprint.decode("ascii", "replace"), int.from_bytes(used, "big"))


def _open_readonly(source: Path) -> lmdb.Environment:
    try:
        return lmdb.open(str(source), readonly=True, max_dbs=4, subdir=True)
    except lmdb.Error as exc:
        raise MigrateError(f"{source}: cannot open the LMDB store: {exc}") from exc


def _check_target(final: Path, in_place: bool, needed: int) -> None:
    parent = final.parent
    if not in_place:
        if not parent.is_dir():
            raise MigrateError(f"target {final}: parent {parent} is not a directory")
        if final.exists() and (not final.is_dir() or any(final.iterdir())):
            raise MigrateError(f"target {final} exists and is not an empty directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise MigrateError(f"target {final}: {parent} is not writable")
    free = shutil.disk_usage(parent).free
    if free < needed:
        raise MigrateError(f"target {final}: needs {needed:,} bytes, {free:,} free")


def _pages_by_recency(source: Path) -> Iterator[tuple[bytes, bytes]]:
    """(key, stored record) of every page, least recently used first."""
    env = _open_readonly(source)
    try:
        with env.begin() as txn:
            dbs = [env.open_db(name, txn=txn, create=False) for name in (b"pages", b"lru")]
            pages, lru = dbs
            atime = env.open_db(b"atime", txn=txn, create=False)
            for key in txn.cursor(db=lru).iternext(keys=False, values=True):
                record = txn.get(key, db=pages)
                if record is not None:
                    yield key, record
            for key, record in txn.cursor(db=pages):
                if txn.get(key, db=atime) is None:  # never stamped: not yielded above
                    yield key, record
    finally:
        env.close()


@dataclasses.dataclass
class _Tally:
    copied: int = 0
    payload_bytes: int = 0
    not_stored: int = 0
    damaged: Counter[str] = dataclasses.field(default_factory=Counter)


def _copy(source: Path, config: StorageConfig) -> MigrateResult:
    store = create("disk", config)
    tally = _Tally()
    keys: list[bytes] = []
    views: list[memoryview] = []
    try:
        for key, record in _pages_by_recency(source):
            verdict = validate(memoryview(record), key, None)
            if verdict is not Verdict.OK:
                tally.damaged[verdict.value] += 1
                continue
            keys.append(key)
            views.append(memoryview(record)[HEADER_BYTES:])
            if sum(len(v) for v in views) >= _BATCH_BYTES:
                _put_batch(store, keys, views, tally)
        _put_batch(store, keys, views, tally)
    finally:
        store.close()
    return MigrateResult(
        source, source, tally.copied, tally.payload_bytes, dict(tally.damaged), tally.not_stored
    )


def _put_batch(
    store: StorageBackend, keys: list[bytes], views: list[memoryview], tally: _Tally
) -> None:
    """Put the batch into ``store``, count it in ``tally``, and empty it."""
    if keys:
        for ok, view in zip(store.put(keys, views), views, strict=True):
            tally.copied += ok
            tally.payload_bytes += ok * len(view)
            tally.not_stored += not ok
    keys.clear()
    views.clear()


def _move_into_place(source: Path, building: Path, final: Path, in_place: bool) -> Path:
    """Rename the finished store to ``final``; return where the LMDB store is now."""
    if not in_place:
        if final.exists():
            final.rmdir()  # checked empty above
        os.rename(building, final)
        return source
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kept = source.with_name(f"{source.name}.lmdb-{stamp}")
    os.rename(source, kept)
    os.rename(building, final)
    logger.info("migrated %s into a disk store; the LMDB store is kept at %s", final, kept)
    return kept
