"""What each link must sustain at the trace's real arrival rate: mean and p99 over windows.

Each request's traffic is counted in the window its timestamp falls in
(fixed windows of ``window_s`` from the first request on, empty ones
included), scaled to the chosen model's bytes per token. The mean is the
whole trace's bytes over the windows' time; the p99 is the 99th percentile of
the windows (numpy's linear interpolation), so a burst that a disk must
absorb shows even when the mean is low.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hicache.bench.tiering.trace.file import Trace

WINDOW_S = 10.0
PERCENTILE = 99.0


class Rate(NamedTuple):
    """A link's demand in GB/s (10**9 bytes a second) or a tokens/s figure."""

    mean: float
    p99: float
    peak: float


def window_index(trace: Trace, window_s: float) -> np.ndarray:
    """The window each request (arrival order) falls in."""
    if window_s <= 0:
        raise ValueError(f"window must be > 0 s, got {window_s}")
    stamps = np.fromiter((r.timestamp_ms for r in trace.records), np.int64, len(trace.records))
    return ((stamps - stamps[0]) / 1e3 // window_s).astype(np.int64)


def per_window(values: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """Sum of ``values`` per window, every window from the first to the last."""
    return np.bincount(windows, weights=values.astype(np.float64), minlength=int(windows[-1]) + 1)


def rate(values: np.ndarray, windows: np.ndarray, window_s: float, scale: float) -> Rate:
    """``values`` per request × ``scale`` as a rate per second: mean, p99 and peak window."""
    sums = per_window(values, windows) * scale / window_s
    mean = float(sums.sum() / len(sums))
    return Rate(mean, float(np.percentile(sums, PERCENTILE)), float(sums.max()))


def gbps_series(
    tokens: np.ndarray, windows: np.ndarray, window_s: float, bytes_per_token: int
) -> np.ndarray:
    """GB/s of each window (for the plot)."""
    return per_window(tokens, windows) * bytes_per_token / window_s / 1e9


def link_rate(
    tokens: np.ndarray, windows: np.ndarray, window_s: float, bytes_per_token: int
) -> Rate:
    """A link's demand in GB/s for the model whose KV takes ``bytes_per_token``."""
    return rate(tokens, windows, window_s, bytes_per_token / 1e9)
