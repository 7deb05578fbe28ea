"""Radix-tree speed: replay a multi-turn trace through match/lock/insert/unlock/evict."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from hicache.bench.workloads import MultiTurnSpec, TraceRequest, multiturn
from hicache.cache import HiRadixCache
from hicache.cli_common import at_least
from hicache.config import CacheConfig, HostConfig, ModelConfig
from hicache.radix_tree import Key, Tokens, extend_key
from storage_backends import StorageConfig


@dataclass(frozen=True)
class TreeBenchResult:
    page_size: int
    ops: int
    seconds: float
    us_per_op: float
    hit_tokens: int
    total_tokens: int
    requests: int

    @property
    def hit_tokens_per_s(self) -> float:
        return self.hit_tokens / self.seconds if self.seconds else 0.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--page-size",
        type=at_least(1),
        default=None,
        help="tokens per page (default: device.page_size of --config)",
    )
    parser.add_argument(
        "--conversations", type=at_least(1), default=200, help="conversations in the trace"
    )
    parser.add_argument("--turns", type=at_least(1), default=8, help="turns per conversation")
    parser.add_argument(
        "--json", type=Path, default=None, help="write the result here (default: print only)"
    )
    parser.add_argument(
        "--convert-whole",
        action="store_true",
        help="convert every request's whole token list (default: only the tokens added "
        "since the conversation's previous turn, as an engine keeps a request's ids)",
    )


def bench_config(config: CacheConfig, page_size: int | None) -> CacheConfig:
    """Device tier only, with a 1-layer model: the tree is measured, not KV memory."""
    ps = page_size or config.device.page_size
    tokens = max(config.device.num_tokens // ps * ps, ps)
    return replace(
        config,
        model=ModelConfig(num_layers=1, kv_heads=1, head_dim=1, dtype="float16"),
        device=replace(config.device, page_size=ps, num_tokens=tokens, device="cpu"),
        host=HostConfig(enabled=False),
        storage=StorageConfig(),
    )


def added_since_last_turn(trace: list[TraceRequest]) -> list[int]:
    """Per request, how many leading tokens its conversation's previous turn
    already had (0 for a first turn, or when that turn is not a prefix)."""
    last: dict[int, list[int]] = {}
    out = []
    for req in trace:
        prev = last.get(req.conversation)
        known = len(prev) if prev is not None and req.tokens[: len(prev)] == prev else 0
        out.append(known)
        last[req.conversation] = req.tokens
    return out


def replay(
    cache: HiRadixCache, trace: list[TraceRequest], incremental: bool = True
) -> TreeBenchResult:
    """Drive the cache as an engine would; KV contents are not touched.

    With ``incremental``, a conversation's token ids are converted once, as an
    engine keeps a request's ids: each turn converts only the tokens added
    since the previous turn and extends that turn's checked key (``extend_key``
    checks only the new ids). Without, every request's whole list is converted."""
    from tqdm import tqdm  # an extra (hicache[bench]); the CLI checks for it first

    known = added_since_last_turn(trace) if incremental else [0] * len(trace)
    keys: dict[int, Key] = {}
    ops = hit = total = 0
    start = time.perf_counter()
    for req, old in tqdm(zip(trace, known, strict=True), desc="tree", unit="req", leave=False):
        tokens: Tokens | Key = req.tokens
        if old:
            tokens = extend_key(keys[req.conversation], req.tokens[old:])
        m = cache.match_prefix(tokens)
        assert m.key is not None  # the checked, converted key: no second conversion
        keys[req.conversation] = m.key
        cache.inc_lock_ref(m.last_device_node)
        new = cache.alloc_device(len(m.key) - m.device_hit_length)
        if new is None:
            cache.dec_lock_ref(m.last_device_node)
            ops += 3
            continue
        need = len(m.key) - m.device_hit_length
        slots = torch.cat([m.device_indices, new if len(new) == need else new[:need]])
        cache.cache_finished_req(m.key, slots, m.last_device_node)
        ops += 4
        hit += m.device_hit_length
        total += len(m.key)
    seconds = time.perf_counter() - start
    ps = cache.page_size
    return TreeBenchResult(ps, ops, seconds, seconds * 1e6 / max(ops, 1), hit, total, len(trace))


def run(args: argparse.Namespace) -> int:
    config = bench_config(args.config, args.page_size)
    spec = MultiTurnSpec(conversations=args.conversations, turns=args.turns)
    trace = list(multiturn(spec))
    cache = HiRadixCache(config)
    result = replay(cache, trace, incremental=not args.convert_whole)
    cache.check_integrity()
    print(
        f"page_size={result.page_size} requests={result.requests} ops={result.ops} "
        f"seconds={result.seconds:.3f}\n"
        f"us/op={result.us_per_op:.2f}  us/request={result.seconds * 1e6 / result.requests:.1f}  "
        f"hit tokens={result.hit_tokens} ({result.hit_tokens / max(result.total_tokens, 1):.1%})"
        f"  matched tokens/s={result.hit_tokens_per_s:,.0f}"
    )
    if args.json:
        payload = {
            "page_size": result.page_size,
            "ops": result.ops,
            "seconds": result.seconds,
            "us_per_op": result.us_per_op,
            "hit_tokens": result.hit_tokens,
            "total_tokens": result.total_tokens,
            "requests": result.requests,
            "hit_tokens_per_s": result.hit_tokens_per_s,
        }
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    return 0
