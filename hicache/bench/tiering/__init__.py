"""``hicache bench tiering``: what the tiers buy (``bench``), two engines sharing a daemon
(``sharing``), the figure (``plot``).

``from hicache.bench.tiering import NAME`` (the module this package replaced) keeps working:
the names of ``hicache.bench.tiering.bench`` are looked up on first use."""

from __future__ import annotations

import importlib


def __getattr__(name: str) -> object:
    return getattr(importlib.import_module(__name__ + ".bench"), name)
