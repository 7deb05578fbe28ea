"""One set-up's replay of a trace through ``HiRadixCache``: what each request got, per tier.

Each request is served as the generated workloads are (``tiering.serve_tokens``:
match, prefetch from storage, admit with load-back, insert, write-through,
eviction, every asynchronous step awaited), so the figures are what hicache's
own policies achieve and are the same on every run. What each request moved
over each link is read from the cache's counters around it, in tokens of the
replay's pools (the report scales them to the chosen model).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from hicache.bench.tiering.serving import LINKS, TIERS, serve_tokens
from hicache.bench.tiering.trace.file import Trace, prompt_tokens
from hicache.bench.tiering.trace.models import replay_bytes_per_token
from hicache.bench.tiering.trace.setups import TierSizes, TraceSetup
from hicache.cache import HiRadixCache


@dataclass(frozen=True)
class ReplayResult:
    """Per request (arrival order): tokens served from each tier (``hits``) and
    tokens moved over each link (``moved``); pages storage held at the end."""

    name: str
    sizes: TierSizes
    hits: dict[str, np.ndarray]
    moved: dict[str, np.ndarray]
    stored_pages: int
    seconds: float  # wall time of the replay (a timing: not a figure)


def _links(cache: HiRadixCache) -> list[int]:
    stats = cache.stats()
    return [getattr(stats, f"bytes_{link}") for link in LINKS]


def replay_job(setup: TraceSetup, trace: Trace, label: str, slot: int) -> ReplayResult:
    """``replay`` with one torch thread (a process's entry point for ``--jobs``)."""
    before = torch.get_num_threads()
    # A request's tensors are a few thousand slots: a second intra-op thread only adds
    # its synchronisation (3-4x the replay's time on 2 loaded cores, measured).
    torch.set_num_threads(1)
    try:
        return replay(setup, trace, label, slot)
    finally:
        torch.set_num_threads(before)


def replay(setup: TraceSetup, trace: Trace, label: str = "", slot: int = 0) -> ReplayResult:
    """Replay every request of ``trace`` through a fresh cache built from
    ``setup.config``; the cache is closed (its store too) before returning."""
    from tqdm import tqdm  # an extra (hicache[bench]); the CLI checks for it first

    n = len(trace.records)
    hits = {tier: np.zeros(n, np.int64) for tier in TIERS}
    moved = np.zeros((len(LINKS), n), np.int64)
    per_token = replay_bytes_per_token()
    started = time.perf_counter()
    with HiRadixCache(setup.config) as cache:
        before = _links(cache)
        bar = tqdm(trace.records, desc=label or setup.name, unit="req", leave=False, position=slot)
        for i, record in enumerate(bar):
            prompt = torch.from_numpy(prompt_tokens(record, trace.block_tokens))  # a view
            got = serve_tokens(cache, prompt)
            hits["device"][i], hits["host"][i], hits["storage"][i] = got[:3]
            after = _links(cache)
            moved[:, i] = [(a - b) // per_token for a, b in zip(after, before, strict=True)]
            before = after
        stored = cache.storage.backend.stats().entries if cache.storage is not None else 0
    seconds = time.perf_counter() - started
    by_link = {link: moved[k] for k, link in enumerate(LINKS)}
    return ReplayResult(setup.name, setup.sizes, hits, by_link, stored, seconds)
