"""Look a policy up by name in its registry (a name → factory mapping)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

_P = TypeVar("_P")


def create_policy(registry: Mapping[str, Callable[[], _P]], name: str, what: str) -> _P:
    """A fresh ``what`` policy named ``name``; ValueError naming the known ones."""
    factory = registry.get(name)
    if factory is None:
        raise ValueError(f"unknown {what} policy {name!r}; known: {sorted(registry)}")
    return factory()
