"""Storage tier: the StorageBackend protocol, a registry and the backends."""

from storage_backends.config import BACKENDS, StorageConfig

__all__ = ["BACKENDS", "StorageConfig"]
