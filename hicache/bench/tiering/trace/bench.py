"""``hicache bench tiering --trace``: replay a production trace, size the tiers, judge the disk.

A trace in Mooncake's format (``trace.file``; ``--trace mooncake-conversation``
is the copy shipped in the package) is replayed through ``HiRadixCache`` once
per set-up (``trace.setups``: device only, + host, + storage per size given),
and compared with the trace's unbounded-capacity bound (``trace.bound``).
Each prompt is synthesized from its hash ids, one run of distinct token ids
per block. The pools hold a tiny geometry and the report scales the traffic
to ``--model`` (``trace.models``); at the default page size of 512 tokens (one
Mooncake block) a whole conversation trace replays in a few minutes on 2
cores. The store's rates come from a short probe (``trace.probe``) or
``--disk-gbps``; the report (``trace.report``) says whether it keeps up.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from hicache.bench.common.provenance import provenance
from hicache.bench.tiering.stores import storage_setup
from hicache.bench.tiering.trace.bound import unbounded_hits
from hicache.bench.tiering.trace.file import (
    MOONCAKE_BLOCK_TOKENS,
    SHIPPED_TRACES,
    Trace,
    read_trace,
    resolve_trace,
)
from hicache.bench.tiering.trace.models import (
    DEFAULT_MODEL,
    MODEL_PRESETS,
    REPLAY_MODEL,
    ModelGeometry,
    parse_model,
    replay_bytes_per_token,
)
from hicache.bench.tiering.trace.probe import StoreRate, given_rates, probe
from hicache.bench.tiering.trace.rates import WINDOW_S, window_index
from hicache.bench.tiering.trace.replay import ReplayResult, replay_job
from hicache.bench.tiering.trace.report import (
    Context,
    SetupFigures,
    Verdict,
    figures_json,
    print_hits,
    print_links,
    print_verdicts,
    setup_figures,
    verdicts,
)
from hicache.bench.tiering.trace.setups import (
    REPLACED_KEYS,
    TierSizes,
    build_setup,
    check_sizes,
    check_store,
    parse_token_list,
    sweep,
)
from hicache.config.cache import CacheConfig
from hicache.config.flags import at_least, overrides_of

logger = logging.getLogger(__name__)
DEFAULT_PAGE = 512
PROBE_MIB = 256
JOBS = 2  # the 2 cores of the machines this was sized on; each job is mostly waits


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("trace replay (--trace; sizes in tokens: 500k, 1M, 2.5M)")
    group.add_argument(
        "--trace",
        metavar="PATH|NAME",
        help=f"replay a trace in Mooncake's JSONL format (gzip or plain) instead of a "
        f"generated workload; shipped: {', '.join(SHIPPED_TRACES)} (default: none, the "
        f"generated workload)",
    )
    group.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"the model the traffic is reported for: {', '.join(MODEL_PRESETS)}, or "
        f"LAYERS/KV_HEADS/HEAD_DIM/DTYPE (e.g. 80/8/128/bfloat16)",
    )
    _size_flags(group)
    _rate_flags(group)


def _size_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--device-tokens", default="1M", metavar="N[,N...]", help="device pool size(s)"
    )
    group.add_argument(
        "--host-tokens", default="3M", metavar="N[,N...]|none", help="host pool size(s)"
    )
    group.add_argument(
        "--storage-tokens",
        default="10M,50M,100M",
        metavar="N[,N...]|none",
        help="storage size(s): the capacity sweep",
    )
    group.add_argument(
        "--page-size",
        type=at_least(1),
        metavar="TOKENS",
        default=DEFAULT_PAGE,
        help="tokens per page in the replay (must divide the trace's blocks)",
    )
    group.add_argument(
        "--block-tokens",
        type=at_least(1),
        metavar="TOKENS",
        default=MOONCAKE_BLOCK_TOKENS,
        help="tokens per hash id in the trace",
    )


def _rate_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--window-s", type=float, default=WINDOW_S, metavar="S", help="bandwidth window"
    )
    group.add_argument(
        "--disk-gbps",
        metavar="READ[,WRITE]",
        help="the store's GB/s instead of measuring the config's store and a daemon here "
        "(default: measured)",
    )
    group.add_argument(
        "--jobs",
        type=at_least(1),
        metavar="N",
        default=JOBS,
        help="set-ups replayed at once, each in a process of its own",
    )
    group.add_argument(
        "--probe-mib",
        type=at_least(1),
        default=PROBE_MIB,
        metavar="MIB",
        help="what each store probe writes",
    )


@dataclass(frozen=True)
class Plan:
    """Everything the flags decide (``plan_run``), checked before anything runs."""

    config: CacheConfig
    path: Path
    model: ModelGeometry
    page_size: int
    sizes: tuple[TierSizes, ...]
    window_s: float
    given: StoreRate | None


def plan_run(args: argparse.Namespace, config: CacheConfig) -> Plan:
    """The run the flags ask for; ValueError naming the flag that is wrong."""
    _refuse_replaced(args)
    if args.block_tokens % args.page_size:
        raise ValueError(
            f"--page-size {args.page_size} must divide --block-tokens {args.block_tokens}"
        )
    if args.window_s <= 0:
        raise ValueError(f"--window-s must be > 0, got {args.window_s}")
    sizes = sweep(
        parse_token_list(args.device_tokens, "--device-tokens"),
        parse_token_list(args.host_tokens, "--host-tokens", allow_none=True),
        parse_token_list(args.storage_tokens, "--storage-tokens", allow_none=True),
        args.page_size,
    )
    if any(s.storage for s in sizes):
        check_store(storage_setup(config, Path("store")))
    given = given_rates(args.disk_gbps) if args.disk_gbps else None
    model = parse_model(args.model)
    path = resolve_trace(args.trace)
    return Plan(config, path, model, args.page_size, tuple(sizes), args.window_s, given)


def _refuse_replaced(args: argparse.Namespace) -> None:
    for key in overrides_of(args):
        for prefix, flag in REPLACED_KEYS.items():
            if key == prefix or (prefix.endswith(".") and key.startswith(prefix)):
                raise ValueError(f"--set {key}: with --trace this is set by {flag}")
    if args.engines != 1:
        raise ValueError("--engines 2 runs generated workloads only; leave it out with --trace")


def describe(trace: Trace, plan: Plan) -> None:
    n = len(trace.records)
    rate = trace.input_tokens / max(trace.duration_s, 1e-9)
    print(
        f"trace {trace.source}: {n:,} requests, {trace.input_tokens:,} prompt tokens, "
        f"{trace.distinct_blocks:,} distinct {trace.block_tokens}-token blocks, "
        f"{trace.duration_s:,.0f} s ({n / max(trace.duration_s, 1e-9):.2f} req/s, "
        f"{rate:,.0f} prompt tokens/s)"
    )
    if trace.reordered:
        print(f"  {trace.reordered:,} lines out of timestamp order: replayed in arrival order")
    print(
        f"model {plan.model.summary()}; the pools hold {REPLAY_MODEL.num_layers} layer × "
        f"{replay_bytes_per_token()} B a token, pages of {plan.page_size} tokens "
        f"(the report scales every token moved to the model)"
    )


def run(args: argparse.Namespace) -> int:
    try:  # every check before the first replay: a bad flag or line costs nothing
        plan = plan_run(args, args.config)
        trace = read_trace(plan.path, args.block_tokens)
        check_sizes(plan.sizes, max(r.input_length for r in trace.records))
    except ValueError as exc:
        print(f"hicache: {exc}", file=sys.stderr)
        return 2
    describe(trace, plan)
    lengths = np.fromiter((r.input_length for r in trace.records), np.int64, len(trace.records))
    windows = window_index(trace, plan.window_s)
    ctx = Context(
        lengths, unbounded_hits(trace, plan.page_size), windows, plan.window_s, plan.model
    )
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hicache-trace-") as tmp:
        results = _replay_all(plan, trace, ctx, Path(tmp), args.jobs)
        replay_s = time.perf_counter() - began
        stores = _stores(plan, args.probe_mib << 20, Path(tmp))
    figures = [setup_figures(r, ctx) for r in results]
    judged = verdicts(figures, stores)
    print_hits(figures)
    print_links(figures, plan.model, plan.window_s)
    print_verdicts(judged, stores)
    print(f"replayed {len(results)} set-ups in {replay_s:.0f} s")
    report = Report(trace, figures, judged, stores, results, replay_s)
    return _write(args, plan, report, ctx)


def _stores(plan: Plan, probe_bytes: int, scratch: Path) -> list[StoreRate]:
    """What the storage rows are judged against: ``--disk-gbps``, else a probe (none
    without storage rows)."""
    if plan.given is not None:
        return [plan.given]
    if not any(s.storage for s in plan.sizes):
        return []
    print(f"measuring the config's store and a daemon ({probe_bytes >> 20} MiB each)...")
    return probe(plan.config, plan.model, probe_bytes, scratch)


def _replay_all(
    plan: Plan, trace: Trace, ctx: Context, scratch: Path, jobs: int
) -> list[ReplayResult]:
    """Every set-up, ``jobs`` at a time (each job a process of its own: a replay waits on
    its cache's worker threads much of the time), a line per set-up as it finishes."""
    n = len(plan.sizes)
    setups = [build_setup(plan.config, s, scratch / f"store{i}") for i, s in enumerate(plan.sizes)]
    labels = [f"[{i + 1}/{n}] {s.name}" for i, s in enumerate(setups)]
    results: list[ReplayResult | None] = [None] * n
    if jobs == 1:
        for i, setup in enumerate(setups):
            results[i] = _done(replay_job(setup, trace, labels[i], 0), labels[i], ctx)
        return [r for r in results if r is not None]
    spawn = multiprocessing.get_context("spawn")  # no fork of a process running threads
    with ProcessPoolExecutor(jobs, mp_context=spawn) as pool:
        running = {
            pool.submit(replay_job, setup, trace, labels[i], i % jobs): i
            for i, setup in enumerate(setups)
        }
        for future in as_completed(running):
            i = running[future]
            results[i] = _done(future.result(), labels[i], ctx)
    return [r for r in results if r is not None]


def _done(result: ReplayResult, label: str, ctx: Context) -> ReplayResult:
    fig = setup_figures(result, ctx)
    print(
        f"{label}: hit {fig.hit_rate:.1%} (bound {fig.bound_hit_rate:.1%}), "
        f"replayed in {result.seconds:.0f} s",
        flush=True,
    )
    return result


class Report(NamedTuple):
    trace: Trace
    figures: list[SetupFigures]
    verdicts: list[Verdict]
    stores: list[StoreRate]
    results: list[ReplayResult]
    replay_s: float


def payload(args: argparse.Namespace, plan: Plan, report: Report) -> dict[str, object]:
    """The JSON report: ``figures`` and ``bound`` are the same on every run; ``stores``,
    ``verdicts`` (against the measured stores) and ``timings`` are measurements."""
    trace = report.trace
    return {
        "trace": {
            "source": args.trace,
            "requests": len(trace.records),
            "prompt_tokens": trace.input_tokens,
            "distinct_blocks": trace.distinct_blocks,
            "block_tokens": trace.block_tokens,
            "duration_s": trace.duration_s,
        },
        "model": {**asdict(plan.model), "bytes_per_token": plan.model.bytes_per_token},
        "replay": {"page_size": plan.page_size, "bytes_per_token": replay_bytes_per_token()},
        "window_s": plan.window_s,
        "figures": [figures_json(f) for f in report.figures],
        "stores": [s._asdict() for s in report.stores],
        "verdicts": [v._asdict() for v in report.verdicts],
        "timings": {
            "replay_s": report.replay_s,
            "per_setup_s": {r.name: r.seconds for r in report.results},
        },
        "provenance": provenance(),
        "config": asdict(plan.config),
    }


def _write(args: argparse.Namespace, plan: Plan, report: Report, ctx: Context) -> int:
    stem = "trace-" + Path(args.trace).name.split(".")[0]
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.json or args.out / f"{stem}.json"
    plot_path = args.plot or args.out / f"{stem}.png"
    json_path.write_text(json.dumps(payload(args, plan, report), indent=2) + "\n")
    from hicache.bench.tiering.trace.plot import plot, storage_series

    title = f"{Path(args.trace).name}, {plan.model.name}"
    series = storage_series(report.results, ctx)
    plot(report.figures, series, report.stores, title, plot_path)
    print(f"report: {json_path}\nplot:   {plot_path}")
    return 0
