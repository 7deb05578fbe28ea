"""Which kind of local store a directory already holds, so that no open starts an empty
store beside one of another kind (a user's LMDB store under a config that now says
``disk``): the store is opened as what it is, and the log says so and how to convert it.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from storage_backends.config import StorageConfig
from storage_backends.errors import StorageOpenError

logger = logging.getLogger(__name__)

LOCAL_KINDS = ("disk", "lmdb", "file")
# What marks each kind's directory: disk keeps its LMDB index in a sub-directory,
# lmdb its one data file at the top, file a JSON description.
_MARKS = {"disk": Path("index") / "data.mdb", "lmdb": Path("data.mdb"), "file": Path("store.json")}


def kinds_in(path: Path) -> list[str]:
    """Every kind of local store ``path`` holds (none: missing or empty). Reads only names."""
    return [kind for kind, mark in _MARKS.items() if (path / mark).is_file()]


def detect(path: Path) -> str | None:
    """``disk``, ``lmdb`` or ``file`` for a directory holding that kind of store, None for
    anything else (missing, empty, or holding more than one kind). Reads only names."""
    found = kinds_in(path)
    if len(found) > 1:
        logger.warning("%s holds stores of several kinds (%s)", path, ", ".join(found))
    return found[0] if len(found) == 1 else None


def as_found(config: StorageConfig) -> StorageConfig:
    """``config``, with its backend replaced by the kind of local store its directory
    already holds when that differs (logged as a warning, with how to migrate).
    StorageOpenError when the directory holds stores of several kinds, none of them
    the configured one (which of them the user means is not for us to guess)."""
    if config.backend not in LOCAL_KINDS:
        return config
    kinds = kinds_in(config.store_dir())
    if len(kinds) > 1 and config.backend not in kinds:
        raise StorageOpenError(
            f"storage.path {config.store_dir()} holds stores of several kinds "
            f"({', '.join(kinds)}), none of them {config.backend}: set storage.backend to "
            "the one to use, or point storage.path at a directory of its own"
        )
    found = detect(config.store_dir())
    if found is None or found == config.backend:
        return config
    hint = ""
    if found == "lmdb" and config.backend == "disk":
        hint = f"; `hicache store migrate {config.store_dir()}` converts it into a disk store"
    logger.warning(
        "storage.path %s already holds a store of the %s backend, not %s: opening it as it "
        "is (its pages stay served)%s",
        config.store_dir(),
        found,
        config.backend,
        hint,
    )
    return dataclasses.replace(config, backend=found)
