"""Checking an LMDB store in a child process before this process maps it.

LMDB keeps no checksums on its B-tree pages: a damaged or truncated
``data.mdb`` can make the process that reads it die by SIGBUS, or abort on an
assertion inside a write. So the store is walked first in a child process
(``python -m storage_backends.lmdb_check <path>``): every sub-database's keys,
the last byte of every value (a value past the end of the file is what
raises SIGBUS), and the meta table; before that, ``lmdb_pages`` checks the
file's pages as a write would meet them (page numbers, free list), since
LMDB aborts the process on such damage inside a write. The child exits 0 when the store is
sound and 1 with the reason on stdout when it found damage; dying by a
signal is damage too.
"""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import lmdb

from storage_backends.lmdb_pages import walk_pages

_DB_NAMES = (b"pages", b"lru", b"atime", b"meta")
_U64_META = (b"format_version", b"bytes_used")
_FINGERPRINT = b"fingerprint"


class CheckResult(NamedTuple):
    """``damage`` is None unless damage was found, else what it is. ``finished`` is False
    when the walk ran out of time: no damage was found, and none ruled out."""

    damage: str | None
    finished: bool = True


def check_store(path: Path, timeout_s: float) -> CheckResult:
    """Walk the LMDB store at ``path`` in a child process (at most ``timeout_s``).

    A store without ``data.mdb`` is new and not checked. A child that cannot
    be started, or that runs out of time (a big, sound store on a cold disk takes
    minutes), is not evidence of damage: no damage is reported (``finished`` False
    for the time-out).
    """
    if not (path / "data.mdb").exists():
        return CheckResult(None)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    command = [sys.executable, "-m", "storage_backends.lmdb_check", str(path)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return CheckResult(None, finished=False)
    except OSError:
        return CheckResult(None)
    if done.returncode < 0:
        return CheckResult(f"reading it killed the checking process (signal {-done.returncode})")
    if done.returncode != 0:
        return CheckResult(done.stdout.strip() or done.stderr.strip()[-300:] or "check failed")
    return CheckResult(None)


def _walk_db(txn: lmdb.Transaction, db: lmdb._Database) -> int:
    """Read every key and the last byte of every value; return the entry count."""
    count = 0
    for _key, value in txn.cursor(db=db):
        if len(value):
            value[len(value) - 1]  # faults here, in the child, if past the file
        count += 1
    return count


def _check_meta(txn: lmdb.Transaction, db: lmdb._Database) -> str | None:
    for name in _U64_META:
        raw = txn.get(name, db=db)
        if raw is not None and len(raw) != 8:
            return f"meta {name.decode()} has {len(raw)} bytes, not 8"
    fingerprint = txn.get(_FINGERPRINT, db=db)
    if fingerprint is not None:
        try:
            printable = bytes(fingerprint).decode("ascii").isprintable()
        except UnicodeDecodeError:
            printable = False
        if not printable:
            return "meta fingerprint is not printable text"
    return None


def _walk_file(data: str) -> str | None:
    """The page-level check (``lmdb_pages``) on the file's bytes, before LMDB maps it."""
    with open(data, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:  # LMDB initialises an empty file
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf, memoryview(buf) as view:
            return walk_pages(view).damage


def walk(path: str) -> str | None:
    """The check itself (run in the child): None if sound, else the damage."""
    data = os.path.join(path, "data.mdb")
    damage = _walk_file(data)
    if damage is not None:
        return damage
    env = lmdb.open(path, readonly=True, max_dbs=len(_DB_NAMES), subdir=True)
    try:
        psize, last_pgno = env.stat()["psize"], env.info()["last_pgno"]
        if os.path.getsize(data) < (last_pgno + 1) * psize:
            return f"data.mdb is truncated: {os.path.getsize(data)} bytes, pages up to {last_pgno}"
        with env.begin(buffers=True) as txn:
            _walk_db(txn, env.open_db(None, txn=txn))
            dbs = {}
            for name in _DB_NAMES:
                try:
                    dbs[name] = env.open_db(name, txn=txn, create=False)
                except lmdb.NotFoundError:  # not created yet: nothing in it to damage
                    continue
                _walk_db(txn, dbs[name])
            if b"meta" in dbs:
                return _check_meta(txn, dbs[b"meta"])
    finally:
        env.close()
    return None


def main() -> int:
    try:
        damage = walk(sys.argv[1])
    except lmdb.Error as exc:
        damage = f"{type(exc).__name__}: {exc}"
    if damage is None:
        return 0
    print(damage)
    return 1


if __name__ == "__main__":
    sys.exit(main())
