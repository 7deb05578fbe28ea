"""TTFT with a 2k-token prefix recomputed or reused from each tier, and each tier's own cost.

One engine (a 4-layer TinyLlama shaped by the config's ``[model]`` section,
MHA or, with ``--attention mla``, DeepSeek-style latent attention; float32
compute on CPU) serves, per round, requests that share a fresh random prefix
and differ in a short suffix:

* ``recompute``: the prefix is new, every token is computed;
* ``device``: the prefix is still on device, so only the suffix is computed
  (this TTFT is the round's *suffix-only compute*);
* ``host``: everything on device was evicted, the prefix is loaded back;
* ``storage``: device and host were emptied too, the prefix is prefetched
  from LMDB (in a temporary directory unless ``--dir``), then loaded back;
* ``storage_cold``: as ``storage``, after a restart (a new cache over the same
  store) with the store's files dropped from the OS page cache.

With ``--sweep``, the storage case instead over a store throttled from far
slower than prefill to far faster, per prefetch policy
(``hicache.bench.engine.sweep``).

A tier's cost is its TTFT minus the round's suffix-only compute. Besides,
each round times the tier operations alone through the cache API: a
load-back (match, admit, per-layer loads until on device) and a prefetch
(lookup and read into host memory until inserted), warm and cold, reported
per 1k prefix tokens. The cold cases say whether the page-cache drop took
effect (``posix_fadvise`` + ``mincore``; see ``hicache.bench.common.page_cache``).
Figures are p50 and p90 over ``--repeat`` rounds (at least 5 for a report
worth quoting) after one warm-up round.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from hicache.bench.common.page_cache import DropResult, drop_page_cache
from hicache.bench.engine import sweep as engine_sweep
from hicache.cache import HiRadixCache
from hicache.config.cache import CacheConfig
from hicache.config.flags import at_least
from hicache.engine import Engine, EngineOptions, ModelSpec, Request, TierHits, TinyLlama
from storage_backends import StorageConfig

logger = logging.getLogger(__name__)

CASES = ("recompute", "device", "host", "storage", "storage_cold")
TIERS = ("host", "storage", "storage_cold")  # cases with a tier cost
PROBES = ("load_back", "prefetch", "prefetch_cold")
PROBE_TIMEOUT_S = 120.0


class Sample(NamedTuple):
    case: str
    ttft_ms: float
    hits: TierHits


class Probe(NamedTuple):
    """One tier operation timed alone: ``ms`` for ``tokens`` tokens."""

    kind: str
    ms: float
    tokens: int

    @property
    def ms_per_1k(self) -> float:
        return self.ms * 1000.0 / max(self.tokens, 1)


class Round(NamedTuple):
    samples: list[Sample]
    probes: list[Probe]
    drops: list[DropResult]  # one per cold restart


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prefix-tokens", type=at_least(1), default=2048, help="the shared prefix (tokens)"
    )
    parser.add_argument(
        "--suffix-tokens", type=at_least(1), default=32, help="each request's own tail (tokens)"
    )
    parser.add_argument("--hidden", type=at_least(1), default=768, help="model width")
    parser.add_argument("--vocab", type=at_least(1), default=4096, help="vocabulary size")
    parser.add_argument(
        "--attention", choices=("mha", "mla"), default="mha", help="attention (KV layout)"
    )
    parser.add_argument("--kv-lora-rank", type=at_least(1), default=128, help="MLA latent width")
    parser.add_argument("--rope-dim", type=at_least(1), default=32, help="MLA rotary key width")
    parser.add_argument(
        "--repeat", type=at_least(1), default=5, help="timed rounds (p50/p90 over them)"
    )
    parser.add_argument(
        "--threads",
        type=at_least(1),
        help="torch CPU threads (default: torch's); 1 is steadier on a busy machine",
    )
    parser.add_argument("--dir", type=Path, help="scratch directory for LMDB (default: temp)")
    parser.add_argument(
        "--json", type=Path, help="write the results as JSON here (default: print only)"
    )
    engine_sweep.add_arguments(parser)


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


def with_attention(config: CacheConfig, args: argparse.Namespace) -> CacheConfig:
    """``config`` whose model uses ``args.attention`` (MLA: the latent geometry of ``args``)."""
    if args.attention == "mha":
        return config
    model = dataclasses.replace(
        config.model, attention="mla", kv_lora_rank=args.kv_lora_rank, rope_dim=args.rope_dim
    )
    return dataclasses.replace(config, model=model)


def build_engine(
    config: CacheConfig, args: argparse.Namespace, model: TinyLlama | None = None
) -> Engine:
    cache = HiRadixCache(config)
    device = cache.device_pool.device
    if model is None:
        spec = ModelSpec.for_cache(config.model, args.hidden, args.vocab, device)
        model = TinyLlama(spec, device)
    chunk = args.prefix_tokens + args.suffix_tokens
    return Engine(model, cache, EngineOptions(chunk_size=chunk))


def push_down(cache: HiRadixCache, tier: str) -> None:
    """Leave every cached page on ``tier`` ("host" or "storage") and below only."""
    cache.drain()
    cache.evict(10**9)
    if tier == "storage":
        cache.evict_host(10**9)


def ask(
    engine: Engine, case: str, prefix: list[int], rng: random.Random, vocab: int, n: int
) -> Sample:
    suffix = [rng.randrange(vocab) for _ in range(n)]
    out = engine.generate([Request(case, tuple(prefix + suffix), 1)])[0]
    return Sample(case, out.ttft_s * 1e3, out.hits)


def one_round(engine: Engine, args: argparse.Namespace, rng: random.Random) -> list[Sample]:
    """The warm cases (recompute, device, host, storage) over one fresh prefix, in order."""
    prefix = [rng.randrange(args.vocab) for _ in range(args.prefix_tokens)]
    samples = []
    for case in CASES[:4]:
        # Quiet first: the previous request's backups and storage writes would
        # otherwise run during this one (and inflate the suffix-only compute).
        engine.cache.drain()
        if case in ("host", "storage"):
            push_down(engine.cache, case)
        samples.append(ask(engine, case, prefix, rng, args.vocab, args.suffix_tokens))
    engine.cache.drain()
    return samples


def time_load_back(cache: HiRadixCache, prefix: list[int]) -> Probe:
    """Load ``prefix`` back from host alone: match, admit, every layer on device."""
    push_down(cache, "host")
    start = time.perf_counter()
    admitted = cache.admit(cache.match_prefix(prefix, None))
    cache.start_loading()
    for layer in range(cache.device_pool.shape.num_layers):
        cache.wait_layer(layer)
    if cache.device_pool.device.type == "cuda":
        torch.cuda.synchronize(cache.device_pool.device)
    ms = (time.perf_counter() - start) * 1e3
    cache.dec_lock_ref(admitted.last_node)
    cache.drain()
    return Probe("load_back", ms, admitted.loaded_tokens)


def time_prefetch(cache: HiRadixCache, prefix: list[int], kind: str) -> Probe:
    """Prefetch ``prefix`` from storage into host memory alone, until inserted."""
    push_down(cache, "storage")
    start = time.perf_counter()
    match = cache.match_prefix(prefix, None, with_storage=True)
    if cache.prefetch(kind, prefix, None, match.last_host_node) == 0:
        logger.warning("%s: storage holds none of the prefix", kind)
        return Probe(kind, (time.perf_counter() - start) * 1e3, 0)
    deadline = start + PROBE_TIMEOUT_S
    while not (status := cache.check_prefetch(kind)).done:
        if time.perf_counter() > deadline:
            cache.release_prefetch(kind)
            raise TimeoutError(f"{kind} did not finish within {PROBE_TIMEOUT_S} s")
        cache.poll()
        time.sleep(50e-6)
    ms = (time.perf_counter() - start) * 1e3
    cache.release_prefetch(kind)
    cache.drain()
    return Probe(kind, ms, status.fetched_tokens)


class Runner:
    """Owns the engine across cold restarts (a new cache over the same store; the model is kept)."""

    def __init__(self, config: CacheConfig, args: argparse.Namespace) -> None:
        self.config, self.args = config, args
        self.engine = build_engine(config, args)

    def restart_cold(self) -> DropResult:
        self.engine.cache.close()  # waits for the store's writes, unmaps it
        drop = drop_page_cache(Path(self.config.storage.path))
        self.engine = build_engine(self.config, self.args, self.engine.model)
        return drop

    def round(self, rng: random.Random) -> Round:
        args = self.args
        samples = one_round(self.engine, args, rng)
        prefix = [rng.randrange(args.vocab) for _ in range(args.prefix_tokens)]
        ask(self.engine, "recompute", prefix, rng, args.vocab, args.suffix_tokens)
        probes = [time_load_back(self.engine.cache, prefix)]
        probes.append(time_prefetch(self.engine.cache, prefix, "prefetch"))
        drops = [self.restart_cold()]
        probes.append(time_prefetch(self.engine.cache, prefix, "prefetch_cold"))
        drops.append(self.restart_cold())  # closing drained every write
        # Its tier cost subtracts the warm cases' device TTFT: same lengths, same compute.
        cold = ask(self.engine, "storage_cold", prefix, rng, args.vocab, args.suffix_tokens)
        self.engine.cache.drain()
        return Round([*samples, cold], probes, drops)

    def close(self) -> None:
        self.engine.cache.close()


def _pct(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(float(np.percentile(values, 50)), 3),
        "p90": round(float(np.percentile(values, 90)), 3),
    }


def summarize(rounds: list[Round]) -> dict[str, object]:
    """The JSON document: p50/p90 per case, tier cost, probes and the cold drops."""
    ttft = {c: [s.ttft_ms for r in rounds for s in r.samples if s.case == c] for c in CASES}
    suffix = ttft["device"]
    cost = {t: [a - b for a, b in zip(ttft[t], suffix, strict=True)] for t in TIERS}
    probes = {k: [p.ms_per_1k for r in rounds for p in r.probes if p.kind == k] for k in PROBES}
    drops = [d for r in rounds for d in r.drops]
    last = {s.case: s.hits for s in rounds[-1].samples}
    median = {c: float(np.median(v)) for c, v in ttft.items()}
    return {
        "rounds": len(rounds),
        "ttft_ms": {c: _pct(v) for c, v in ttft.items()},
        "suffix_compute_ms": _pct(suffix),
        "tier_cost_ms": {t: _pct(v) for t, v in cost.items()},
        "tier_cost_ms_per_1k_tokens": {
            t: _pct([x * 1000.0 / _prefix_len(rounds) for x in v]) for t, v in cost.items()
        },
        "probe_ms_per_1k_tokens": {k: _pct(v) for k, v in probes.items()},
        "cold_store": {
            "page_cache_dropped": all(d.took_effect for d in drops),
            "drops_that_took_effect": sum(d.took_effect for d in drops),
            "drops": len(drops),
            "store_bytes": drops[-1].nbytes,
            "resident_before_bytes": drops[-1].resident_before,
            "resident_after_bytes": drops[-1].resident_after,
        },
        "hits_last_round": {c: list(h) for c, h in last.items()},
        "speedup_host": round(median["recompute"] / median["host"], 3),
        "speedup_storage": round(median["recompute"] / median["storage"], 3),
    }


def _prefix_len(rounds: list[Round]) -> int:
    return max(s.hits.total for r in rounds for s in r.samples if s.case == "device") or 1


DASH = "—"  # a figure that does not apply


def _ms(v: float | None, width: int) -> str:
    return f"{DASH:>{width}}" if v is None else f"{v:>{width}.2f}"


def print_report(doc: dict[str, object], out: Callable[[str], None] = print) -> None:
    """The tables a person reads: TTFT and tier cost per case, the tier
    operations alone, the cold-store drops; units in every header."""
    ttft, cost = doc["ttft_ms"], doc["tier_cost_ms"]
    assert isinstance(ttft, dict) and isinstance(cost, dict)
    out(f"{doc['rounds']} rounds; a tier's cost = its TTFT - the device-hit TTFT (suffix only)")
    out(f"{'case':<13} {'TTFT p50 ms':>12} {'p90 ms':>8} {'tier cost p50 ms':>17} {'p90 ms':>8}")
    for case in CASES:
        t, c = ttft[case], cost.get(case)
        p50, p90 = (c["p50"], c["p90"]) if c else (None, None)
        out(f"{case:<13} {t['p50']:>12.2f} {t['p90']:>8.2f} {_ms(p50, 17)} {_ms(p90, 8)}")
    for line in noise_notes(ttft):
        out(line)
    probes = doc["probe_ms_per_1k_tokens"]
    assert isinstance(probes, dict)
    out(f"{'alone':<13} {'p50 ms/1k tok':>13} {'p90 ms/1k tok':>14}")
    for kind, v in probes.items():
        out(f"{kind:<13} {v['p50']:>13.3f} {v['p90']:>14.3f}")
    cold = doc["cold_store"]
    assert isinstance(cold, dict)
    mib = {k: cold[k] / 2**20 for k in ("resident_before_bytes", "resident_after_bytes",
                                        "store_bytes")}  # fmt: skip
    out(
        f"cold store: page cache dropped in {cold['drops_that_took_effect']}/{cold['drops']} "
        f"restarts (resident {mib['resident_before_bytes']:.1f} MiB -> "
        f"{mib['resident_after_bytes']:.1f} MiB of {mib['store_bytes']:.1f} MiB)"
    )


def noise_notes(ttft: dict[str, dict[str, float]]) -> list[str]:
    """A line for each tier whose TTFT p50 came out below the device-hit p50:
    reusing a lower tier cannot be faster than a device hit, so the gap is
    noise; the spread (p90 - p50) of both says how much noise there is."""
    dev = ttft["device"]
    notes = []
    for case in TIERS:
        t = ttft[case]
        if t["p50"] < dev["p50"]:
            notes.append(
                f"note: {case} p50 is {dev['p50'] - t['p50']:.2f} ms below the device p50: "
                f"noise (spread p90-p50: device {dev['p90'] - dev['p50']:.2f} ms, "
                f"{case} {t['p90'] - t['p50']:.2f} ms); the tier costs about nothing here"
            )
    return notes


def run(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        raise ValueError("--repeat must be >= 1")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    if args.repeat < 5:
        logger.warning(
            "p90 over %d rounds is not worth quoting; use --repeat 5 or more", args.repeat
        )
    if args.sweep:
        doc = engine_sweep.run_sweep(args, with_attention(args.config, args))
        if args.json is not None:
            args.json.write_text(json.dumps(doc, indent=2) + "\n")
        return 0
    with tempfile.TemporaryDirectory(prefix="hicache-bench-", dir=args.dir) as scratch:
        need = 4 * (args.prefix_tokens + args.suffix_tokens + args.config.device.page_size)
        config = with_attention(bench_config(args.config, Path(scratch) / "store", need), args)
        runner = Runner(config, args)
        try:
            model = runner.engine.model
            print(f"model: TinyLlama, {model.spec.describe()}, on {model.device}")
            rng = random.Random(0)
            runner.round(rng)  # warm-up
            rounds = [runner.round(rng) for _ in range(args.repeat)]
        finally:
            runner.close()
    doc = summarize(rounds)
    print_report(doc)
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0
