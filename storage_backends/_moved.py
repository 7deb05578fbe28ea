"""Old module paths that moved when a package was split into sub-packages.

For one release an import of an old path (``import storage_backends.lmdb_backend``,
``from hicache.radix_tree import extend_key``) still works: it gets the module at
its new path, the same object, and a DeprecationWarning naming that path. A
finder first on ``sys.meta_path`` answers only the names in its map (and the
modules below a moved package); every other import passes it by. Old paths
that are now a package of the same name (``hicache.config``, ``hicache.cli``,
``hicache.events``, ``storage_backends.remote``, ``hicache.bench.tiering``, ...)
need no alias: the package looks up the old module's names itself.

The mechanism lives here, in the lowest package that has moved modules, so that
``storage_backends`` (which must not import ``hicache``) installs it for its own
map (``MOVED`` below) and ``hicache`` for its map (``hicache/_moved.py``): one
finder class, one instance per map.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Mapping, Sequence
from types import CodeType, MappingProxyType, ModuleType

# old path -> new path (docs/architecture.md, "Where the code lives"; remove after next release)
MOVED: Mapping[str, str] = MappingProxyType(
    {
        "storage_backends.file_backend": "storage_backends.file.backend",
        "storage_backends.inspect": "storage_backends.tools.inspect",
        "storage_backends.lmdb_backend": "storage_backends.lmdb.backend",
        "storage_backends.lmdb_check": "storage_backends.lmdb.check",
        "storage_backends.lmdb_clean": "storage_backends.lmdb.clean",
        "storage_backends.lmdb_env": "storage_backends.lmdb.env",
        "storage_backends.lmdb_pages": "storage_backends.lmdb.pages",
        "storage_backends.migrate": "storage_backends.tools.migrate",
        "storage_backends.mooncake_backend": "storage_backends.mooncake.backend",
        "storage_backends.mooncake_client": "storage_backends.mooncake.client",
        "storage_backends.mooncake_local": "storage_backends.mooncake.local",
        "storage_backends.redis_backend": "storage_backends.redis.backend",
        "storage_backends.redis_cluster": "storage_backends.redis.cluster",
        "storage_backends.redis_nodes": "storage_backends.redis.nodes",
    }
)


def new_name(old: str, moved: Mapping[str, str]) -> str | None:
    """The new path of ``old`` (or of a module below a moved package); None if it did not move."""
    parts = old.split(".")
    for cut in range(len(parts), 1, -1):
        new = moved.get(".".join(parts[:cut]))
        if new is not None:
            return ".".join([new, *parts[cut:]])
    return None


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new path (the same object), with a warning."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self.spec = module.__spec__  # the import system overwrites it; exec_module restores it
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec

    def get_code(self, fullname: str) -> CodeType | None:
        """``python -m OLD`` runs the new module's code as ``__main__`` (runpy asks for it)."""
        warnings.warn(f"{fullname} moved to {self.new}", DeprecationWarning, stacklevel=2)
        spec = importlib.util.find_spec(self.new)
        loader = spec.loader if spec is not None else None
        if not isinstance(loader, importlib.abc.InspectLoader):
            return None
        return loader.get_code(self.new)


class MovedFinder(importlib.abc.MetaPathFinder):
    """Answers the moved paths of one map only (see the module docstring)."""

    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved = moved

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname, self.moved)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install(moved: Mapping[str, str] = MOVED) -> None:
    """Put a finder for ``moved`` first on ``sys.meta_path`` (once per map): first, so that a
    module below a moved package is never loaded a second time under its old name from the
    package's folder."""
    if not any(isinstance(f, MovedFinder) and f.moved is moved for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder(moved))
