"""Load or recompute (DESIGN §12): how much of a lower tier's hit is worth loading.

A request's prompt is ``[device | host | storage | rest]``: the device part is
in place, the host part costs an H2D copy, the storage part a storage read
(then the same copy), the rest is computed. Loading the first ``k`` tokens past
the device part instead of computing them saves ``recompute(k) - load(k)``.

Within one tier the load time grows linearly with ``k`` while the time to
recompute a token grows with its position (attention reads more context), so
that saving is convex on each tier's part and its best value lies at a part's
end: the candidates are *nothing*, *the host part*, *host and storage parts*.
``choose`` takes the one that saves most once each load time is multiplied by
``margin`` (a load must beat recomputing clearly, not by noise); a tie goes to
the longer load. Cold start (no bandwidth or prefill rate measured yet) loads
everything, with no deadline of its own: the ``timeout`` budget bounds it.

A chosen storage read gets a deadline: its expected time plus a slack for
the rate's recent spread, and at least its expected time plus
``STALL_SHARE`` of the time recomputing it would take (a busy machine's
scheduling delays must not cut a fast read: a cut then costs the whole
recompute), never past its break-even (the time after which waiting costs
more than recomputing). A read still running then is cut where it stands:
the pages that arrived are used, the rest recomputed.

A link measured too slow to load is measured again now and then: after
``probe_after_s`` without a new measurement of it, a choice of nothing reads a
small first part (``PROBE_FRACTION`` of the hit, under the same deadline), so
a store that speeds up is noticed.

Pure functions of their arguments: safe on any thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from hicache.policies.rates import BandwidthEstimate, RatesSnapshot

PROBE_FRACTION = 16  # a probe reads 1/16 of the storage hit (at least a page)
JITTER_S = 0.002  # scheduling slack every deadline gets (the owner polls each tick)
STALL_SHARE = 0.1  # a read may overrun its expected time by this share of recomputing it


@dataclass(frozen=True)
class CostSettings:
    """The knobs of the decision (``policy.cost_margin``, ``policy.cost_probe_s``)."""

    margin: float = 1.25
    probe_after_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.margin >= 1.0:
            raise ValueError(f"cost margin must be >= 1, got {self.margin}")
        if not self.probe_after_s > 0:
            raise ValueError(f"cost probe interval must be > 0 s, got {self.probe_after_s}")


class PrefixParts(NamedTuple):
    """Where a request's prompt is cached: ``device`` tokens in place, then
    ``host`` tokens only host holds, then ``storage`` tokens only storage holds;
    ``page_size`` tokens a page, ``bytes_per_token`` of KV each."""

    device: int
    host: int
    storage: int
    page_size: int
    bytes_per_token: int


class LoadChoice(NamedTuple):
    """What to load: the first ``host`` tokens of the host part and the first
    ``storage`` tokens of the storage part. ``expected_s``: the storage read's
    expected time; ``deadline_s``: when to cut it (None: no measurement, the
    ``timeout`` budget applies); ``measured``: rates decided; ``probe``: a
    small read to measure a link judged too slow."""

    host: int
    storage: int
    expected_s: float = 0.0
    deadline_s: float | None = None
    measured: bool = False
    probe: bool = False


def load_everything(parts: PrefixParts) -> LoadChoice:
    """The fixed policies' choice (and cold start's): every cached token."""
    return LoadChoice(parts.host, parts.storage)


def choose(parts: PrefixParts, rates: RatesSnapshot, settings: CostSettings) -> LoadChoice:
    """The load that saves most against recomputing (see the module docstring)."""
    d, h, s = parts.device, parts.host, parts.storage
    whole = rates.recompute_s(d, d + h + s)
    if whole is None or (s and rates.s2h is None):
        return load_everything(parts)  # cold start (an unmeasured H2D link counts as free)
    bpt, m = parts.bytes_per_token, settings.margin
    read_s = _load_s(rates.s2h, s * bpt)
    # Candidates shortest first; a tie goes to the longer (>=).
    best, saved = (0, 0), 0.0
    if h:
        host_save = _recompute(rates, d, d + h) - m * _load_s(rates.h2d, h * bpt)
        if host_save >= saved:
            best, saved = (h, 0), host_save
    if s and whole - m * (_load_s(rates.h2d, (h + s) * bpt) + read_s) >= saved:
        return _with_deadline(LoadChoice(h, s, read_s, None, True), parts, rates, m)
    if s and rates.s2h is not None and rates.at - rates.s2h.last_at >= settings.probe_after_s:
        return _probe(LoadChoice(h, 0, 0.0, None, True), parts, rates)
    return LoadChoice(best[0], 0, 0.0, None, True)


def _load_s(est: BandwidthEstimate | None, nbytes: int) -> float:
    return 0.0 if nbytes == 0 or est is None else est.seconds_for(nbytes)


def _recompute(rates: RatesSnapshot, start: int, end: int) -> float:
    seconds = rates.recompute_s(start, end)
    return math.inf if seconds is None else seconds


def break_even_s(parts: PrefixParts, rates: RatesSnapshot, storage: int) -> float:
    """How long reading the first ``storage`` tokens of the storage part may
    take before recomputing them would have been faster (their H2D copy counted)."""
    start = parts.device + parts.host
    copy_s = _load_s(rates.h2d, storage * parts.bytes_per_token)
    return max(_recompute(rates, start, start + storage) - copy_s, 0.0)


def _with_deadline(
    choice: LoadChoice, parts: PrefixParts, rates: RatesSnapshot, margin: float
) -> LoadChoice:
    """Expected time plus slack for the rate's spread (and at least
    ``STALL_SHARE`` of recomputing), capped at break-even."""
    assert rates.s2h is not None
    slack = max(margin - 1.0, 2.0 * min(rates.s2h.variation, 1.0))
    cap = break_even_s(parts, rates, choice.storage)
    expected = choice.expected_s
    deadline = max(expected * (1.0 + slack) + JITTER_S, expected + STALL_SHARE * cap)
    return choice._replace(deadline_s=max(min(deadline, cap), JITTER_S))


def _probe(choice: LoadChoice, parts: PrefixParts, rates: RatesSnapshot) -> LoadChoice:
    """Read a small first part of the storage hit to measure the link again;
    its deadline is its break-even, so it costs at most what it could save."""
    ps = parts.page_size
    pages = max(parts.storage // ps // PROBE_FRACTION, 1)
    storage = min(pages * ps, parts.storage)
    assert rates.s2h is not None
    expected = _load_s(rates.s2h, storage * parts.bytes_per_token)
    deadline = max(break_even_s(parts, rates, storage), JITTER_S)
    return choice._replace(storage=storage, expected_s=expected, deadline_s=deadline, probe=True)


def storage_pages(
    parts: PrefixParts, found_pages: int, rates: RatesSnapshot, settings: CostSettings
) -> int:
    """Pages of a storage hit of ``found_pages`` to read (on the I/O worker,
    once the lookup found them): ``choose`` with that storage part."""
    ps = parts.page_size
    choice = choose(parts._replace(storage=found_pages * ps), rates, settings)
    return choice.storage // ps
