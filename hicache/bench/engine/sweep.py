"""``bench engine --sweep``: TTFT of a storage hit over a store throttled from far
slower than prefill to far faster, per prefetch policy, against recomputing.

The same engine as ``bench engine`` (TinyLlama, ``--prefix-tokens`` shared
prefix, ``--suffix-tokens`` of the request's own). Calibration first: the
TTFT of recomputing the whole prompt and of a device hit give the
*break-even bandwidth*, the prefix's KV bytes over the time a hit saves.
Then, per bandwidth (``--bandwidths`` in MB/s, default: the break-even times
1/8 .. 64), one cache per policy (``best_effort``, ``timeout``,
``wait_complete``, ``cost``, and ``recompute``: no storage tier), each over
its own memory store behind a ``ThrottledBackend`` of that bandwidth. Each
request: a fresh prefix is computed, pushed down to storage, then asked for
again with a new suffix; its TTFT counts. The caches keep their measured
rates across requests (what ``cost`` decides with); the first ``--warmup``
requests of each are not counted. Policies take turns request by request, so
that the machine's load falls on all of them alike; figures are medians.

Besides: the decision's own cost per request next to ``match_prefix`` (CPU
µs, on a warm cache), a table, JSON (``--json``) and a PNG (``--png``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from hicache.bench.engine.throttle import ThrottledBackend
from hicache.cache import HiRadixCache
from hicache.config.cache import CacheConfig
from hicache.engine import Engine, EngineOptions, ModelSpec, Request, TinyLlama
from hicache.policies.prefetch import StoragePlan, create_prefetch_policy
from hicache.policies.prefetch_cost import CostSettings, PrefixParts
from hicache.policies.rates import format_rates
from storage_backends import StorageConfig
from storage_backends.memory import MemoryBackend

logger = logging.getLogger(__name__)

POLICIES = ("best_effort", "timeout", "wait_complete", "cost")
RECOMPUTE = "recompute"
FACTORS = (1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 16, 64)  # of the break-even bandwidth
TARGET = 1.1  # cost's TTFT <= TARGET x min(always load, always recompute)
DECISION_ROUNDS = 2000  # per timing of the decision and of match_prefix (best of 5)


class Cell(NamedTuple):
    """One policy at one bandwidth: TTFTs (ms) of the counted requests and
    the storage tokens each reused."""

    policy: str
    mb_per_s: float
    ttft_ms: tuple[float, ...]
    storage_tokens: tuple[int, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.ttft_ms)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The sweep's own flags (``bench engine`` adds the model's and ``--repeat``)."""
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="TTFT of a storage hit vs the store's bandwidth, per prefetch policy",
    )
    parser.add_argument(
        "--bandwidths",
        type=_bandwidths,
        help="with --sweep: store bandwidths in MB/s, comma-separated "
        "(default: the break-even bandwidth times 1/8, 1/4, 1/2, 1, 2, 4, 16, 64)",
    )
    parser.add_argument(
        "--warmup", type=int, default=3, help="with --sweep: uncounted requests per policy"
    )
    parser.add_argument(
        "--png", type=Path, help="with --sweep: write the plot here (default: no plot)"
    )


