"""hicache: a tiered (device / host / storage) radix KV cache for LLM inference."""

from __future__ import annotations

import importlib

# Public names, imported on first use so that `import hicache` stays cheap and
# importing one subpackage never drags in the others.
_EXPORTS = {
    "HiRadixCache": "hicache.cache",
    "MatchResult": "hicache.cache",
    "InsertResult": "hicache.cache",
    "CacheConfig": "hicache.config",
    "TokenKey": "hicache.radix_tree",
    "extend_key": "hicache.radix_tree",
}

__all__ = sorted(_EXPORTS)


def _version() -> str:
    import importlib.metadata  # slow to import (~30 ms): only when the version is asked for

    try:
        return importlib.metadata.version("hicache")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "0+unknown"


def __getattr__(name: str) -> object:
    if name == "__version__":
        return _version()
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hicache' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
