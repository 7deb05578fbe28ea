"""Time to first token with a 2k-token prefix recomputed, or reused from device, host or storage.

One engine (a 4-layer TinyLlama shaped by the config's ``[model]`` section,
float32 compute on CPU) serves, per round, four requests that share a fresh
random prefix and differ in a short suffix:

* ``recompute``: the prefix is new, every token is computed;
* ``device``: the prefix is still on device;
* ``host``: the cache was drained and everything on device evicted, so the
  prefix is loaded back from host memory;
* ``storage``: device and host were emptied too, so the prefix is prefetched
  from LMDB (in a temporary directory unless ``--dir``), then loaded back.

Each case is timed from submit to the first generated token, repeated
``--repeat`` times after one warm-up round; medians are reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import tempfile
from pathlib import Path
from typing import NamedTuple

from hicache.cache import HiRadixCache
from hicache.config import CacheConfig
from hicache.engine import Engine, EngineOptions, ModelSpec, Request, TierHits, TinyLlama
from storage_backends import StorageConfig

CASES = ("recompute", "device", "host", "storage")


class Sample(NamedTuple):
    case: str
    ttft_ms: float
    hits: TierHits


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefix-tokens", type=int, default=2048)
    parser.add_argument("--suffix-tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=768, help="model width")
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds; medians count")
    parser.add_argument("--dir", type=Path, help="scratch directory for LMDB (default: temp)")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")


def bench_config(config: CacheConfig, store: Path, min_tokens: int) -> CacheConfig:
    """``config`` with host and LMDB tiers on, a store under ``store``, and
    prefetches that complete before the request runs."""
    device = config.device
    if device.num_tokens < min_tokens:
        device = dataclasses.replace(device, num_tokens=min_tokens, size_gb=0.0)
    return dataclasses.replace(
        config,
        device=device,
        host=dataclasses.replace(config.host, enabled=True, reserve_gb=0.0),
        storage=StorageConfig(backend="lmdb", path=str(store), max_bytes=1 << 30, sync=False),
        policy=dataclasses.replace(
            config.policy,
            write_policy="write_through",
            prefetch_policy="wait_complete",
            prefetch_threshold=config.device.page_size,
            load_back_threshold=config.device.page_size,
        ),
    )


def build_engine(config: CacheConfig, args: argparse.Namespace) -> Engine:
    cache = HiRadixCache(config)
    device = cache.device_pool.device
    spec = ModelSpec.for_cache(config.model, args.hidden, args.vocab, device)
    chunk = args.prefix_tokens + args.suffix_tokens
    return Engine(TinyLlama(spec, device), cache, EngineOptions(chunk_size=chunk))


def one_round(engine: Engine, args: argparse.Namespace, rng: random.Random) -> list[Sample]:
    """The four cases over one fresh prefix, in order."""
    prefix = [rng.randrange(args.vocab) for _ in range(args.prefix_tokens)]
    cache = engine.cache
    samples = []
    for case in CASES:
        if case in ("host", "storage"):
            cache.drain()
            cache.evict(10**9)
        if case == "storage":
            cache.evict_host(10**9)
        suffix = [rng.randrange(args.vocab) for _ in range(args.suffix_tokens)]
        out = engine.generate([Request(case, tuple(prefix + suffix), 1)])[0]
        samples.append(Sample(case, out.ttft_s * 1e3, out.hits))
    cache.drain()
    return samples


def report(rounds: list[list[Sample]]) -> dict[str, dict[str, float] | float]:
    """Print the table of medians; return the JSON document."""
    ttft = {
        c: statistics.median(s.ttft_ms for r in rounds for s in r if s.case == c) for c in CASES
    }
    last = {s.case: s.hits for s in rounds[-1]}
    print(f"{'case':<10} {'ttft_ms':>9} {'speedup':>8}   reused device/host/storage")
    for case in CASES:
        h = last[case]
        speedup = ttft["recompute"] / ttft[case]
        print(f"{case:<10} {ttft[case]:>9.1f} {speedup:>7.1f}x   {h.device}/{h.host}/{h.storage}")
    return {
        "ttft_ms": {c: round(v, 3) for c, v in ttft.items()},
        "speedup_host": round(ttft["recompute"] / ttft["host"], 3),
        "speedup_storage": round(ttft["recompute"] / ttft["storage"], 3),
    }


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="hicache-bench-", dir=args.dir) as scratch:
        need = 4 * (args.prefix_tokens + args.suffix_tokens + args.config.device.page_size)
        config = bench_config(args.config, Path(scratch) / "store", need)
        engine = build_engine(config, args)
        try:
            print(f"model {engine.model.spec}, device {engine.model.device}")
            rng = random.Random(0)
            one_round(engine, args, rng)  # warm-up
            rounds = [one_round(engine, args, rng) for _ in range(args.repeat)]
        finally:
            engine.cache.close()
    doc = report(rounds)
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0
