"""Load or recompute for the engines we plug into (DESIGN §12), as far as their
interfaces let us: the same measured rates and the same choice as the
``cost`` prefetch policy (``hicache.policies.prefetch_cost``).

An adapter measures its store's delivered bandwidth on its own reads; the
engine's prefill speed comes from the adapter's config
(``prefill_tokens_per_s``: SGLang and vLLM report none to their storage
plug-ins). With both known, ``LoadBounds.plan`` says how many of a hit's
pages are worth reading (the rest is recomputed) and by when the read must
be done; ``read`` reads in pieces and stops at that deadline, reporting the
pages not read as misses, so the engine recomputes them. Without a
measurement (cold start) or a prefill speed, every page is read and only the
store's own ``timeout_s`` bounds each call, as before.

Thread-safe: the rates hold locks; the choice is pure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

from hicache.policies.prefetch_cost import CostSettings, PrefixParts, choose
from hicache.policies.rates import Clock, Rates

PIECES = 8  # a read goes in up to this many pieces: a deadline cuts between them

ReadPiece = Callable[[int, int], list[bool]]  # pages [lo, hi) -> per-page hits


class ReadPlan(NamedTuple):
    """Read the first ``pages`` pages of a hit, within ``deadline_s`` (None: no
    deadline of its own)."""

    pages: int
    deadline_s: float | None


class LoadBounds:
    """The rates one adapter measures and the loads they bound.

    ``page_tokens``: tokens a stored page holds; ``prefill_tokens_per_s``: the
    engine's prefill speed (0: unknown, loads are not bounded)."""

    def __init__(
        self,
        page_tokens: int,
        prefill_tokens_per_s: float,
        backend: str = "",
        settings: CostSettings | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        if page_tokens < 1:
            raise ValueError(f"page_tokens must be >= 1, got {page_tokens}")
        self.page_tokens = page_tokens
        self.rates = Rates(clock, backend, prefill_tokens_per_s)
        self.settings = settings or CostSettings()

    def plan(self, pages: int, page_bytes: int) -> ReadPlan:
        """How much of a hit of ``pages`` leading pages to read, and by when."""
        bpt = max(page_bytes // self.page_tokens, 1)
        parts = PrefixParts(0, 0, pages * self.page_tokens, self.page_tokens, bpt)
        choice = choose(parts, self.rates.snapshot(), self.settings)
        return ReadPlan(choice.storage // self.page_tokens, choice.deadline_s)

    def read(
        self, pages: int, page_bytes: int, read_piece: ReadPiece, prefix: bool = True
    ) -> list[bool]:
        """Read up to ``pages`` pages with ``read_piece``, piece by piece, as
        ``plan`` says; the deadline passing ends the read (the pages not read
        are misses), and so does a miss when only a ``prefix`` is of use (SGLang;
        vLLM's chunks are used one by one). Measures what it read."""
        plan = self.plan(pages, page_bytes)
        clock = self.rates.clock
        start = clock()
        hits: list[bool] = []
        step = max(-(-plan.pages // PIECES), 1)
        for lo in range(0, plan.pages, step):
            if lo and plan.deadline_s is not None and clock() - start > plan.deadline_s:
                break
            got = read_piece(lo, min(lo + step, plan.pages))
            hits += got
            if prefix and not all(got):
                break
        if hits:
            self.rates.record_s2h(sum(hits) * page_bytes, clock() - start)
        return hits + [False] * (pages - len(hits))


def prefill_speed(extra: Mapping[str, object]) -> float:
    """``prefill_tokens_per_s`` of an adapter's extra config (0 when absent);
    ValueError unless a number >= 0."""
    value = extra.get("prefill_tokens_per_s", 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"prefill_tokens_per_s must be a number >= 0, got {value!r}")
    return float(value)
