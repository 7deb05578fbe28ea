"""Configuration: the cache's and the daemon's frozen dataclasses, the TOML loader, the shipped
files, their generated docs, and the command-line flags that override them.
``from hicache.config import CacheConfig`` keeps working: the names of ``hicache.config.cache``
are looked up on first use (so importing the loader alone stays light)."""

from __future__ import annotations

import importlib


def __getattr__(name: str) -> object:
    return getattr(importlib.import_module("hicache.config.cache"), name)
