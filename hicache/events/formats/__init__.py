"""KV event wire formats: name -> format registry (a format's module is
imported only when it is created)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import MappingProxyType

from hicache.events.formats.base import END_SEQ, WireFormat, block_hash

# "module:class"; every format class is constructed as Cls(storage_backend).
FORMATS: MappingProxyType[str, str] = MappingProxyType(
    {
        "vllm": "hicache.events.formats.vllm:VllmFormat",
        "sglang": "hicache.events.formats.sglang:SglangFormat",
    }
)


def create_format(name: str, storage_backend: str) -> WireFormat:
    """Construct format ``name``; ``storage_backend`` is the storage tier's
    backend name (a format may name the storage medium after it). Raises
    ValueError for an unknown name."""
    target = FORMATS.get(name)
    if target is None:
        raise ValueError(f"unknown KV event format {name!r}; known: {sorted(FORMATS)}")
    module_name, class_name = target.split(":")
    factory: Callable[[str], WireFormat] = getattr(importlib.import_module(module_name), class_name)
    return factory(storage_backend)


__all__ = ["END_SEQ", "FORMATS", "WireFormat", "block_hash", "create_format"]
