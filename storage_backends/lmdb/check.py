"""Checking an LMDB store in a child process before this process maps it.

LMDB keeps no checksums on its B-tree pages: a damaged or truncated
``data.mdb`` can make the process that reads it die by SIGBUS, or abort on an
assertion inside a write. So the store is walked first in a child process
(``python -m storage_backends.lmdb.check <path> [budget_s]``): first ``pages``
checks the file's pages as a write would meet them (page numbers, free list, every
value's pages inside the file: a value past the end of the file is what raises
SIGBUS), since LMDB aborts the process on such damage inside a write; then LMDB's
own cursor pass over the keys of every named database the main database lists, and
the meta table; then, with the time left, the first page of a random sample of the
values of more than a page. Nothing reads the values themselves: the walk costs what
the trees take (tens of bytes a page), not what the store holds. With a budget the
child stops when it is spent (``finished`` False: no damage found, none ruled out).
The child writes its ``WalkReport`` as one JSON line on stdout and exits 0 when the
store is sound, 1 when it found damage; dying by a signal is damage too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import lmdb

logger = logging.getLogger(__name__)

_MAX_DBS = 16  # named databases a store may have (the backends use six at most)
# With a budget, the checks after the page-level walk (a sample of large values, LMDB's
# cursor pass: both read a page a value) stop this share of the budget after it ended:
# they add evidence, the walk is what keeps a write from meeting damage.
SAMPLE_SHARE = 0.25
_U64_META = (b"format_version", b"bytes_used")
_FINGERPRINT = b"fingerprint"


class CheckResult(NamedTuple):
    """``damage`` is None unless damage was found, else what it is. ``finished`` is False
    when the walk ran out of time (its budget, or the time limit): no damage was found,
    and none ruled out."""

    damage: str | None
    finished: bool = True


class WalkReport(NamedTuple):
    """What the child found: ``damage`` (None: sound), the named databases it walked
    (a store that was never written has none yet) and their entries in all;
    ``finished`` False when its budget ran out before the page-level walk ended; values
    of more than a page found (``overflow``), how many of them had their first page read
    (``sampled``), and whether LMDB's cursor pass met every entry (``cursor_done``)."""

    damage: str | None
    databases: tuple[str, ...] = ()
    entries: int = 0
    finished: bool = True
    overflow: int = 0
    sampled: int = 0
    cursor_done: bool = True

    def to_json(self) -> str:
        return json.dumps(self._asdict())

    @staticmethod
    def from_json(line: str) -> WalkReport | None:
        """The report on ``line``, or None when it is not one."""
        try:
            raw = json.loads(line)
            counts = (int(raw.get("overflow", 0)), int(raw.get("sampled", 0)))
            names, entries = tuple(raw["databases"]), int(raw["entries"])
            return WalkReport(
                raw["damage"], names, entries, bool(raw.get("finished", True)), *counts
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def check_store(path: Path, timeout_s: float, budget_s: float | None = None) -> CheckResult:
    """Walk the LMDB store at ``path`` in a child process (killed after ``timeout_s``),
    which stops by itself once it has spent ``budget_s`` (None: no budget).

    A store without ``data.mdb`` is new and not checked. A child that cannot
    be started, that runs out of time (a big, sound store on a cold disk takes
    minutes) or spends its budget, is not evidence of damage: no damage is reported
    (``finished`` False for the latter two).
    """
    if not (path / "data.mdb").exists():
        return CheckResult(None)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    command = [sys.executable, "-m", "storage_backends.lmdb.check", str(path)]
    if budget_s is not None:
        command.append(repr(budget_s))
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
    if not report.finished:
        logger.warning(
            "the structural check of %s spent its %g s budget before it ended; opening it "
            "as it is (each page is still verified when read)",
            path,
            budget_s,
        )
        return CheckResult(None, finished=False)
    logger.debug(
        "checked %s: %s; LMDB's cursor met %d entries%s; the first page of %d of %d large "
        "values read",
        path,
        ", ".join(report.databases),
        report.entries,
        "" if report.cursor_done else " (not all: the budget ran out)",
        report.sampled,
        report.overflow,
    )
    return CheckResult(None)


class _Spent(Exception):
    pass


def _walk_db(txn: lmdb.Transaction, db: lmdb._Database, deadline: float | None) -> int:
    """LMDB's cursor over every entry (values not read: the page walk placed them inside
    the file); the entry count. _Spent at the deadline."""
    count = 0
    for count, _entry in enumerate(txn.cursor(db=db).iternext(values=False), 1):
        if count % 4096 == 0 and deadline is not None and time.monotonic() > deadline:
            raise _Spent
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


def _database_names(txn: lmdb.Transaction, main: lmdb._Database) -> list[bytes]:
    """The main database's keys: the names of the named databases (each walked)."""
    return [bytes(key) for key in txn.cursor(db=main).iternext(keys=True, values=False)]


@contextlib.contextmanager
def mapped(data: str) -> Iterator[memoryview | None]:
    """``data.mdb`` mapped read-only (None when empty: LMDB initialises an empty file),
    reading only the pages touched (no read-ahead: the walk's pages are scattered)."""
    with open(data, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield None
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if hasattr(mmap, "MADV_RANDOM"):
                buf.madvise(mmap.MADV_RANDOM)
            with memoryview(buf) as view:
                yield view


def walk(path: str, budget_s: float | None = None) -> WalkReport:
    """The check itself (run in the child), in this order: the page-level walk
    (``pages``, which must end within ``budget_s``, else the report is unfinished),
    the meta table; then a sample of large values' first pages and LMDB's own cursor
    pass over every named database, for at most ``SAMPLE_SHARE`` of the budget more."""
    from storage_backends.lmdb.pages import PageWalk, sample_overflow, walk_pages  # numpy

    deadline = None if budget_s is None else time.monotonic() + budget_s
    with mapped(os.path.join(path, "data.mdb")) as view:
        pages = walk_pages(view, deadline) if view is not None else PageWalk(None, -1, ())
        if budget_s is not None and deadline is not None:
            deadline = min(deadline, time.monotonic() + budget_s * SAMPLE_SHARE)
        if pages.finished and pages.damage is None and view is not None:
            pages = sample_overflow(view, pages, deadline, random.Random())
    if pages.damage is not None:
        return WalkReport(pages.damage)
    if not pages.finished:
        return WalkReport(None, finished=False, overflow=pages.overflow_runs)
    found = _walk_env(path, deadline)
    return found._replace(overflow=pages.overflow_runs, sampled=pages.overflow_checked)


def _walk_env(path: str, deadline: float | None) -> WalkReport:
    """LMDB's own look: the file's length, the named databases, the meta table, then a
    cursor over every entry of every database until ``deadline`` (``cursor_done``)."""
    data = os.path.join(path, "data.mdb")
    env = lmdb.open(path, readonly=True, max_dbs=_MAX_DBS, subdir=True, readahead=False)
    try:
        psize, last_pgno = env.stat()["psize"], env.info()["last_pgno"]
        if os.path.getsize(data) < (last_pgno + 1) * psize:
            size = os.path.getsize(data)
            return WalkReport(f"data.mdb is truncated: {size} bytes, pages up to {last_pgno}")
        with env.begin(buffers=True) as txn:
            main = env.open_db(None, txn=txn)
            names = _database_names(txn, main)
            if len(names) > _MAX_DBS:
                return WalkReport(f"the main database lists {len(names)} databases")
            dbs = [env.open_db(name, txn=txn, create=False) for name in names]  # listed: exist
            if b"meta" in names and (damage := _check_meta(txn, dbs[names.index(b"meta")])):
                return WalkReport(damage)
            entries, done = _cursor_pass(txn, [main, *dbs], deadline)
    finally:
        env.close()
    decoded = tuple(n.decode(errors="replace") for n in names)
    return WalkReport(None, decoded, entries, cursor_done=done)


def _cursor_pass(
    txn: lmdb.Transaction, dbs: list[lmdb._Database], deadline: float | None
) -> tuple[int, bool]:
    """(entries seen, whether every database was walked before ``deadline``)."""
    entries = 0
    for db in dbs:
        try:
            entries += _walk_db(txn, db, deadline)
        except _Spent:
            return entries, False
    return entries, True


def main() -> int:
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else None
    try:
        report = walk(sys.argv[1], budget)
    except lmdb.Error as exc:
        report = WalkReport(f"{type(exc).__name__}: {exc}")
    sys.stdout.write(report.to_json() + "\n")
    return 0 if report.damage is None else 1


if __name__ == "__main__":
    sys.exit(main())
