"""Opening an LMDB environment as the stores here do, and telling damage from failure.

The ``lmdb`` backend and the ``disk`` backend's index open their files the same
way: a sub-directory, a map sized by the caller, ``metasync`` off (commits stay
atomic and consistent; each fsync flushes the last meta page), fsync per commit as
``storage.sync`` says, a few spare read transactions. An LMDB error that means
the file's structure is broken is damage (the store is quarantined); any other is
a failure to open.
"""

from __future__ import annotations

from pathlib import Path

import lmdb

from storage_backends.errors import StorageOpenError, StoreDamagedError

# LMDB errors that mean the store's structure (not one call) is broken.
DAMAGE_ERRORS = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.PanicError,
    lmdb.InvalidError,
    lmdb.BadTxnError,
    lmdb.VersionMismatchError,
)


def raise_if_damage(exc: lmdb.Error, what: str) -> None:
    """Raise StoreDamagedError (from ``exc``) when ``exc`` is structural damage of
    ``what`` (a store named for the message); otherwise return."""
    if isinstance(exc, DAMAGE_ERRORS):
        raise StoreDamagedError(f"{what}: {type(exc).__name__}: {exc}") from exc


def open_env(path: Path, map_size: int, max_dbs: int, sync: bool, what: str) -> lmdb.Environment:
    """Open (creating) the environment in the directory ``path``; ``what`` names it in
    errors. Raises StoreDamagedError for a damaged file and StorageOpenError for any
    other failure (a missing or unwritable directory, a map the system refuses)."""
    try:
        return lmdb.open(
            str(path),
            map_size=map_size,
            subdir=True,
            max_dbs=max_dbs,
            metasync=False,
            sync=sync,
            max_spare_txns=4,
        )
    except lmdb.Error as exc:
        raise_if_damage(exc, f"{what} {path}")
        raise StorageOpenError(f"storage.path {path}: cannot open {what}: {exc}") from exc
    except OSError as exc:
        raise StorageOpenError(f"storage.path {path}: cannot open {what}: {exc}") from exc
