"""``hicache bench tree``: radix-tree speed (``bench``) against SGLang's own trees
(``sglang_trees``, driven by ``sglang_drivers``).

``from hicache.bench.tree import NAME`` (the module this package replaced) keeps working:
the names of ``hicache.bench.tree.bench`` are looked up on first use."""

from __future__ import annotations

import importlib


def __getattr__(name: str) -> object:
    return getattr(importlib.import_module(__name__ + ".bench"), name)
