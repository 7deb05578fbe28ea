"""What tiering buys: replay a workload through no cache, device, +host, +storage."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm import tqdm

from hicache.bench.workloads import (
    FewShotSpec,
    LongDocSpec,
    MultiTurnSpec,
    TraceRequest,
    fewshot,
    longdoc,
    multiturn,
)
from hicache.cache import HiRadixCache
from hicache.config import CacheConfig, HostConfig
from storage_backends import StorageConfig

LINKS = ("d2h", "h2d", "h2s", "s2h")


class TierSetup(NamedTuple):
    name: str
    config: CacheConfig | None  # None: no cache at all


class Served(NamedTuple):
    """Tokens of one request reused from each tier, and its page-aligned length."""

    device: int
    host: int
    storage: int
    total: int


@dataclass(frozen=True)
class TierReport:
    name: str
    hit_rate: float
    hit_rate_by_tier: dict[str, float]
    prefill_tokens_saved: int
    bytes_moved: dict[str, int]
    cache_ms_per_request: float
    peak_bytes: dict[str, int]
    hit_rate_by_round: list[float]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload", choices=("multiturn", "longdoc", "fewshot"), default="multiturn"
    )
    parser.add_argument(
        "--clients", type=int, default=48, help="conversations / documents / prefixes"
    )
    parser.add_argument("--rounds", type=int, default=6, help="turns / questions / queries")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="report folder")
    parser.add_argument("--json", type=Path, default=None, help="default: OUT/tiering.json")
    parser.add_argument("--plot", type=Path, default=None, help="default: OUT/tiering.png")


def build_trace(workload: str, clients: int, rounds: int, seed: int) -> list[TraceRequest]:
    if workload == "multiturn":
        return list(multiturn(MultiTurnSpec(conversations=clients, turns=rounds, seed=seed)))
    if workload == "longdoc":
        return list(longdoc(LongDocSpec(documents=clients, questions=rounds, seed=seed)))
    return list(fewshot(FewShotSpec(prefixes=clients, queries=rounds, seed=seed)))


def tier_setups(config: CacheConfig, store_dir: Path) -> list[TierSetup]:
    """The same device capacity in every set-up; only the lower tiers change."""
    no_host = replace(config.host, enabled=False)
    host = config.host if config.host.enabled else HostConfig()
    storage = config.storage
    if not storage.enabled or storage.backend != "lmdb":
        storage = StorageConfig(backend="lmdb", path="", max_bytes=8 << 30)
    storage = replace(storage, path=str(store_dir))
    return [
        TierSetup("no cache", None),
        TierSetup("device", replace(config, host=no_host, storage=StorageConfig())),
        TierSetup("device+host", replace(config, host=host, storage=StorageConfig())),
        TierSetup("device+host+storage", replace(config, host=host, storage=storage)),
    ]


def serve(cache: HiRadixCache, req: TraceRequest) -> Served:
    """One request, driven the way the reference engine drives the cache."""
    tokens = req.tokens
    m = cache.match_prefix(tokens)
    device, fetched = m.device_hit_length, 0
    # The prefetch job looks storage up, then fetches, on the storage workers.
    if cache.storage is not None and cache.prefetch("bench", tokens, None, m.last_host_node):
        fetched = cache.wait_prefetch("bench").fetched_tokens
        cache.release_prefetch("bench")
        m = cache.match_prefix(tokens)
    prefix, last, _ = cache.admit(m)
    cache.start_loading()
    for layer in range(cache.device_pool.shape.num_layers):
        cache.wait_layer(layer)
    n_new = len(tokens) - prefix.numel()
    new = cache.alloc_device(n_new)
    if new is None:
        raise RuntimeError(f"no device room for a request: {cache.device_shortfall(n_new)}")
    cache.cache_finished_req(tokens, torch.cat([prefix, new[:n_new]]), last)
    cache.poll()
    reused = int(prefix.numel())
    aligned = len(tokens) // cache.page_size * cache.page_size
    return Served(device, max(reused - device - fetched, 0), fetched, aligned)


def replay(setup: TierSetup, trace: list[TraceRequest]) -> TierReport:
    if setup.config is None:
        return _no_cache_report(setup.name, trace)
    cache = HiRadixCache(setup.config)
    try:
        return _replay_cache(setup.name, cache, trace)
    finally:
        cache.close()


def _replay_cache(name: str, cache: HiRadixCache, trace: list[TraceRequest]) -> TierReport:
    per_tier = {"device": 0, "host": 0, "storage": 0}
    rounds: dict[int, list[int]] = {}
    peak = {"device": 0, "host": 0}
    spent = total = 0.0
    for req in tqdm(trace, desc=name, unit="req", leave=False):
        start = time.perf_counter()
        got = serve(cache, req)
        spent += time.perf_counter() - start
        for tier, value in zip(per_tier, got[:3], strict=True):
            per_tier[tier] += value
        total += got.total
        hits = rounds.setdefault(req.round, [0, 0])
        hits[0] += got.device + got.host + got.storage
        hits[1] += got.total
        _track_peak(cache, peak)
    cache.drain()
    stats = cache.stats().as_dict()
    saved = sum(per_tier.values())
    storage_bytes = cache.storage.backend.stats().bytes_used if cache.storage else 0
    return TierReport(
        name=name,
        hit_rate=saved / max(total, 1),
        hit_rate_by_tier={k: v / max(total, 1) for k, v in per_tier.items()},
        prefill_tokens_saved=saved,
        bytes_moved={link: stats[f"bytes_{link}"] for link in LINKS},
        cache_ms_per_request=spent * 1e3 / max(len(trace), 1),
        peak_bytes={**peak, "storage": storage_bytes},
        hit_rate_by_round=[h / max(t, 1) for _, (h, t) in sorted(rounds.items())],
    )


def _track_peak(cache: HiRadixCache, peak: dict[str, int]) -> None:
    per_token = cache.device_pool.shape.bytes_per_token
    dev = cache.device_pool.allocator
    peak["device"] = max(peak["device"], (dev.capacity - dev.available()) * per_token)
    if cache.host_pool is not None:
        host = cache.host_pool.allocator
        peak["host"] = max(peak["host"], (host.capacity - host.available()) * per_token)


def _no_cache_report(name: str, trace: list[TraceRequest]) -> TierReport:
    rounds = sorted({r.round for r in trace})
    return TierReport(
        name=name,
        hit_rate=0.0,
        hit_rate_by_tier={"device": 0.0, "host": 0.0, "storage": 0.0},
        prefill_tokens_saved=0,
        bytes_moved=dict.fromkeys(LINKS, 0),
        cache_ms_per_request=0.0,
        peak_bytes={"device": 0, "host": 0, "storage": 0},
        hit_rate_by_round=[0.0] * len(rounds),
    )


def working_set_tokens(trace: list[TraceRequest]) -> int:
    """Distinct tokens of the trace: each conversation's longest prompt (a
    rough upper bound: shared system prompts are counted once per client)."""
    longest: dict[int, int] = {}
    for req in trace:
        longest[req.conversation] = max(longest.get(req.conversation, 0), len(req.tokens))
    return sum(longest.values())


def print_table(reports: list[TierReport]) -> None:
    head = f"{'config':<22}{'hit':>7}{'device':>8}{'host':>8}{'storage':>9}"
    head += f"{'saved tok':>12}{'ms/req':>8}  MiB moved d2h/h2d/h2s/s2h  peak MiB dev/host/disk"
    print(head)
    for r in reports:
        t = r.hit_rate_by_tier
        moved = "/".join(f"{r.bytes_moved[k] / 2**20:.0f}" for k in LINKS)
        peak = "/".join(f"{r.peak_bytes[k] / 2**20:.0f}" for k in ("device", "host", "storage"))
        print(
            f"{r.name:<22}{r.hit_rate:>7.1%}{t['device']:>8.1%}{t['host']:>8.1%}"
            f"{t['storage']:>9.1%}{r.prefill_tokens_saved:>12,}{r.cache_ms_per_request:>8.2f}"
            f"  {moved:<25}  {peak}"
        )


def plot(reports: list[TierReport], path: Path, workload: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in reports:
        ax.plot(
            range(1, len(r.hit_rate_by_round) + 1), r.hit_rate_by_round, marker="o", label=r.name
        )
    ax.set_xlabel("round")
    ax.set_ylabel("token hit rate")
    ax.set_ylim(0, 1)
    ax.set_title(f"hicache tiering: {workload}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    config: CacheConfig = args.config
    trace = build_trace(args.workload, args.clients, args.rounds, args.seed)
    capacity = config.device.num_tokens
    ratio = working_set_tokens(trace) / max(capacity, 1)
    print(
        f"workload {args.workload}: {len(trace)} requests, working set ≈ {ratio:.1f}× "
        f"the device capacity ({capacity:,} tokens)"
    )
    with tempfile.TemporaryDirectory(prefix="hicache-bench-") as tmp:
        reports = [replay(s, trace) for s in tier_setups(config, Path(tmp) / "store")]
    print_table(reports)
    by_name = {r.name: r for r in reports}
    gain = by_name["device+host+storage"].hit_rate / max(by_name["device"].hit_rate, 1e-9)
    print(f"device+host+storage hit rate = {gain:.1f}× device-only")
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.json or args.out / "tiering.json"
    plot_path = args.plot or args.out / "tiering.png"
    payload = {
        "workload": args.workload,
        "working_set_ratio": ratio,
        "gain_vs_device": gain,
        "configs": [asdict(r) for r in reports],
    }
    json_path.write_text(json.dumps(payload, indent=2))
    plot(reports, plot_path, args.workload)
    print(f"report: {json_path}\nplot:   {plot_path}")
    return 0
