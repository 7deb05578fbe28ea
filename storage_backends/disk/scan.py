"""Read-only walks of a disk store for ``hicache store inspect`` / ``verify``: the index
opened read-only, every record read from its segment. Nothing here writes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import lmdb

from storage_backends.disk.allocator import from_u64
from storage_backends.disk.index import (
    DB_NAMES,
    META_FINGERPRINT,
    META_RECORD_LEAD,
    META_VERSION,
)
from storage_backends.disk.layout import INDEX_DIR, Location, segment_name
from storage_backends.errors import StorageOpenError


def is_disk_store(path: Path) -> bool:
    return (path / INDEX_DIR / "data.mdb").is_file()


def _open(path: Path) -> lmdb.Environment:
    try:
        return lmdb.open(str(path / INDEX_DIR), readonly=True, max_dbs=len(DB_NAMES), subdir=True)
    except lmdb.Error as exc:
        raise StorageOpenError(f"{path}: cannot open the disk store's index: {exc}") from exc


def meta(path: Path) -> tuple[int, str]:
    """(format version, fingerprint) recorded in the index."""
    env = _open(path)
    try:
        with env.begin(db=env.open_db(b"meta", create=False)) as txn:
            version = from_u64(txn.get(META_VERSION))
            fingerprint = bytes(txn.get(META_FINGERPRINT, b"")).decode(errors="replace")
    except lmdb.Error as exc:
        raise StorageOpenError(f"{path}: no hicache metadata in this index: {exc}") from exc
    finally:
        env.close()
    return version, fingerprint


def _lead(env: lmdb.Environment) -> int:
    """How far the segment files' slots lie from their start (``layout.RECORD_LEAD``)."""
    with env.begin(db=env.open_db(b"meta", create=False)) as txn:
        return from_u64(txn.get(META_RECORD_LEAD))


def pages(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """Every indexed (key, record as stored); a record that cannot be read comes back
    short or empty, so that the page check calls it damaged."""
    env = _open(path)
    fds: dict[int, int] = {}
    try:
        lead = _lead(env)
        with env.begin(db=env.open_db(b"pages", create=False)) as txn:
            for key, raw in txn.cursor():
                loc = Location.unpack(raw)
                blob = b"" if loc is None else _read(path, fds, loc, lead)
                yield bytes(key), blob
    finally:
        env.close()
        for fd in fds.values():
            os.close(fd)


class RecordPlace(NamedTuple):
    """Where one page's record is: its segment file, offset and length."""

    segment: Path
    offset: int
    length: int


def locate(path: Path, key: bytes) -> RecordPlace | None:
    """Where the store at ``path`` keeps ``key``'s record; None if it is not indexed."""
    env = _open(path)
    try:
        lead = _lead(env)
        with env.begin(db=env.open_db(b"pages", create=False)) as txn:
            raw = txn.get(key)
            loc = None if raw is None else Location.unpack(raw)
    finally:
        env.close()
    if loc is None:
        return None
    return RecordPlace(path / segment_name(loc.segment), loc.offset + lead, loc.record_len)


def _read(path: Path, fds: dict[int, int], loc: Location, lead: int) -> bytes:
    segment = loc.segment
    try:
        if segment not in fds:
            fds[segment] = os.open(path / segment_name(segment), os.O_RDONLY)
        return os.pread(fds[segment], loc.record_len, loc.offset + lead)
    except OSError:
        return b""
