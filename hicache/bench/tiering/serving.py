"""One trace request served as the reference engine serves it (``serve``), and the figures a
replay reports (``TierReport``): what the tiering bench, its sharing rows and its plot share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch

from hicache.bench.common.workloads import TraceRequest
from hicache.cache import HiRadixCache

LINKS = ("d2h", "h2d", "h2s", "s2h")
TIERS = ("device", "host", "storage")


class Served(NamedTuple):
    """Tokens of one request reused from each tier, and its page-aligned length."""

    device: int
    host: int
    storage: int
    total: int


@dataclass(frozen=True)
class TierReport:
    """One set-up's figures. Every field but ``cache_ms_per_request`` (a
    timing) is the same on every run of the same seed and config."""

    name: str
    hit_rate: float
    hit_rate_by_tier: dict[str, float]
    prefill_tokens_saved: int
    bytes_moved: dict[str, int]
    cache_ms_per_request: float
    peak_bytes: dict[str, int]
    hit_rate_by_round: list[float]
    hit_rate_by_round_by_tier: dict[str, list[float]]

    def figures(self) -> dict[str, object]:
        """The reproducible part of the report (everything but timings)."""
        out = asdict(self)
        del out["cache_ms_per_request"]
        return out


def serve(cache: HiRadixCache, req: TraceRequest) -> Served:
    """One request of a generated workload (see ``serve_tokens``)."""
    return serve_tokens(cache, req.tokens)


def serve_tokens(cache: HiRadixCache, tokens: Sequence[int] | torch.Tensor) -> Served:
    """One request, driven the way the reference engine drives the cache,
    except that every asynchronous step is awaited (see ``hicache.bench.tiering.bench``).
    The token ids are converted and checked once, by the first match (``match.key``)."""
    m = cache.match_prefix(tokens)
    key = m.key
    assert key is not None  # match_prefix always returns the converted key
    device, fetched = m.device_hit_length, 0
    # The prefetch job looks storage up, then fetches, on the storage workers.
    if cache.storage is not None and cache.prefetch("bench", key, None, m.last_host_node):
        fetched = cache.wait_prefetch("bench").fetched_tokens
        cache.release_prefetch("bench")
        m = cache.match_prefix(key)
    prefix, last, _ = cache.admit(m)
    cache.start_loading()
    for layer in range(cache.device_pool.shape.num_layers):
        cache.wait_layer(layer)
    n_new = len(key) - prefix.numel()
    new = cache.alloc_device(n_new)
    if new is None:
        raise RuntimeError(f"no device room for a request: {cache.device_shortfall(n_new)}")
    cache.cache_finished_req(key, torch.cat([prefix, new[:n_new]]), last)
    cache.drain()
    reused = int(prefix.numel())
    aligned = len(key) // cache.page_size * cache.page_size
    return Served(device, max(reused - device - fetched, 0), fetched, aligned)
