"""``hicache bench storage`` (``bench``: a backend against its baselines, ``targets``,
``mooncake``; the disk grid, ``disk_grid``, ``disk_sides``) and ``hicache bench storage-open``
(``store_open``).

``from hicache.bench.storage import NAME`` (the module this package replaced) keeps working:
the names of ``hicache.bench.storage.bench`` are looked up on first use."""

from __future__ import annotations

import importlib


def __getattr__(name: str) -> object:
    return getattr(importlib.import_module(__name__ + ".bench"), name)
