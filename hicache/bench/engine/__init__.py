"""``hicache bench engine``: TTFT with a prefix recomputed or reused from each tier (``bench``).

``from hicache.bench.engine import NAME`` (the module this package replaced) keeps working:
the names of ``hicache.bench.engine.bench`` are looked up on first use."""

from __future__ import annotations

import importlib


def __getattr__(name: str) -> object:
    return getattr(importlib.import_module(__name__ + ".bench"), name)
