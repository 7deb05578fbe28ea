"""Read-only scans of a store directory (disk, lmdb or file): what it holds, and
whether every page passes its checksum. Nothing here writes to the store;
damaged pages are reported, not deleted (the backends delete them on read).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import lmdb

from storage_backends.disk import scan as disk_scan
from storage_backends.errors import StorageOpenError
from storage_backends.file import backend as file_backend
from storage_backends.lmdb import writes as lmdb_writes
from storage_backends.page_format import HEADER_BYTES, Verdict, parse_header, validate
from storage_backends.store_kind import kinds_in

_LMDB_DATA = "data.mdb"
_SHOWN_DAMAGED = 10


class StoreSummary(NamedTuple):
    """What a store directory holds, as recorded and as counted."""

    path: Path
    kind: str  # "disk", "lmdb" or "file"
    format_version: int
    fingerprint: str
    pages: int
    bytes: int  # stored bytes, headers included
    payload_bytes: int
    page_sizes: dict[int, int]  # payload length -> pages


class VerifyResult(NamedTuple):
    """A checksum pass over every page; ``damaged`` holds (key hex, verdict)
    for the first few damaged pages."""

    checked: int
    verdicts: dict[str, int]
    damaged: list[tuple[str, str]]

    @property
    def ok(self) -> bool:
        return self.checked == self.verdicts.get(Verdict.OK.value, 0)


def store_kind(path: Path, kind: str | None = None) -> str:
    """The kind of store at ``path`` to read: ``kind`` when given, else the one kind the
    directory holds. StorageOpenError when it holds none, holds no store of ``kind``, or
    holds several kinds and ``kind`` does not say which (guessing could report the wrong
    store's pages as the user's)."""
    found = kinds_in(path)
    if kind is not None:
        if kind not in found:
            raise StorageOpenError(f"{path}: holds no {kind} store (found: {_listed(found)})")
        return kind
    if len(found) > 1:
        raise StorageOpenError(
            f"{path}: holds stores of several kinds ({_listed(found)}): name the one to read "
            "with --kind"
        )
    if not found:
        raise StorageOpenError(
            f"{path}: not a disk, lmdb or file store (no index/{_LMDB_DATA}, {_LMDB_DATA}, "
            "store.json)"
        )
    return found[0]


def _listed(kinds: list[str]) -> str:
    return ", ".join(kinds) or "none"


def pages(path: Path, kind: str | None = None) -> Iterator[tuple[bytes, bytes]]:
    """Every stored (key, header+payload) of the store at ``path`` (of ``kind``, see
    ``store_kind``)."""
    kind = store_kind(path, kind)
    if kind == "disk":
        yield from disk_scan.pages(path)
    elif kind == "lmdb":
        yield from _lmdb_pages(path)
    else:
        yield from _file_pages(path)


def summarize(path: Path, kind: str | None = None) -> StoreSummary:
    """What the store at ``path`` (of ``kind``, see ``store_kind``) holds; reads it all."""
    kind = store_kind(path, kind)
    readers = {"disk": disk_scan.meta, "lmdb": _lmdb_meta, "file": _file_meta}
    version, fingerprint = readers[kind](path)
    count = stored = payload = 0
    sizes: Counter[int] = Counter()
    for _key, blob in pages(path, kind):
        header = parse_header(blob)
        length = header.payload_len if header else len(blob) - HEADER_BYTES
        count, stored, payload = count + 1, stored + len(blob), payload + max(length, 0)
        sizes[length] += 1
    return StoreSummary(path, kind, version, fingerprint, count, stored, payload, dict(sizes))


def verify(path: Path, kind: str | None = None) -> VerifyResult:
    """Check header and xxh3 checksum of every page of the store at ``path`` (of ``kind``,
    see ``store_kind``; reads every byte)."""
    verdicts: Counter[str] = Counter()
    damaged: list[tuple[str, str]] = []
    checked = 0
    for key, blob in pages(path, kind):
        verdict = validate(memoryview(blob), key, None)
        checked += 1
        verdicts[verdict.value] += 1
        if verdict is not Verdict.OK and len(damaged) < _SHOWN_DAMAGED:
            damaged.append((key.hex(), verdict.value))
    return VerifyResult(checked, dict(verdicts), damaged)


def _open_lmdb(path: Path) -> lmdb.Environment:
    try:
        return lmdb.open(str(path), readonly=True, max_dbs=4, subdir=True)
    except lmdb.Error as exc:
        raise StorageOpenError(f"{path}: cannot open LMDB store: {exc}") from exc


def _lmdb_meta(path: Path) -> tuple[int, str]:
    env = _open_lmdb(path)
    try:
        with env.begin(db=env.open_db(b"meta", create=False)) as txn:
            version = txn.get(lmdb_writes.META_VERSION)
            fingerprint = txn.get(lmdb_writes.META_FINGERPRINT, b"")
    except lmdb.Error as exc:
        raise StorageOpenError(f"{path}: no hicache metadata in this LMDB store: {exc}") from exc
    finally:
        env.close()
    return (int.from_bytes(version, "big") if version else 0), fingerprint.decode()


def _lmdb_pages(path: Path) -> Iterator[tuple[bytes, bytes]]:
    env = _open_lmdb(path)
    try:
        with env.begin(db=env.open_db(b"pages", create=False)) as txn:
            yield from txn.cursor()
    finally:
        env.close()


def _file_meta(path: Path) -> tuple[int, str]:
    meta = file_backend._load_meta(path / file_backend._META_FILE)
    return (meta.format_version, meta.fingerprint) if meta else (0, "")


def _file_pages(path: Path) -> Iterator[tuple[bytes, bytes]]:
    for key, entry in file_backend.page_files(path):
        with open(entry.path, "rb") as f:
            yield key, f.read()
