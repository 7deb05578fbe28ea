"""Test-only fault injection: slow, failing, late and out-of-order transfers."""

from __future__ import annotations

import random
from dataclasses import dataclass


class InjectedFault(RuntimeError):
    """The failure a FaultInjection asked for; no bytes of that op are copied."""


@dataclass(frozen=True)
class FaultInjection:
    """What to break, deterministically for a given ``seed``.

    - ``delay_s`` + uniform(0, ``jitter_s``): drawn once per op (seeded by op
      id) and slept by the worker before *each layer* of that op, so per-layer
      progress is observable.
    - ``fail_every``: op ids divisible by it fail with InjectedFault (0: never).
    - ``hold``: completions are kept from ``poll`` until the engine's
      ``release(n)``; ``wait(op_id)`` still returns a held op.
    - ``reorder``: ``poll`` and ``release`` deliver in a seeded shuffled order.
    """

    delay_s: float = 0.0
    jitter_s: float = 0.0
    reorder: bool = False
    fail_every: int = 0
    hold: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.delay_s < 0 or self.jitter_s < 0:
            raise ValueError("delay_s and jitter_s must be >= 0")
        if self.fail_every < 0:
            raise ValueError("fail_every must be >= 0")

    def delay_for(self, op_id: int) -> float:
        """Seconds to wait before each layer of op ``op_id``."""
        if self.jitter_s == 0:
            return self.delay_s
        return self.delay_s + random.Random(self.seed * 1_000_003 + op_id).uniform(0, self.jitter_s)

    def fails(self, op_id: int) -> bool:
        return self.fail_every > 0 and op_id % self.fail_every == 0
