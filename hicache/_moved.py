"""Old module paths that moved when ``hicache/`` was split into sub-packages.

For one release an import of an old path (``import hicache.metrics``, ``from
hicache.radix_tree import extend_key``) still works: it gets the module at its
new path, the same object, and a DeprecationWarning naming that path. A
finder first on ``sys.meta_path`` answers only the names in ``MOVED`` (and the
modules below a moved package); every other import passes it by. Old paths
that are now a package of the same name (``hicache.config``, ``hicache.cli``,
``hicache.events``, ``storage_backends.remote``) need no alias: the package
looks up the old module's names itself.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

# old path -> new path (docs/architecture.md, "Layers"; remove in the release after next)
MOVED: dict[str, str] = {
    "hicache.bad_token": "hicache.tree.bad_token",
    "hicache.cli_common": "hicache.config.flags",
    "hicache.config_doc": "hicache.config.doc",
    "hicache.config_loader": "hicache.config.loader",
    "hicache.daemon.config": "hicache.config.daemon",
    "hicache.daemon.protocol": "storage_backends.remote.protocol",
    "hicache.door": "hicache.tree.door",
    "hicache.errors": "hicache.tree.errors",
    "hicache.event_formats": "hicache.events.formats",
    "hicache.eviction": "hicache.policies.eviction",
    "hicache.hashing": "hicache.keys.hashing",
    "hicache.host_tier": "hicache.tiers.host",
    "hicache.integrity": "hicache.tree.integrity",
    "hicache.metrics": "hicache.observe.metrics",
    "hicache.native": "device_pool.native",
    "hicache.observer": "hicache.observe.observer",
    "hicache.paging": "hicache.tree.paging",
    "hicache.policy_registry": "hicache.policies.registry",
    "hicache.prefetch_policy": "hicache.policies.prefetch",
    "hicache.prometheus": "hicache.observe.prometheus",
    "hicache.radix_tree": "hicache.tree.radix_tree",
    "hicache.records": "hicache.tiers.records",
    "hicache.residency": "hicache.tiers.residency",
    "hicache.results": "hicache.tiers.results",
    "hicache.shipped": "hicache.config.shipped",
    "hicache.storage_tier": "hicache.tiers.storage",
    "hicache.store_cli": "hicache.cli.store",
    "hicache.token_ids": "hicache.tree.token_ids",
    "hicache.write_policy": "hicache.policies.write",
}


def new_name(old: str) -> str | None:
    """The new path of ``old`` (or of a module below a moved package); None if it did not move."""
    parts = old.split(".")
    for cut in range(len(parts), 1, -1):
        new = MOVED.get(".".join(parts[:cut]))
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


class MovedFinder(importlib.abc.MetaPathFinder):
    """Answers the moved paths only (see the module docstring)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once): first, so that a module below a moved
    package is never loaded a second time under its old name from the package's folder."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
