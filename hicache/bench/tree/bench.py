"""Radix-tree speed: replay a multi-turn trace through match/lock/insert/unlock/evict.

With ``--against sglang`` the same trace also runs through SGLang's own trees
(``RadixCache``, and ``UnifiedRadixCache`` on its Rust TreeCore), alternating
sides round by round at each page size, same capacity; each side's best and
median CPU µs per request, and hicache's ratio to the faster SGLang tree."""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from device_pool import native
from hicache.bench.common.workloads import MultiTurnSpec, TraceRequest, multiturn
from hicache.cache import HiRadixCache
from hicache.config.cache import CacheConfig, HostConfig, ModelConfig
from hicache.config.flags import at_least
from hicache.tree.radix_tree import Key, Tokens, extend_key
from storage_backends import StorageConfig

if TYPE_CHECKING:
    from hicache.bench.tree.sglang_trees import Peers, PeerTree

Side = Callable[[list[TraceRequest], list[int]], tuple[float, float]]

logger = logging.getLogger(__name__)


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
    parser.add_argument(
        "--against",
        choices=["sglang"],
        default=None,
        help="also replay through SGLang's RadixCache and UnifiedRadixCache (Rust core), "
        "alternating, and report hicache's time as a ratio to the faster one (default: off)",
    )
    parser.add_argument(
        "--page-sizes",
        default=None,
        help="comma-separated page sizes for --against (default: 1,16)",
    )
    parser.add_argument("--repeat", type=int, default=5, help="rounds per side for --against")


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
    cache: HiRadixCache,
    trace: list[TraceRequest],
    incremental: bool = True,
    progress: bool = True,
    clock: Callable[[], float] = time.perf_counter,
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
    start = clock()
    steps = zip(trace, known, strict=True)
    for req, old in tqdm(steps, desc="tree", unit="req", leave=False, disable=not progress):
        tokens: Tokens | Key = req.tokens
        if old:
            tokens = extend_key(keys[req.conversation], req.tokens[old:])
        m = cache.match_prefix(tokens)
        key = m.key
        assert key is not None  # the checked, converted key: no second conversion
        keys[req.conversation] = key
        cache.inc_lock_ref(m.last_device_node)
        have = m.device_hit_length
        need = len(key) - have
        new = cache.alloc_device(need)
        if new is None:
            cache.dec_lock_ref(m.last_device_node)
            ops += 3
            continue
        slots = torch.cat([m.device_indices, new if new.numel() == need else new[:need]])
        cache.cache_finished_req(key, slots, m.last_device_node)
        ops += 4
        hit += have
        total += len(key)
    seconds = clock() - start
    ps = cache.page_size
    return TreeBenchResult(ps, ops, seconds, seconds * 1e6 / max(ops, 1), hit, total, len(trace))


def run(args: argparse.Namespace) -> int:
    if args.against:
        return run_against(args)
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


# --against sglang ------------------------------------------------------------


@dataclass(frozen=True)
class SideFigures:
    """One side at one page size: CPU µs per request of each round, hit rate."""

    side: str
    page_size: int
    us_per_request: tuple[float, ...]
    hit_rate: float

    @property
    def best(self) -> float:
        return min(self.us_per_request)

    @property
    def median(self) -> float:
        return statistics.median(self.us_per_request)


def replay_peer(peer: PeerTree, trace: list[TraceRequest], known: list[int]) -> tuple[float, float]:
    """Replay ``trace`` through an SGLang tree as its scheduler would: CPU
    seconds and device hit rate. Keys are ``array('q')`` extended by each
    turn's new ids, as SGLang's ``Req`` keeps them."""
    keys: dict[int, array] = {}
    hit = total = 0
    start = time.process_time()
    for req, old in zip(trace, known, strict=True):
        new_ids = array("q", req.tokens[old:] if old else req.tokens)
        key = keys[req.conversation] + new_ids if old else new_ids
        keys[req.conversation] = key
        prefix_len, node = peer.match(key)
        lock = peer.lock(node)
        need = len(key) - prefix_len
        slots = peer.alloc(need)
        if slots is None:
            peer.unlock(node, lock)
            continue
        peer.finish(key, torch.cat([peer.prefix(node, prefix_len), slots[:need]]), prefix_len)
        peer.unlock(node, lock)
        hit += prefix_len
        total += len(key)
    return time.process_time() - start, hit / max(total, 1)


