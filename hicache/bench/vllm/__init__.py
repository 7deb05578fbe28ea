"""``hicache bench vllm``: vLLM's secondary-tier jobs through HicacheTier (``bench``).

``from hicache.bench.vllm import NAME`` (the module this package replaced) keeps working:
the names of ``hicache.bench.vllm.bench`` are looked up on first use."""

from __future__ import annotations

import importlib


def __getattr__(name: str) -> object:
    return getattr(importlib.import_module(__name__ + ".bench"), name)
