"""Opening a store directory: path checks and the store's identity (format, fingerprint)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import NamedTuple

from storage_backends.config import StorageConfig
from storage_backends.errors import FingerprintMismatchError, StorageOpenError, StoreDamagedError
from storage_backends.page_format import FORMAT_VERSION

logger = logging.getLogger(__name__)


class StoreMeta(NamedTuple):
    """What a store records about itself when created."""

    format_version: int
    fingerprint: str


def prepare_store_dir(config: StorageConfig) -> Path:
    """Return ``config.store_dir()`` as a writable directory, creating it (not
    its parents, to catch typos, unless it is the default per-user directory).

    Raises StorageOpenError with the reason when that is impossible.
    """
    path = config.store_dir()
    if not config.path:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageOpenError(
                f"{path}: cannot create the user cache directory: {exc}"
            ) from exc
    if not path.parent.is_dir():
        raise StorageOpenError(
            f"storage.path {path}: parent directory {path.parent} is missing or not a directory"
        )
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise StorageOpenError(f"storage.path {path}: cannot create directory: {exc}") from exc
    if not path.is_dir():
        raise StorageOpenError(f"storage.path {path} exists and is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise StorageOpenError(f"storage.path {path} is not writable")
    return path


def stored_fingerprint(raw: bytes | None, where: str) -> str:
    """The fingerprint as stored in ``where``; StoreDamagedError if it is not the
    printable text written."""
    try:
        text = bytes(raw or b"").decode("ascii")
    except UnicodeDecodeError:
        text = "\n"
    if not text.isprintable():
        raise StoreDamagedError(f"{where}'s fingerprint is damaged: {raw!r:.80}")
    return text


def reconcile_meta(stored: StoreMeta | None, config: StorageConfig) -> StoreMeta:
    """Decide what the store's identity is after this open, or raise.

    A new store (``stored`` None) takes the configured fingerprint; an empty
    fingerprint on either side disables the check. Raises StorageOpenError for
    another format version and FingerprintMismatchError for another model
    (unless ``allow_fingerprint_mismatch``, which logs a warning and keeps the
    stored fingerprint).
    """
    if stored is None:
        return StoreMeta(FORMAT_VERSION, config.fingerprint)
    if stored.format_version != FORMAT_VERSION:
        raise StorageOpenError(
            f"store {config.store_dir()} uses page format v{stored.format_version}; this build "
            f"reads v{FORMAT_VERSION}; delete the directory to start a new store"
        )
    if not stored.fingerprint:
        return StoreMeta(FORMAT_VERSION, config.fingerprint)
    if not config.fingerprint or stored.fingerprint == config.fingerprint:
        return stored
    message = (
        f"store {config.store_dir()} was created for model fingerprint {stored.fingerprint}, "
        f"not {config.fingerprint}"
    )
    if not config.allow_fingerprint_mismatch:
        raise FingerprintMismatchError(
            message + "; set storage.allow_fingerprint_mismatch to use it anyway"
        )
    logger.warning("%s; using it because storage.allow_fingerprint_mismatch is set", message)
    return stored


def quarantine_store(path: Path) -> Path:
    """Move the damaged store at ``path`` aside to ``<path>.damaged-<UTC time>``.

    Returns the new path; the caller then starts an empty store at ``path``.
    Raises StorageOpenError when the directory cannot be moved.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    for n in range(1, 1000):  # two quarantines within one second keep both copies
        if not target.exists():
            break
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    try:
        os.rename(path, target)
    except OSError as exc:
        msg = f"storage.path {path}: damaged and cannot be moved aside: {exc}"
        raise StorageOpenError(msg) from exc
    return target
