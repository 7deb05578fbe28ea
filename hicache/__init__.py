"""hicache: a tiered (device / host / storage) radix KV cache for LLM inference."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hicache import _moved
from hicache._version import __version__

if TYPE_CHECKING:  # what the lazy names are, for type checkers
    from hicache.policies.rates import RatesSnapshot as RatesSnapshot
    from hicache.policies.rates import format_rates as format_rates

_moved.install()  # old module paths keep working for one release, with a warning

# Public names, imported on first use so that `import hicache` stays cheap and
# importing one subpackage never drags in the others.
_EXPORTS = {
    "HiRadixCache": "hicache.cache",
    "MatchResult": "hicache.cache",
    "InsertResult": "hicache.cache",
    "CacheConfig": "hicache.config.cache",
    "RatesSnapshot": "hicache.policies.rates",
    "format_rates": "hicache.policies.rates",
    "TokenKey": "hicache.tree.radix_tree",
    "extend_key": "hicache.tree.radix_tree",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hicache' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
