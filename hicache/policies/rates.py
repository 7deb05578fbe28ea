"""Measured rates that the ``cost`` prefetch policy decides with (DESIGN §12).

- ``BandwidthMeter``: the bytes/s one link delivers (``h2d``: host -> device
  load-backs; ``s2h``: storage -> host reads, of one backend), a moving
  estimate over recent completed transfers with its recent spread (see the
  class). A transfer cut short counts with the bytes that arrived in the
  time it took, so a store that stalls shows up as a falling rate.
- ``PrefillMeter``: the engine's prefill speed in tokens/s as a function of
  how many tokens a forward pass computes, one moving estimate per
  power-of-two bucket (a pass's fixed cost weighs on a short one; attention
  makes a long one slower a token). Recomputing ``k`` tokens of a prompt is
  estimated at the speed of passes of about ``k`` tokens: a pass of a few
  tokens at a long context (a request's own tail) says nothing about it.
- ``Rates``: one meter per link and a prefill meter, with a clock;
  ``snapshot()`` is the immutable view a decision reads.

The clock is injected (``time.monotonic`` by default) so that tests drive
time. Thread-safe: a meter's updates and reads hold its lock (the owner
thread or an adapter's workers record; a Prometheus scrape reads).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

Clock = Callable[[], float]

# Weight of the newest transfer in a moving estimate: after 8 transfers at a
# new rate the estimate is within ~6% of it (0.7 ** 8), so a store that slows
# down or speeds up is followed within a few requests.
WEIGHT = 0.3
# An estimate this old weighs half as much against a new transfer: after a
# quiet spell (or a store judged too slow and left alone) the next transfer
# says most of what the link does now.
HALF_LIFE_S = 10.0
# Prefill buckets: lengths up to 2**k tokens, k in [MIN_BUCKET, MAX_BUCKET].
MIN_BUCKET, MAX_BUCKET = 4, 24
_TINY_S = 1e-9  # a transfer reported to take no time (a fake store) still counts


class BandwidthEstimate(NamedTuple):
    """One link's measured bandwidth: ``bytes_per_s`` (moving estimate),
    ``spread`` (its recent spread, bytes/s: the estimate times the moving
    standard deviation of the transfers' log-rates, as a ratio), ``samples``
    (transfers counted), ``last_at`` (clock time of the newest)."""

    bytes_per_s: float
    spread: float
    samples: int
    last_at: float

    def seconds_for(self, nbytes: float) -> float:
        """Expected seconds to move ``nbytes`` at this rate."""
        return nbytes / self.bytes_per_s if self.bytes_per_s > 0 else math.inf

    @property
    def variation(self) -> float:
        """``spread`` relative to the rate (0: steady)."""
        return self.spread / self.bytes_per_s if self.bytes_per_s > 0 else math.inf


class BandwidthMeter:
    """Moving bandwidth of one link: an exponentially weighted mean of the
    transfers' log-rates (a geometric mean: a link that slows down tenfold is
    followed as fast as one that speeds up tenfold). Each transfer weighs
    ``weight``, more when the estimate is old (``half_life_s``); an empty
    one (a read cut before anything arrived) counts as a byte in its time."""

    def __init__(self, weight: float = WEIGHT, half_life_s: float = HALF_LIFE_S) -> None:
        if not 0 < weight <= 1 or not half_life_s > 0:
            raise ValueError(f"need 0 < weight <= 1 and half_life_s > 0: {weight}, {half_life_s}")
        self._weight, self._half_life = weight, half_life_s
        self._lock = threading.Lock()
        self._log_rate = self._log_var = 0.0
        self._samples = 0
        self._last_at = 0.0

    def record(self, nbytes: int, seconds: float, at: float) -> None:
        """Count one transfer of ``nbytes`` that took ``seconds`` and ended at
        clock time ``at``. ValueError for negative or non-finite figures; a
        transfer of nothing in no time is ignored."""
        if nbytes < 0 or not 0 <= seconds < math.inf:
            raise ValueError(f"a transfer needs bytes >= 0 and finite seconds: {nbytes}, {seconds}")
        if nbytes == 0 and seconds == 0:
            return
        x = math.log(max(nbytes, 1) / max(seconds, _TINY_S))
        with self._lock:
            if self._samples == 0:
                self._log_rate = x
            else:
                aged = 1.0 - 0.5 ** (max(at - self._last_at, 0.0) / self._half_life)
                w = max(self._weight, aged)
                diff = x - self._log_rate
                self._log_rate += w * diff
                self._log_var = (1 - w) * (self._log_var + w * diff * diff)
            self._samples += 1
            self._last_at = at

    def estimate(self) -> BandwidthEstimate | None:
        """The current estimate, None before the first transfer."""
        with self._lock:
            if self._samples == 0:
                return None
            rate = math.exp(self._log_rate)
            spread = rate * math.expm1(math.sqrt(self._log_var))
            return BandwidthEstimate(rate, spread, self._samples, self._last_at)


class PrefillPoint(NamedTuple):
    """The prefill speed measured for passes of up to ``length`` new tokens
    (``bucket``: its index, see ``bucket_of``)."""

    length: int
    tokens_per_s: float
    samples: int
    bucket: int


class PrefillMeter:
    """Moving prefill tokens/s per power-of-two bucket of tokens computed."""

    def __init__(self, weight: float = WEIGHT) -> None:
        self._weight = weight
        self._lock = threading.Lock()
        self._buckets: dict[int, BandwidthMeter] = {}  # measured ones only

    def record(self, tokens: int, seconds: float, at: float) -> None:
        """A forward pass computed ``tokens`` new tokens (all its requests') in
        ``seconds``. ValueError for ``tokens < 1`` or a bad duration."""
        if tokens < 1:
            raise ValueError(f"a forward computes at least one token, got {tokens}")
        index = bucket_of(tokens)
        with self._lock:
            meter = self._buckets.get(index)
            if meter is None:
                meter = self._buckets[index] = BandwidthMeter(self._weight)
        meter.record(tokens, seconds, at)

    def points(self) -> tuple[PrefillPoint, ...]:
        """The measured buckets, shortest first."""
        with self._lock:
            measured = sorted(self._buckets.items())
        out = []
        for i, meter in measured:
            est = meter.estimate()
            if est is not None:
                out.append(PrefillPoint(1 << (i + MIN_BUCKET), est.bytes_per_s, est.samples, i))
        return tuple(out)


def bucket_of(length: int) -> int:
    """Index of the bucket holding ``length`` tokens (lengths past the last go there)."""
    k = max(MIN_BUCKET, (max(length, 1) - 1).bit_length())  # ceil(log2(length))
    return min(k, MAX_BUCKET) - MIN_BUCKET


class RatesSnapshot(NamedTuple):
    """What was measured, at clock time ``at``: per link (``h2d``, ``s2h``) the
    bandwidth (None: nothing measured yet), the measured prefill buckets, and
    ``prefill_fallback`` (tokens/s from config, 0: none) for when none is."""

    at: float
    h2d: BandwidthEstimate | None
    s2h: BandwidthEstimate | None
    prefill: tuple[PrefillPoint, ...]
    prefill_fallback: float = 0.0
    backend: str = ""

    def prefill_tokens_per_s(self, tokens: int) -> float | None:
        """Prefill speed of a forward computing ``tokens`` tokens: its bucket's,
        else the nearest measured bucket's (the longer on a tie), else the
        config's; None when there is none."""
        if not self.prefill:
            return self.prefill_fallback or None
        want, best = bucket_of(tokens), self.prefill[0]
        for point in self.prefill[1:]:  # shortest first: the longer wins a tie
            if abs(point.bucket - want) <= abs(best.bucket - want):
                best = point
        return best.tokens_per_s

    def recompute_s(self, start: int, end: int) -> float | None:
        """Expected seconds to compute tokens ``[start, end)`` of a prompt, at
        the speed of a forward computing as many; None without a prefill rate."""
        if end <= start:
            return 0.0
        rate = self.prefill_tokens_per_s(end - start)
        return None if rate is None else (end - start) / rate


class Rates:
    """The meters of one cache or adapter. ``backend`` names the store whose
    reads ``s2h`` measures; ``prefill_fallback`` is the config's tokens/s."""

    def __init__(
        self, clock: Clock = time.monotonic, backend: str = "", prefill_fallback: float = 0.0
    ) -> None:
        if prefill_fallback < 0:
            raise ValueError(f"prefill_fallback must be >= 0, got {prefill_fallback}")
        self.clock = clock
        self.backend = backend
        self.h2d = BandwidthMeter()
        self.s2h = BandwidthMeter()
        self.prefill = PrefillMeter()
        self._prefill_fallback = prefill_fallback
        # The last snapshot and the measurement count it was built at: a request
        # reads the rates a few times, a measurement lands once per transfer.
        self._lock = threading.Lock()
        self._version = 0
        self._last: tuple[int, RatesSnapshot] | None = None

    def record_h2d(self, nbytes: int, seconds: float) -> None:
        self.h2d.record(nbytes, seconds, self.clock())
        self._measured()

    def record_s2h(self, nbytes: int, seconds: float) -> None:
        self.s2h.record(nbytes, seconds, self.clock())
        self._measured()

    def record_prefill(self, tokens: int, seconds: float) -> None:
        self.prefill.record(tokens, seconds, self.clock())
        self._measured()

    def _measured(self) -> None:
        with self._lock:
            self._version += 1

    def snapshot(self) -> RatesSnapshot:
        """What was measured, now (built again only after a new measurement)."""
        version, last = self._version, self._last
        if last is not None and last[0] == version:
            return last[1]._replace(at=self.clock())
        h2d, s2h, prefill = self.h2d.estimate(), self.s2h.estimate(), self.prefill.points()
        snap = RatesSnapshot(self.clock(), h2d, s2h, prefill, self._prefill_fallback, self.backend)
        self._last = (version, snap)  # built after reading ``version``: never newer than it says
        return snap


def format_rates(snap: RatesSnapshot) -> list[str]:
    """The snapshot as lines a person reads (as ``hicache stats`` prints a daemon's)."""
    lines = []
    for link, est in (("h2d", snap.h2d), (f"s2h {snap.backend}".rstrip(), snap.s2h)):
        if est is None:
            lines.append(f"{link:<16} not measured yet")
            continue
        lines.append(
            f"{link:<16} {est.bytes_per_s / 1e6:>10.1f} MB/s  ± {est.spread / 1e6:.1f}  "
            f"(transfers: {est.samples}, newest {snap.at - est.last_at:.1f} s ago)"
        )
    if not snap.prefill:
        fallback = f"{snap.prefill_fallback:.0f} tokens/s (config)"
        lines.append(
            f"{'prefill':<16} " + (fallback if snap.prefill_fallback else "not measured yet")
        )
    for p in snap.prefill:
        label = f"prefill <={p.length}"
        lines.append(f"{label:<16} {p.tokens_per_s:>10.0f} tokens/s  (forward passes: {p.samples})")
    return lines
