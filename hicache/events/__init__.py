"""KV events (``kv``: what a tier stored or removed, the sink, the ZeroMQ publisher) and their
wire formats (``formats``). ``from hicache.events import BlockStored`` keeps working: the names
of ``hicache.events.kv`` are looked up on first use."""

from __future__ import annotations

import importlib


def __getattr__(name: str) -> object:
    return getattr(importlib.import_module("hicache.events.kv"), name)
