"""Backend name → factory registry; a backend's module is imported only when created."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from storage_backends.base import StorageBackend
from storage_backends.builtins import BUILTIN_BACKENDS
from storage_backends.config import StorageConfig
from storage_backends.plugins import entry_point_names, load_factory

FACTORIES = BUILTIN_BACKENDS  # the built-in names; see storage_backends.builtins


def create(name: str, config: StorageConfig) -> StorageBackend:
    """Construct backend ``name`` from ``config``: a built-in name, a name
    registered under the ``hicache.storage_backends`` entry points, or
    ``package.module:Class`` (see ``storage_backends.plugins``).

    Raises ValueError for ``"none"`` (storage disabled), an unknown name or one
    that does not import, and whatever the backend raises when its store cannot
    be opened (``StorageOpenError``, ``FingerprintMismatchError``).
    """
    if name == "none":
        raise ValueError("storage backend 'none' means the storage tier is disabled")
    target = FACTORIES.get(name)
    if target is None:
        external = load_factory(name)
        if external is None:
            known = sorted({*FACTORIES, *entry_point_names()})
            raise ValueError(
                f"unknown storage backend {name!r}; known: {known}, or package.module:Class"
            )
        return external(config)
    module_name, class_name = target.split(":")
    factory: Callable[[StorageConfig], StorageBackend] = getattr(
        importlib.import_module(module_name), class_name
    )
    return factory(config)
