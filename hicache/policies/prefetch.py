"""Prefetch policies: how much of a lower tier's hit a request loads, and when
it may go on without the part still loading.

``PREFETCH_POLICIES`` is the one list of names that config validation, the
CLI help and the tests read. The fixed policies load every cached page and
differ in how long a request waits for its storage read; ``cost`` decides
from measured rates (``hicache.policies.prefetch_cost``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from hicache.policies.prefetch_cost import (
    CostSettings,
    LoadChoice,
    PrefixParts,
    choose,
    load_everything,
)
from hicache.policies.rates import RatesSnapshot
from hicache.policies.registry import create_policy


class PrefetchPolicy(Protocol):
    """Pure: decides, mutates nothing. ``cuts``: a storage read still running
    when its request goes on is stopped (the pages that arrived are used);
    otherwise it goes on and lands for later requests."""

    cuts: bool

    def plan(self, parts: PrefixParts, rates: RatesSnapshot, settings: CostSettings) -> LoadChoice:
        """How much of the host and storage parts of a prompt to load."""
        ...

    def ready(self, done: bool, waited_s: float, budget_s: float) -> bool:
        """May the request proceed, its storage read ``done`` or not, after
        ``waited_s`` seconds of a ``budget_s`` budget (the choice's deadline,
        else the ``timeout`` budget)?"""
        ...


class _LoadsEverything:
    cuts = False

    def plan(self, parts: PrefixParts, rates: RatesSnapshot, settings: CostSettings) -> LoadChoice:
        return load_everything(parts)


class BestEffort(_LoadsEverything):
    """Never wait: use what has landed by the time the request is scheduled."""

    def ready(self, done: bool, waited_s: float, budget_s: float) -> bool:
        return True


class WaitComplete(_LoadsEverything):
    """Wait until the whole prefetch has landed."""

    def ready(self, done: bool, waited_s: float, budget_s: float) -> bool:
        return done


class Timeout(_LoadsEverything):
    """Wait until it has landed or its time budget is spent."""

    def ready(self, done: bool, waited_s: float, budget_s: float) -> bool:
        return done or waited_s >= budget_s


class Cost(Timeout):
    """Load what arrives before it could be recomputed (measured rates, with a
    margin); cut a read that overruns its deadline. Cold start: ``timeout``."""

    cuts = True

    def plan(self, parts: PrefixParts, rates: RatesSnapshot, settings: CostSettings) -> LoadChoice:
        return choose(parts, rates, settings)


@dataclass(frozen=True)
class StoragePlan:
    """A prefetch's decision, made where the lookup ends (on an I/O worker,
    so pure): ``parts.storage`` is the tokens looked up, ``rates`` the rates
    when the prefetch started."""

    policy: PrefetchPolicy
    parts: PrefixParts
    rates: RatesSnapshot
    settings: CostSettings

    def choice(self, found_pages: int) -> LoadChoice:
        """The choice when storage holds ``found_pages`` leading pages."""
        ps = self.parts.page_size
        found = min(found_pages * ps, self.parts.storage)
        return self.policy.plan(self.parts._replace(storage=found), self.rates, self.settings)

    def pages(self, found_pages: int) -> int:
        """How many of ``found_pages`` to read."""
        return self.choice(found_pages).storage // self.parts.page_size


PREFETCH_POLICIES: dict[str, Callable[[], PrefetchPolicy]] = {
    "best_effort": BestEffort,
    "wait_complete": WaitComplete,
    "timeout": Timeout,
    "cost": Cost,
}


def create_prefetch_policy(name: str) -> PrefetchPolicy:
    """The policy named ``name``; ValueError naming the known ones otherwise."""
    return create_policy(PREFETCH_POLICIES, name, "prefetch")