def _hicache_side(config: CacheConfig, trace: list[TraceRequest]) -> tuple[float, float]:
    with HiRadixCache(config) as cache:
        r = replay(cache, trace, progress=False, clock=time.process_time)
        cache.check_integrity()
    return r.seconds, r.hit_tokens / max(r.total_tokens, 1)


def _sides(config: CacheConfig, peers: Peers | None) -> dict[str, Side]:
    ps, capacity = config.device.page_size, config.device.num_tokens
    out: dict[str, Side] = {"hicache": lambda trace, known: _hicache_side(config, trace)}
    for name, build in (peers.factories if peers else {}).items():
        out[name] = _peer_side(build, ps, capacity)
    return out


def _peer_side(build: Callable[[int, int], PeerTree], ps: int, capacity: int) -> Side:
    def side(trace: list[TraceRequest], known: list[int]) -> tuple[float, float]:
        return replay_peer(build(ps, capacity), trace, known)

    return side


def compare(
    config: CacheConfig, trace: list[TraceRequest], peers: Peers | None, repeat: int
) -> list[SideFigures]:
    """Every side ``repeat`` times, alternating, on fresh trees of the same capacity."""
    from tqdm import tqdm

    known = added_since_last_turn(trace)
    sides = _sides(config, peers)
    times: dict[str, list[float]] = {name: [] for name in sides}
    hits: dict[str, float] = {}
    for _ in tqdm(range(repeat), desc=f"page {config.device.page_size}", leave=False):
        for name, side in sides.items():
            seconds, hits[name] = side(trace, known)
            times[name].append(seconds * 1e6 / len(trace))
    ps = config.device.page_size
    return [SideFigures(n, ps, tuple(times[n]), hits[n]) for n in sides]


def run_against(args: argparse.Namespace) -> int:
    from hicache.bench.tree import sglang_trees

    sizes = [int(p) for p in (args.page_sizes or "1,16").split(",")]
    trace = list(multiturn(MultiTurnSpec(conversations=args.conversations, turns=args.turns)))
    peers: Peers | None = None
    try:
        peers = sglang_trees.load()
    except sglang_trees.SglangUnavailable as e:
        logger.warning("%s; skipping the SGLang side", e)
    for name, why in (peers.missing if peers else {}).items():
        logger.warning("%s skipped: %s", name, why)
    print(f"hicache hot path: {native.describe()}; {len(trace)} requests, repeat {args.repeat}")
    figures: list[SideFigures] = []
    for ps in sizes:
        found = compare(bench_config(args.config, ps), trace, peers, args.repeat)
        print(_table(found))
        figures += found
    if args.json:
        args.json.write_text(json.dumps(_payload(figures), indent=2))
        print(f"wrote {args.json}")
    return 0


def _table(found: list[SideFigures]) -> str:
    peers = [f for f in found if f.side != "hicache"]
    ours = next(f for f in found if f.side == "hicache")
    best = min(peers, key=lambda f: f.best) if peers else None
    lines = [f"page_size={ours.page_size}  (CPU µs per request: best / median)"]
    for f in found:
        ratio = ""
        if f is ours and best is not None:
            ratio = f"  ratio to {best.side}: {f.best / best.best:.2f}"
            ratio += f" (median {f.median / best.median:.2f})"
        lines.append(
            f"  {f.side:<20} {f.best:8.1f} / {f.median:8.1f}  hit rate {f.hit_rate:.4f}{ratio}"
        )
    spread = max(f.hit_rate for f in found) - min(f.hit_rate for f in found)
    if spread > 0.005:
        lines.append(
            f"  WARNING: hit rates differ by {spread:.4f} (> 0.005); "
            "docs/architecture.md (Compiled hot path, Hit rates) says why they can"
        )
    return "\n".join(lines)


def _payload(figures: list[SideFigures]) -> dict[str, object]:
    return {
        "hot_path": native.describe(),
        "sides": [
            {
                "side": f.side,
                "page_size": f.page_size,
                "us_per_request": list(f.us_per_request),
                "best_us": f.best,
                "median_us": f.median,
                "hit_rate": f.hit_rate,
            }
            for f in figures
        ],
    }
