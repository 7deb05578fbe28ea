"""Run a short multi-turn chat through the engine and show where each turn's KV came from.

``python -m hicache.engine [--config default|PATH] [--set section.key=value ...]``

The store (disk, lmdb, file) goes to ``storage.path``, or when that is empty to
``$XDG_CACHE_HOME/hicache/store/<fingerprint>`` (else ``~/.cache/hicache/...``);
a second run says when it reuses what an earlier one stored.

Between turns the cache is pushed down a tier in turn (``--evict cycle``):
turn 2 finds the history on device, turn 3 in host memory, turn 4 in storage.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
import sys
from collections.abc import Sequence

import torch

from hicache import format_rates
from hicache.cache import HiRadixCache
from hicache.config.cache import CacheConfig
from hicache.config.flags import add_config_flags, load_config, port_in_use
from hicache.engine.model import ModelSpec, TinyLlama
from hicache.engine.request import Request, RequestOutput
from hicache.engine.scheduler import Engine, EngineOptions
from storage_backends import StorageError
from storage_backends.store_kind import LOCAL_KINDS, detect

EVICTIONS = ("none", "host", "storage", "cycle")
PUSHED = {
    "none": "kept on device",
    "host": "pushed to host memory",
    "storage": "pushed to storage",
    "cycle": "kept on device, then pushed to host, then to storage, in turn",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hicache.engine", description=__doc__)
    add_config_flags(p)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--turn-tokens", type=int, default=256, help="new user tokens per turn")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--evict", choices=EVICTIONS, default="cycle", help="push KV down between turns")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def make_engine(config: CacheConfig, args: argparse.Namespace) -> Engine:
    cache = HiRadixCache(config)
    device = cache.device_pool.device
    spec = ModelSpec.for_cache(config.model, args.hidden, args.vocab, device, args.seed)
    options = EngineOptions(chunk_size=args.chunk_size)
    return Engine(TinyLlama(spec, device), cache, options)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def describe_tiers(cache: HiRadixCache) -> list[str]:
    """What each tier holds and where the store is (and whether an earlier run filled it)."""
    dev = cache.device_pool
    lines = [f"  device  {dev.size:>9,} tokens  {_mib(dev.nbytes):>12}  on {dev.device}"]
    host = cache.host_pool
    if host is not None:
        layout = cache.config.host.layout
        lines.append(f"  host    {host.size:>9,} tokens  {_mib(host.nbytes):>12}  {layout}")
    storage = cache.config.storage
    if cache.storage is None:
        lines.append("  storage off")
    elif storage.backend in LOCAL_KINDS:
        where = dataclasses.replace(storage, fingerprint=cache.fingerprint.hex()).store_dir()
        kind = detect(where) or storage.backend  # a store of another kind is opened as it is
        pages = cache.storage.backend.stats().entries
        reused = f"reusing the store at {where}: {pages:,} pages from an earlier run"
        lines.append(f"  storage {kind}, {reused if pages else f'new store at {where}'}")
    else:
        lines.append(f"  storage {storage.backend} {storage.endpoint}".rstrip())
    return lines


def describe(engine: Engine, config: CacheConfig, args: argparse.Namespace) -> None:
    spec = engine.model.spec
    print(f"model {config.model.model_id}: TinyLlama, {spec.describe()}")
    print(f"  on {engine.model.device}, torch {torch.__version__}")
    print("tiers:")
    for line in describe_tiers(engine.cache):
        print(line)
    print(f"{args.turns} turns of {args.turn_tokens} new tokens; between turns the history "
          f"is {PUSHED[args.evict]} (--evict {args.evict})")  # fmt: skip
    print("prompt tokens by where their KV came from (computed: cached nowhere)")


def push_down(cache: HiRadixCache, turn: int, mode: str) -> None:
    """After ``turn`` (0-based), move the cached KV down the tiers per ``mode``."""
    target = {"none": "device", "host": "host", "storage": "storage"}.get(mode)
    if target is None:  # cycle: keep, then host, then storage, then again
        target = ("device", "host", "storage")[turn % 3]
    cache.drain()
    if target != "device":
        cache.evict(10**9)
    if target == "storage":
        cache.evict_host(10**9)


def chat(engine: Engine, args: argparse.Namespace) -> list[RequestOutput]:
    rng = random.Random(args.seed)
    history: list[int] = []
    outputs: list[RequestOutput] = []
    for turn in range(args.turns):
        history += [rng.randrange(args.vocab) for _ in range(args.turn_tokens)]
        request = Request(f"turn{turn + 1}", tuple(history), args.max_new_tokens)
        outputs += engine.generate([request])
        history += outputs[-1].output_tokens
        report(turn + 1, len(request.prompt), outputs[-1])
        push_down(engine.cache, turn, args.evict)
    return outputs


def report(turn: int, prompt_len: int, out: RequestOutput) -> None:
    if turn == 1:
        print(
            f"{'turn':>4} {'prompt':>7} {'device':>7} {'host':>7} {'storage':>8} "
            f"{'computed':>9} {'TTFT ms':>9}"
        )
    h, ms = out.hits, out.ttft_s * 1e3
    computed = prompt_len - h.total
    print(
        f"{turn:>4} {prompt_len:>7} {h.device:>7} {h.host:>7} {h.storage:>8} "
        f"{computed:>9} {ms:>9.1f}"
    )


def _start(config: CacheConfig, args: argparse.Namespace) -> Engine:
    """``make_engine``, with a taken metrics port named as such."""
    try:
        return make_engine(config, args)
    except OSError as e:
        message = port_in_use(e, config)
        if message is None:
            raise
        raise ValueError(message) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
    try:
        config = load_config(args)
        engine = _start(config, args)
    except (ValueError, OSError, StorageError) as e:
        print(f"hicache.engine: {e}", file=sys.stderr)
        return 2
    describe(engine, config, args)
    try:
        chat(engine, args)
        # On stderr: stdout ends with the table (scripts read its last line).
        print("measured (what prefetch_policy=cost weighs loads with):", file=sys.stderr)
        for line in format_rates(engine.cache.rates()):
            print(f"  {line}", file=sys.stderr)
    finally:
        engine.cache.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
