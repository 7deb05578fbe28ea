"""What tiering buys: replay a workload through no cache, device, +host, +storage.

Four rows, every one with the same device pool: no cache (every token is
recomputed), device only, device + host, and device + host + storage. --config
(and --set) decide the model, the device pool, the policies, the host pool of
the two host rows (host.ratio 2.0 when the config turns the host tier off) and
the backend of the storage row: disk, lmdb or file in a temporary directory, redis or
mooncake under a key prefix of this run, remote on the configured daemon,
memory as it is; with no storage tier configured, disk in a temporary
directory. It never changes which rows run: `--config device-only` still
measures all four, from the device-only config's model and device pool.

The replay is deterministic: each request waits for its own prefetch, and
after it the bench drains every backup and storage write (drain()), so the
next request meets the same cache on every run of the same seed and config.
(The engine keeps the timing-dependent prefetch policy; only the bench pins
it down.)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import NamedTuple

from hicache.bench.common.provenance import provenance
from hicache.bench.common.scratch import release_scratch
from hicache.bench.common.workloads import (
    FewShotSpec,
    LongDocSpec,
    MultiTurnSpec,
    TraceRequest,
    fewshot,
    longdoc,
    multiturn,
)
from hicache.bench.tiering.serving import LINKS, TIERS, Served, TierReport, serve
from hicache.bench.tiering.stores import storage_setup
from hicache.cache import HiRadixCache
from hicache.config.cache import CacheConfig, HostConfig
from hicache.config.flags import at_least
from storage_backends import StorageConfig

# What one "round" of each workload is, for the plot's axis.
ROUND_MEANING = {
    "multiturn": "turn r of every conversation",
    "longdoc": "the r-th question to every document",
    "fewshot": "the r-th query behind every few-shot prefix",
}


class TierSetup(NamedTuple):
    name: str
    config: CacheConfig | None  # None: no cache at all


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        choices=("multiturn", "longdoc", "fewshot"),
        default="multiturn",
        help="request trace",
    )
    parser.add_argument(
        "--clients", type=at_least(1), default=48, help="conversations / documents / prefixes"
    )
    parser.add_argument("--rounds", type=at_least(1), default=6, help="turns / questions / queries")
    parser.add_argument("--seed", type=at_least(0), default=0, help="workload seed")
    parser.add_argument(
        "--engines",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: add two rows, two engine processes with their own disk store each, then "
        "sharing a daemon",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="report folder")
    parser.add_argument(
        "--json", type=Path, default=None, help="report file (default: OUT/tiering.json)"
    )
    parser.add_argument("--plot", type=Path, default=None, help="plot (default: OUT/tiering.png)")
    from hicache.bench.tiering.trace import bench as trace_bench

    trace_bench.add_arguments(parser)


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
    storage = storage_setup(config, store_dir)
    return [
        TierSetup("no cache", None),
        TierSetup("device", replace(config, host=no_host, storage=StorageConfig())),
        TierSetup("device+host", replace(config, host=host, storage=StorageConfig())),
        TierSetup("device+host+storage", replace(config, host=host, storage=storage)),
    ]


def describe_setups(config: CacheConfig, setups: list[TierSetup]) -> str:
    """What each row is, and which of its tiers the bench chose because the config has none."""
    lines = [
        f"rows (each with the config's model, policies and device pool of "
        f"{config.device.num_tokens:,} tokens):"
    ]
    lines += [f"  {s.name:<20}  {_tiers_text(s.config)}" for s in setups]
    full = setups[-1].config
    if full is not None and not config.host.enabled:
        lines.append(
            f"  the config has no host tier: the host rows use host.ratio {full.host.ratio}"
        )
    if full is not None and not config.storage.enabled:
        lines.append(
            f"  the config has no storage tier: the storage row uses {full.storage.backend}"
        )
    return "\n".join(lines)


def _tiers_text(setup: CacheConfig | None) -> str:
    if setup is None:
        return "every token recomputed"
    parts = ["device"]
    if setup.host.enabled:
        h = setup.host
        parts.append(f"host ({f'{h.size_gb} GB' if h.size_gb else f'{h.ratio}× the device pool'})")
    if setup.storage.enabled:
        s = setup.storage
        where = f" at {s.endpoint}" if s.endpoint else " in a temporary directory" * bool(s.path)
        parts.append(f"storage ({s.backend}{where})")
    return " + ".join(parts) if len(parts) > 1 else "device only"


def replay(setup: TierSetup, trace: list[TraceRequest]) -> TierReport:
    if setup.config is None:
        return _no_cache_report(setup.name, trace)
    cache = HiRadixCache(setup.config)
    try:
        return _replay_cache(setup.name, cache, trace)
    finally:
        cache.close()


class _Tally:
    """Tokens served per tier, overall and per round."""

    def __init__(self) -> None:
        self.tiers = dict.fromkeys(TIERS, 0)
        self.total = 0
        self.rounds: dict[int, list[int]] = {}  # round -> [device, host, storage, total]

    def add(self, round_: int, got: Served) -> None:
        for tier, value in zip(TIERS, got[:3], strict=True):
            self.tiers[tier] += value
        self.total += got.total
        row = self.rounds.setdefault(round_, [0, 0, 0, 0])
        for i, value in enumerate(got):
            row[i] += value

    def by_round(self) -> dict[str, list[float]]:
        rows = [row for _, row in sorted(self.rounds.items())]
        return {t: [row[i] / max(row[3], 1) for row in rows] for i, t in enumerate(TIERS)}


def _replay_cache(name: str, cache: HiRadixCache, trace: list[TraceRequest]) -> TierReport:
    from tqdm import tqdm  # an extra (hicache[bench]); the CLI checks for it first

    tally = _Tally()
    peak = {"device": 0, "host": 0}
    spent = 0.0
    for req in tqdm(trace, desc=name, unit="req", leave=False):
        start = time.perf_counter()
        tally.add(req.round, serve(cache, req))
        spent += time.perf_counter() - start
        _track_peak(cache, peak)
    cache.drain()
    stats = cache.stats().as_dict()
    saved = sum(tally.tiers.values())
    by_round = tally.by_round()
    storage_bytes = cache.storage.backend.stats().bytes_used if cache.storage else 0
    return TierReport(
        name=name,
        hit_rate=saved / max(tally.total, 1),
        hit_rate_by_tier={k: v / max(tally.total, 1) for k, v in tally.tiers.items()},
        prefill_tokens_saved=saved,
        bytes_moved={link: stats[f"bytes_{link}"] for link in LINKS},
        cache_ms_per_request=spent * 1e3 / max(len(trace), 1),
        peak_bytes={**peak, "storage": storage_bytes},
        hit_rate_by_round=[sum(v) for v in zip(*by_round.values(), strict=True)],
        hit_rate_by_round_by_tier=by_round,
    )


def _track_peak(cache: HiRadixCache, peak: dict[str, int]) -> None:
    per_token = cache.device_pool.shape.bytes_per_token
    dev = cache.device_pool.allocator
    peak["device"] = max(peak["device"], (dev.capacity - dev.available()) * per_token)
    if cache.host_pool is not None:
        host = cache.host_pool.allocator
        peak["host"] = max(peak["host"], (host.capacity - host.available()) * per_token)


def _no_cache_report(name: str, trace: list[TraceRequest]) -> TierReport:
    n_rounds = len({r.round for r in trace})
    return TierReport(
        name=name,
        hit_rate=0.0,
        hit_rate_by_tier=dict.fromkeys(TIERS, 0.0),
        prefill_tokens_saved=0,
        bytes_moved=dict.fromkeys(LINKS, 0),
        cache_ms_per_request=0.0,
        peak_bytes=dict.fromkeys(TIERS, 0),
        hit_rate_by_round=[0.0] * n_rounds,
        hit_rate_by_round_by_tier={t: [0.0] * n_rounds for t in TIERS},
    )


def working_set_tokens(trace: list[TraceRequest]) -> int:
    """Distinct tokens of the trace: each conversation's longest prompt (a
    rough upper bound: shared system prompts are counted once per client)."""
    longest: dict[int, int] = {}
    for req in trace:
        longest[req.conversation] = max(longest.get(req.conversation, 0), len(req.tokens))
    return sum(longest.values())


def ratio(value: float, base: float) -> float | None:
    """``value / base``, or None (printed "n/a") when the base is 0."""
    return value / base if base > 0 else None


def print_table(reports: list[TierReport]) -> None:
    head = f"{'config':<22}{'hit':>7}{'device':>8}{'host':>8}{'storage':>9}"
    head += f"{'saved tok':>12}{'ms/req':>8}  MiB moved d2h/h2d/h2s/s2h  peak MiB dev/host/disk"
    print(head)
    for r in reports:
        t = r.hit_rate_by_tier
        moved = "/".join(f"{r.bytes_moved[k] / 2**20:.0f}" for k in LINKS)
        peak = "/".join(f"{r.peak_bytes[k] / 2**20:.0f}" for k in TIERS)
        print(
            f"{r.name:<22}{r.hit_rate:>7.1%}{t['device']:>8.1%}{t['host']:>8.1%}"
            f"{t['storage']:>9.1%}{r.prefill_tokens_saved:>12,}{r.cache_ms_per_request:>8.2f}"
            f"  {moved:<25}  {peak}"
        )
    print("(ms/req is a timing; every other figure is the same on every run of this seed)")


def run(args: argparse.Namespace) -> int:
    if args.trace is not None:
        from hicache.bench.tiering.trace import bench as trace_bench

        return trace_bench.run(args)
    config: CacheConfig = args.config
    trace = build_trace(args.workload, args.clients, args.rounds, args.seed)
    capacity = config.device.num_tokens
    load = working_set_tokens(trace) / max(capacity, 1)
    print(
        f"workload {args.workload} (seed {args.seed}): {len(trace)} requests, working set "
        f"≈ {load:.1f}× the device capacity ({capacity:,} tokens)"
    )
    with tempfile.TemporaryDirectory(prefix="hicache-bench-") as tmp:
        setups = tier_setups(config, Path(tmp) / "store")
        print(describe_setups(config, setups))
        reports = [replay(s, trace) for s in setups]
        full = setups[-1].config  # the set-up with the storage tier
        assert full is not None
        cleaned = release_scratch(full.storage)
        if cleaned:
            print(cleaned)
    print_table(reports)
    by_name = {r.name: r for r in reports}
    gain = ratio(by_name["device+host+storage"].hit_rate, by_name["device"].hit_rate)
    shown = "n/a (the device-only hit rate is 0)" if gain is None else f"{gain:.2f}×"
    print(f"device+host+storage hit rate vs device-only: {shown}")
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.json or args.out / "tiering.json"
    plot_path = args.plot or args.out / "tiering.png"
    payload = {
        "workload": args.workload,
        "seed": args.seed,
        "clients": args.clients,
        "rounds": args.rounds,
        "requests": len(trace),
        "working_set_ratio": load,
        "gain_vs_device": gain,
        "provenance": provenance(),
        "config": asdict(config),
        "configs": [asdict(r) for r in reports],
    }
    if args.engines > 1:
        from hicache.bench.tiering.sharing import report_sharing

        payload["engines"] = report_sharing(config, trace, args.workload)
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    from hicache.bench.tiering.plot import plot

    plot(reports, plot_path, args.workload, ROUND_MEANING[args.workload])
    print(f"report: {json_path}\nplot:   {plot_path}")
    return 0
