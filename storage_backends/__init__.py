"""Storage tier: the StorageBackend protocol, a registry and the backends."""

from storage_backends import _moved
from storage_backends.base import StorageBackend, StorageStats
from storage_backends.config import BACKENDS, StorageConfig
from storage_backends.errors import (
    FingerprintMismatchError,
    StorageClosedError,
    StorageError,
    StorageOpenError,
)
from storage_backends.registry import create

_moved.install()  # old module paths keep working for one release, with a warning

__all__ = [
    "BACKENDS",
    "FingerprintMismatchError",
    "StorageBackend",
    "StorageClosedError",
    "StorageConfig",
    "StorageError",
    "StorageOpenError",
    "StorageStats",
    "create",
]
