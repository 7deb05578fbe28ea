"""The ``hicache`` command line (entry point ``hicache.cli:main``) and its ``store`` commands."""

from __future__ import annotations

import importlib


def __getattr__(name: str) -> object:
    return getattr(importlib.import_module("hicache.cli.app"), name)
