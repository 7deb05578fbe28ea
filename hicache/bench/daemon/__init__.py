"""``hicache bench daemon`` (``bench``: throughput, ``cells``; fairness, ``fairness``; the
daemon under cProfile, ``profiler``) and ``hicache bench daemon-store`` (``store``).

``from hicache.bench.daemon import NAME`` (the module this package replaced) keeps working:
the names of ``hicache.bench.daemon.bench`` are looked up on first use."""

from __future__ import annotations

import importlib


def __getattr__(name: str) -> object:
    return getattr(importlib.import_module(__name__ + ".bench"), name)
