"""The cache's error type."""

from __future__ import annotations


class CacheError(ValueError):
    """A call the cache refuses: bad node, bad lock, bad slots. Nothing was changed."""