def _bandwidths(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of MB/s: {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError("bandwidths must be > 0 MB/s")
    return values


def sweep_config(config: CacheConfig, policy: str, min_tokens: int) -> CacheConfig:
    """``config`` with host and storage on (the store is passed in), and ``policy``."""
    device = config.device
    if device.num_tokens < min_tokens:
        device = dataclasses.replace(device, num_tokens=min_tokens, size_gb=0.0)
    storage = StorageConfig(backend="memory", max_bytes=1 << 30, timeout_s=30.0)
    on = policy != RECOMPUTE
    return dataclasses.replace(
        config,
        device=device,
        host=dataclasses.replace(config.host, enabled=True, reserve_gb=0.0),
        storage=storage if on else StorageConfig(backend="none"),
        policy=dataclasses.replace(
            config.policy,
            write_policy="write_through",
            prefetch_policy=policy if on else "best_effort",
            prefetch_threshold=config.device.page_size,
            load_back_threshold=config.device.page_size,
        ),
        metrics=dataclasses.replace(config.metrics, port=0),
    )


class Setup:
    """One policy's engine over its own throttled store (none for ``recompute``)."""

    def __init__(
        self, policy: str, config: CacheConfig, model: TinyLlama, chunk: int, rate: float
    ) -> None:
        self.policy = policy
        self.store: ThrottledBackend | None = None
        if policy != RECOMPUTE:
            self.store = ThrottledBackend(MemoryBackend(config.storage), rate)
        cache = HiRadixCache(config, storage=self.store)
        self.engine = Engine(model, cache, EngineOptions(chunk_size=chunk))
        self.ttft: list[float] = []
        self.storage: list[int] = []

    def request(self, prefix: list[int], suffixes: tuple[list[int], list[int]], tag: str) -> None:
        """Compute ``prefix`` + the first suffix, push it down to storage, then
        time ``prefix`` + the second suffix."""
        cache = self.engine.cache
        self.engine.generate([Request(f"{tag}-fill", tuple(prefix + suffixes[0]), 1)])
        cache.drain()
        cache.evict(10**9)
        cache.evict_host(10**9)
        out = self.engine.generate([Request(tag, tuple(prefix + suffixes[1]), 1)])[0]
        cache.drain()
        self.ttft.append(out.ttft_s * 1e3)
        self.storage.append(out.hits.storage)

    def close(self) -> None:
        self.engine.cache.close()


def calibrate(config: CacheConfig, model: TinyLlama, args: argparse.Namespace) -> float:
    """The break-even bandwidth (bytes/s): the prefix's KV over what a device hit saves."""
    setup = Setup(RECOMPUTE, config, model, args.prefix_tokens + args.suffix_tokens, 1.0)
    rng = random.Random(1)
    full: list[float] = []
    hit: list[float] = []
    try:
        for i in range(args.warmup + args.repeat):
            prefix = _tokens(rng, args.prefix_tokens, args.vocab)
            for case, times in (("full", full), ("hit", hit)):
                req = Request(
                    f"cal{i}{case}", tuple(prefix + _tokens(rng, args.suffix_tokens, args.vocab)), 1
                )
                out = setup.engine.generate([req])[0]
                if i >= args.warmup:
                    times.append(out.ttft_s)
            setup.engine.cache.drain()
    finally:
        setup.close()
    saved = max(statistics.median(full) - statistics.median(hit), 1e-6)
    prefix_bytes = args.prefix_tokens * config.model.kv_shape().bytes_per_token
    logger.info(
        "recompute %.1f ms, device hit %.1f ms",
        statistics.median(full) * 1e3,
        statistics.median(hit) * 1e3,
    )
    return prefix_bytes / saved


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def run_bandwidth(
    config: CacheConfig, model: TinyLlama, args: argparse.Namespace, rate: float
) -> list[Cell]:
    """Every policy at one store bandwidth (bytes/s), taking turns request by request."""
    chunk = args.prefix_tokens + args.suffix_tokens
    need = 4 * (chunk + config.device.page_size)
    setups = [
        Setup(p, sweep_config(config, p, need), model, chunk, rate) for p in (*POLICIES, RECOMPUTE)
    ]
    rng = random.Random(int(rate))
    try:
        for i in range(args.warmup + args.repeat):
            prefix = _tokens(rng, args.prefix_tokens, args.vocab)
            suffixes = (
                _tokens(rng, args.suffix_tokens, args.vocab),
                _tokens(rng, args.suffix_tokens, args.vocab),
            )
            turn = setups[i % len(setups) :] + setups[: i % len(setups)]
            for setup in turn:
                setup.request(prefix, suffixes, f"r{i}")
        for setup in setups:
            if setup.policy == "cost":
                for line in format_rates(setup.engine.cache.rates()):
                    logger.info("cost's rates at %.1f MB/s: %s", rate / 1e6, line)
    finally:
        for setup in setups:
            setup.close()
    n = args.warmup
    return [Cell(s.policy, rate / 1e6, tuple(s.ttft[n:]), tuple(s.storage[n:])) for s in setups]


def decision_cost(
    config: CacheConfig, model: TinyLlama, args: argparse.Namespace
) -> dict[str, float]:
    """CPU µs per request of ``match_prefix`` and of the cost decision (the rate
    snapshots and choices a request's prefetch and admission make), on a warm
    cache holding the prefix on device."""
    cfg = sweep_config(config, "cost", 4 * (args.prefix_tokens + args.suffix_tokens + 64))
    setup = Setup("cost", cfg, model, args.prefix_tokens + args.suffix_tokens, 1e9)
    rng = random.Random(2)
    try:
        prefix = _tokens(rng, args.prefix_tokens, args.vocab)
        setup.request(prefix, (_tokens(rng, 8, args.vocab), _tokens(rng, 8, args.vocab)), "warm")
        cache = setup.engine.cache
        bpt = cfg.model.kv_shape().bytes_per_token
        parts = PrefixParts(0, 0, args.prefix_tokens, cfg.device.page_size, bpt)
        policy, settings = create_prefetch_policy("cost"), CostSettings()
        rounds = DECISION_ROUNDS

        def decide() -> None:
            plan = StoragePlan(policy, parts, cache.rates(), settings)
            plan.pages(args.prefix_tokens // cfg.device.page_size)  # on the I/O worker
            plan.choice(args.prefix_tokens // cfg.device.page_size)  # the deadline
            host = parts._replace(host=args.prefix_tokens, storage=0)
            policy.plan(host, cache.rates(), settings)  # admit's host part

        out = {}
        for name, fn in (
            ("match_prefix", lambda: cache.match_prefix(prefix)),
            ("decision", decide),
        ):
            best = float("inf")
            for _ in range(5):
                start = time.process_time()
                for _ in range(rounds):
                    fn()
                best = min(best, (time.process_time() - start) / rounds * 1e6)
            out[f"{name}_us"] = round(best, 2)
        return out
    finally:
        setup.close()


def verdicts(cells: list[Cell]) -> list[dict[str, object]]:
    """Per bandwidth: medians per policy and each one's ratio to the better of
    always loading (wait_complete) and always recomputing; and how often
    ``cost`` chose what that better one does (loaded at least half of what
    ``wait_complete`` loaded, or recomputed): a figure the machine's load
    does not move, where the medians of two set-ups doing the same work can
    differ by its noise."""
    rows = []
    for mb in sorted({c.mb_per_s for c in cells}):
        at = {c.policy: c for c in cells if c.mb_per_s == mb}
        load, compute = at["wait_complete"].median_ms, at[RECOMPUTE].median_ms
        ratios = {p: round(at[p].median_ms / min(load, compute), 3) for p in (*POLICIES, RECOMPUTE)}
        full = max(at["wait_complete"].storage_tokens, default=0)
        loaded = [2 * t >= full > 0 for t in at["cost"].storage_tokens]
        same = sum(x == (load < compute) for x in loaded) / max(len(loaded), 1)
        rows.append(
            {
                "mb_per_s": round(mb, 3),
                "ttft_ms": {p: round(at[p].median_ms, 2) for p in at},
                "ratio_to_best": ratios,
                "better_fixed": "load" if load < compute else "recompute",
                "storage_tokens_cost": list(at["cost"].storage_tokens),
                "cost_same_choice": round(same, 3),
                "cost_meets_target": ratios["cost"] <= TARGET,
            }
        )
    return rows


def print_table(
    rows: list[dict[str, object]], breakeven_mb: float, costs: dict[str, float]
) -> None:
    names = (*POLICIES, RECOMPUTE)
    print(f"break-even bandwidth {breakeven_mb:.1f} MB/s (prefix KV / time a hit saves)")
    print(
        "TTFT p50 ms (ratio to min(wait_complete, recompute)); target: cost <= "
        f"{TARGET} x that min at every bandwidth"
    )
    head = " ".join(f"{n:>20}" for n in names)
    print(f"{'MB/s':>9} {head}  cost ok  better fixed  cost chose it")
    for row in rows:
        ttft, ratio = row["ttft_ms"], row["ratio_to_best"]
        assert isinstance(ttft, dict) and isinstance(ratio, dict)
        cells = " ".join(f"{ttft[n]:>11.1f} ({ratio[n]:>5.2f})" for n in names)
        ok = "yes" if row["cost_meets_target"] else "NO"
        same = f"{row['cost_same_choice']:.0%}"
        print(f"{row['mb_per_s']:>9.2f} {cells}  {ok:>7}  {row['better_fixed']:>12}  {same:>13}")
    print(
        f"per request, CPU: match_prefix {costs['match_prefix_us']:.1f} us, "
        f"the cost decision {costs['decision_us']:.1f} us"
    )


def run_sweep(args: argparse.Namespace, config: CacheConfig) -> dict[str, object]:
    """The whole sweep; returns the JSON document (and prints the table). One
    torch thread unless ``--threads``: on a shared machine two threads spin
    against other work and a prefill's time varies tenfold."""
    if args.threads is None:
        import torch

        torch.set_num_threads(1)
    cal_cfg = sweep_config(config, RECOMPUTE, 4 * (args.prefix_tokens + args.suffix_tokens + 64))
    model = build_model(cal_cfg, args)
    breakeven = calibrate(cal_cfg, model, args)
    if args.bandwidths:
        rates = [b * 1e6 for b in args.bandwidths]
    else:
        rates = [breakeven * f for f in FACTORS]
    cells: list[Cell] = []
    for rate in _progress(rates):
        cells += run_bandwidth(config, model, args, rate)
    costs = decision_cost(config, model, args)
    rows = verdicts(cells)
    print_table(rows, breakeven / 1e6, costs)
    doc: dict[str, object] = {
        "breakeven_mb_per_s": round(breakeven / 1e6, 3),
        "rows": rows,
        "cells": [c._asdict() for c in cells],
        "per_request_us": costs,
        "cost_meets_target_everywhere": all(r["cost_meets_target"] for r in rows),
    }
    if args.png is not None:
        from hicache.bench.engine.sweep_plot import plot

        plot({(c.policy, c.mb_per_s): c.median_ms for c in cells}, breakeven / 1e6, args.png)
        print(f"plot: {args.png}")
    return doc


def build_model(config: CacheConfig, args: argparse.Namespace) -> TinyLlama:
    """The bench's TinyLlama, on the device the config's cache would use."""
    probe = HiRadixCache(config)
    device = probe.device_pool.device
    probe.close()
    return TinyLlama(ModelSpec.for_cache(config.model, args.hidden, args.vocab, device), device)


def _progress(rates: list[float]) -> Iterable[float]:
    try:
        from tqdm import tqdm
    except ImportError:  # an extra (hicache[bench]); the table still prints
        return rates
    return tqdm(rates, desc="bandwidths", unit="bw")
