"""Checking an LMDB store in a child process before this process maps it.

LMDB keeps no checksums on its B-tree pages: a damaged or truncated
``data.mdb`` can make the process that reads it die by SIGBUS, or abort on an
assertion inside a write. So the store is walked first in a child process
(``python -m storage_backends.lmdb.check <path>``): the keys of every named
database the main database lists, the last byte of every value (a value past
the end of the file is what raises SIGBUS), and the meta table; before that,
``pages`` checks the file's pages as a write would meet them (page
numbers, free list), since LMDB aborts the process on such damage inside a
write. The child writes its ``WalkReport`` as one JSON line on stdout and exits 0
when the store is sound, 1 when it found damage; dying by a signal is damage too.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import lmdb

logger = logging.getLogger(__name__)

_MAX_DBS = 16  # named databases a store may have (the backends use six at most)
_U64_META = (b"format_version", b"bytes_used")
_FINGERPRINT = b"fingerprint"


class CheckResult(NamedTuple):
    """``damage`` is None unless damage was found, else what it is. ``finished`` is False
    when the walk ran out of time: no damage was found, and none ruled out."""

    damage: str | None
    finished: bool = True


class WalkReport(NamedTuple):
    """What the child found: ``damage`` (None: sound), the named databases it walked
    (a store that was never written has none yet) and their entries in all."""

    damage: str | None
    databases: tuple[str, ...] = ()
    entries: int = 0

    def to_json(self) -> str:
        return json.dumps(self._asdict())

    @staticmethod
    def from_json(line: str) -> WalkReport | None:
        """The report on ``line``, or None when it is not one."""
        try:
            raw = json.loads(line)
            return WalkReport(raw["damage"], tuple(raw["databases"]), int(raw["entries"]))
        except (ValueError, TypeError, KeyError):
            return None


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
    command = [sys.executable, "-m", "storage_backends.lmdb.check", str(path)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        logger.warning(
            "the structural check of %s did not finish in %g s; opening it unchecked "
            "(each page is still verified when read)",
            path,
            timeout_s,
        )
        return CheckResult(None, finished=False)
    except OSError as exc:
        logger.warning("could not start the structural check of %s (%s); opening it", path, exc)
        return CheckResult(None)
    if done.returncode < 0:
        return CheckResult(f"reading it killed the checking process (signal {-done.returncode})")
    lines = done.stdout.strip().splitlines()
    report = WalkReport.from_json(lines[-1]) if lines else None
    if report is None:  # the child failed before it could report: no sound verdict
        return CheckResult(done.stderr.strip()[-300:] or "the check failed without a report")
    if done.returncode != 0:
        return CheckResult(report.damage or "the check failed without naming the damage")
    logger.debug("checked %s: %s, %d entries", path, ", ".join(report.databases), report.entries)
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
    """The page-level check (``pages``) on the file's bytes, before LMDB maps it."""
    from storage_backends.lmdb.pages import walk_pages  # numpy: loaded in the child only

    with open(data, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:  # LMDB initialises an empty file
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf, memoryview(buf) as view:
            return walk_pages(view).damage


def _database_names(txn: lmdb.Transaction, main: lmdb._Database) -> list[bytes]:
    """The main database's keys: the names of the named databases (each walked)."""
    return [bytes(key) for key in txn.cursor(db=main).iternext(keys=True, values=False)]


def walk(path: str) -> WalkReport:
    """The check itself (run in the child)."""
    data = os.path.join(path, "data.mdb")
    damage = _walk_file(data)
    if damage is not None:
        return WalkReport(damage)
    env = lmdb.open(path, readonly=True, max_dbs=_MAX_DBS, subdir=True)
    try:
        psize, last_pgno = env.stat()["psize"], env.info()["last_pgno"]
        if os.path.getsize(data) < (last_pgno + 1) * psize:
            size = os.path.getsize(data)
            return WalkReport(f"data.mdb is truncated: {size} bytes, pages up to {last_pgno}")
        with env.begin(buffers=True) as txn:
            main = env.open_db(None, txn=txn)
            entries = _walk_db(txn, main)
            names = _database_names(txn, main)
            if len(names) > _MAX_DBS:
                return WalkReport(f"the main database lists {len(names)} databases")
            for name in names:
                db = env.open_db(name, txn=txn, create=False)  # listed: it exists
                entries += _walk_db(txn, db)
                if name == b"meta" and (damage := _check_meta(txn, db)) is not None:
                    return WalkReport(damage)
    finally:
        env.close()
    return WalkReport(None, tuple(n.decode(errors="replace") for n in names), entries)


def main() -> int:
    try:
        report = walk(sys.argv[1])
    except lmdb.Error as exc:
        report = WalkReport(f"{type(exc).__name__}: {exc}")
    sys.stdout.write(report.to_json() + "\n")
    return 0 if report.damage is None else 1


if __name__ == "__main__":
    sys.exit(main())
