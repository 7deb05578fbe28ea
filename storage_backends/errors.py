"""Typed errors of the storage tier.

A miss is never an error: backends report misses through their return values.
These exceptions cover misuse (a closed backend) and stores that cannot be
opened at all.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class of every error raised by a storage backend."""


class StorageClosedError(StorageError):
    """A backend method was called after ``close()``."""


class StorageOpenError(StorageError):
    """The store cannot be opened: missing parent directory, unwritable path, bad format."""


class FingerprintMismatchError(StorageOpenError):
    """The store was created for another model (different fingerprint)."""


class StorageWriteError(StorageError):
    """A write transaction did not commit (nothing of it happened); raised only by methods
    documented to raise it, for callers that must not acknowledge a failed write."""


class StoreDamagedError(StorageError):
    """The store's structure (not one page) is damaged; it must be closed and
    quarantined. Raised by a backend's methods at run time; ``GuardedBackend``
    turns it into misses and a fresh, empty store."""
