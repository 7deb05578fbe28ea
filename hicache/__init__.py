"""hicache: a tiered (device / host / storage) radix KV cache for LLM inference."""

from __future__ import annotations

import importlib

from hicache import _moved
from hicache._version import __version__

_moved.install()  # old module paths keep working for one release, with a warning

# Public names, imported on first use so that `import hicache` stays cheap and
# importing one subpackage never drags in the others.
_EXPORTS = {
    "HiRadixCache": "hicache.cache",
    "MatchResult": "hicache.cache",
    "InsertResult": "hicache.cache",
    "CacheConfig": "hicache.config.cache",
    "TokenKey": "hicache.tree.radix_tree",
    "extend_key": "hicache.tree.radix_tree",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hicache' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
