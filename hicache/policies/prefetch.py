"""Prefetch policies: when a request may go on without its storage prefetch.

``PREFETCH_POLICIES`` is the one list of names that config validation, the
CLI help and the tests read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from hicache.policies.registry import create_policy


class PrefetchPolicy(Protocol):
    """Decides readiness; pure (mutates nothing)."""

    def ready(self, done: bool, waited_s: float, budget_s: float) -> bool:
        """May the request proceed, its prefetch ``done`` or not, after
        ``waited_s`` seconds of a ``budget_s`` budget?"""
        ...


class BestEffort:
    """Never wait: use what has landed by the time the request is scheduled."""

    def ready(self, done: bool, waited_s: float, budget_s: float) -> bool:
        return True


class WaitComplete:
    """Wait until the whole prefetch has landed."""

    def ready(self, done: bool, waited_s: float, budget_s: float) -> bool:
        return done


class Timeout:
    """Wait until it has landed or its time budget is spent."""

    def ready(self, done: bool, waited_s: float, budget_s: float) -> bool:
        return done or waited_s >= budget_s


PREFETCH_POLICIES: dict[str, Callable[[], PrefetchPolicy]] = {
    "best_effort": BestEffort,
    "wait_complete": WaitComplete,
    "timeout": Timeout,
}


def create_prefetch_policy(name: str) -> PrefetchPolicy:
    """The policy named ``name``; ValueError naming the known ones otherwise."""
    return create_policy(PREFETCH_POLICIES, name, "prefetch")
