"""``hicache bench sglang``: SGLang's L3 traffic through hicache (``bench``), and the linker's
rows (``linker``, ``linker_rows``).

``from hicache.bench.sglang import NAME`` (the module this package replaced) keeps working:
the names of ``hicache.bench.sglang.bench`` are looked up on first use."""

from __future__ import annotations

import importlib


def __getattr__(name: str) -> object:
    return getattr(importlib.import_module(__name__ + ".bench"), name)
