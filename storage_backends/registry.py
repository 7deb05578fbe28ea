"""Backend name → factory registry; a backend's module is imported only when created."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import MappingProxyType

from storage_backends.base import StorageBackend
from storage_backends.config import StorageConfig

# "module:class"; every backend class is constructed as Cls(config).
FACTORIES: MappingProxyType[str, str] = MappingProxyType(
    {
        "memory": "storage_backends.memory:MemoryBackend",
        "lmdb": "storage_backends.lmdb_backend:LmdbBackend",
        "file": "storage_backends.file_backend:FileBackend",
        "remote": "storage_backends.remote:RemoteBackend",
    }
)


def create(name: str, config: StorageConfig) -> StorageBackend:
    """Construct backend ``name`` from ``config``.

    Raises ValueError for ``"none"`` (storage disabled) or an unknown name, and
    whatever the backend raises when its store cannot be opened
    (``StorageOpenError``, ``FingerprintMismatchError``).
    """
    if name == "none":
        raise ValueError("storage backend 'none' means the storage tier is disabled")
    target = FACTORIES.get(name)
    if target is None:
        raise ValueError(f"unknown storage backend {name!r}; known: {sorted(FACTORIES)}")
    module_name, class_name = target.split(":")
    factory: Callable[[StorageConfig], StorageBackend] = getattr(
        importlib.import_module(module_name), class_name
    )
    return factory(config)
