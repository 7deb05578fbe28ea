"""The store a tiering row's storage tier uses: the config's backend, never a store of the user's.

A path store (``disk``, ``lmdb``, ``file``) gets a fresh directory of the bench's;
a shared network store (``redis``, ``mooncake``) is used under a key prefix of this
run; ``remote`` (the configured daemon) and ``memory`` as they are. With no storage
tier configured, LMDB in the bench's directory.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hicache.config.cache import CacheConfig
from storage_backends import StorageConfig

# Backends whose store is a directory: the bench gives them a fresh temporary one.
PATH_BACKENDS = ("disk", "lmdb", "file")
# Backends of a shared network store: the bench uses it under a key prefix of its own.
NETWORK_BACKENDS = ("redis", "mooncake")


def storage_setup(config: CacheConfig, store_dir: Path) -> StorageConfig:
    """The storage tier a bench row with storage uses (see the module docstring)."""
    storage = config.storage
    if not storage.enabled:
        return StorageConfig(backend="lmdb", path=str(store_dir), max_bytes=8 << 30)
    if storage.backend in PATH_BACKENDS:
        return replace(storage, path=str(store_dir))
    if storage.backend in NETWORK_BACKENDS:  # keys of this run only: no earlier run's pages
        return replace(storage, key_prefix=f"{storage.key_prefix}-{store_dir.parent.name}")
    return storage
