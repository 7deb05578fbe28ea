"""Storage backends from outside the project.

A backend is named either ``package.module:Class`` (imported when created) or
by a name registered under the entry-point group ``hicache.storage_backends``
(``[project.entry-points."hicache.storage_backends"] mystore =
"mypkg.store:MyStore"`` in the plug-in's pyproject). Either way the class is
constructed as ``Cls(config)``, like a built-in backend.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Callable

from storage_backends.base import StorageBackend
from storage_backends.config import StorageConfig

ENTRY_POINT_GROUP = "hicache.storage_backends"
_DOTTED = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

Factory = Callable[[StorageConfig], StorageBackend]


def is_dotted(name: str) -> bool:
    """Whether ``name`` looks like ``package.module:Class``."""
    return bool(_DOTTED.match(name))


def entry_point_names() -> list[str]:
    """Backend names that installed distributions register (metadata only)."""
    return sorted(ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def load_factory(name: str) -> Factory | None:
    """The class a dotted name or an entry point names; None when ``name`` is
    neither. ValueError when it names something that does not import."""
    if is_dotted(name):
        module_name, _, attr = name.partition(":")
        try:
            factory: Factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"storage backend {name!r} does not import: {exc}") from exc
        return factory
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name):
        try:
            loaded: Factory = ep.load()
        except (ImportError, AttributeError) as exc:
            raise ValueError(
                f"storage backend {name!r} ({ep.value}) does not import: {exc}"
            ) from exc
        return loaded
    return None
