"""Two engines, one workload: own LMDB stores versus one shared cache daemon.

``hicache bench tiering --engines 2`` runs the workload through two
engine-side caches in two OS processes, each serving half of the clients
(every half sees every system prompt / document), twice: each engine with its
own LMDB store, then both on one daemon (started and stopped here). Engine 1
joins once engine 0 has served its first round and written it to storage (a
new engine joining a warm fleet); both then run concurrently. Only through the
daemon can one engine reuse what the other computed. Each engine drains its
cache after every request, so the rows measure what is shared, not how fast
each store acknowledges writes.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import queue
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path

import torch

from hicache.bench.common.processes import start_daemon
from hicache.bench.common.workloads import MultiTurnSpec, TraceRequest
from hicache.bench.tiering.serving import serve
from hicache.cache import HiRadixCache
from hicache.config.cache import CacheConfig
from storage_backends import StorageConfig

ENGINES = 2
OWN_LMDB = "2 engines, own LMDB each"
SHARED = "2 engines, shared daemon"
JOIN_TIMEOUT_S = 600.0
DAEMON_CONFIG = "daemon"  # a shipped config (hicache.config.shipped.resolve_config)


@dataclass(frozen=True)
class EngineRun:
    """One engine's share of a run: tokens it reused (per tier) out of those it was asked."""

    hit_tokens: dict[str, int]
    total_tokens: int
    requests: int

    @property
    def hit_rate(self) -> float:
        return sum(self.hit_tokens.values()) / max(self.total_tokens, 1)


@dataclass(frozen=True)
class SharingReport:
    name: str
    hit_rate: float
    hit_rate_by_engine: list[float]
    hit_rate_by_tier: dict[str, float]


def split(
    trace: list[TraceRequest], workload: str, system_prompts: int
) -> list[list[TraceRequest]]:
    """Half of the clients each; both halves see every shared prefix.

    multiturn: conversation ``c`` uses system prompt ``c % system_prompts``, so
    whole blocks of ``system_prompts`` conversations go to each engine;
    longdoc/fewshot: a "client" is a document, so its questions alternate.
    """
    if workload == "multiturn":
        halves = [
            [r for r in trace if (r.conversation // system_prompts) % ENGINES == e]
            for e in range(ENGINES)
        ]
    else:
        halves = [trace[e::ENGINES] for e in range(ENGINES)]
    if not all(halves):
        raise ValueError(
            f"--engines {ENGINES} needs clients for every engine: at least "
            f"{ENGINES * system_prompts} for multiturn (whole blocks of {system_prompts})"
        )
    return halves


def _engine_process(
    config: CacheConfig,
    trace: list[TraceRequest],
    warm: Event,
    leader: bool,
    out: Queue[tuple[bool, EngineRun | str]],
) -> None:
    """Child process body: the result (or the error) goes back through ``out``."""
    try:
        out.put((leader, _engine_main(config, trace, warm, leader)))
    except Exception as e:  # reported to the parent, which raises it
        warm.set()
        out.put((leader, f"{type(e).__name__}: {e}"))


def _engine_main(
    config: CacheConfig, trace: list[TraceRequest], warm: Event, leader: bool
) -> EngineRun:
    torch.set_num_threads(1)
    cache = HiRadixCache(config)
    hits = {"device": 0, "host": 0, "storage": 0}
    total = 0
    try:
        if not leader and not warm.wait(JOIN_TIMEOUT_S):
            raise RuntimeError("engine 0 did not finish its first round in time")
        for i, req in enumerate(trace):
            got = serve(cache, req)
            # Each request's backups and writes land before the next request, so that
            # neither set-up's hit rate depends on how fast its store acknowledges.
            cache.drain()
            for tier, value in zip(hits, got[:3], strict=True):
                hits[tier] += value
            total += got.total
            if leader and (i + 1 == len(trace) or trace[i + 1].round != req.round):
                warm.set()  # its first round is in storage: the other engine may join
    finally:
        warm.set()  # never leave the other engine waiting
        cache.close()
    return EngineRun(hits, total, len(trace))


def run_engines(
    name: str, configs: list[CacheConfig], halves: list[list[TraceRequest]]
) -> SharingReport:
    """Each half through its own cache in its own process. Forked from a fresh server
    process that has imported this module (so torch) once: no state of this process's
    threads, and no import per engine."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    warm, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_engine_process, args=(cfg, half, warm, e == 0, out))
        for e, (cfg, half) in enumerate(zip(configs, halves, strict=True))
    ]
    for proc in procs:
        proc.start()
    try:
        results = _collect(out, procs)
    finally:
        for proc in procs:
            proc.join(JOIN_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
    errors = [r for r in results.values() if isinstance(r, str)]
    if errors:
        raise RuntimeError(f"an engine process failed: {errors[0]}")
    runs: list[EngineRun] = [results[True], results[False]]  # type: ignore[list-item]
    total = sum(r.total_tokens for r in runs)
    by_tier = {t: sum(r.hit_tokens[t] for r in runs) / max(total, 1) for t in runs[0].hit_tokens}
    return SharingReport(
        name=name,
        hit_rate=sum(by_tier.values()),
        hit_rate_by_engine=[r.hit_rate for r in runs],
        hit_rate_by_tier=by_tier,
    )


def _collect(
    out: Queue[tuple[bool, EngineRun | str]], procs: Sequence[BaseProcess]
) -> dict[bool, EngineRun | str]:
    """Each process's result; RuntimeError if one dies without a word or the run overruns."""
    results: dict[bool, EngineRun | str] = {}
    deadline = time.monotonic() + 2 * JOIN_TIMEOUT_S
    while len(results) < len(procs):
        try:
            leader, result = out.get(timeout=1.0)
        except queue.Empty:
            if time.monotonic() > deadline or not any(p.is_alive() for p in procs):
                codes = [p.exitcode for p in procs]
                raise RuntimeError(f"engine processes ended without a result: {codes}") from None
            continue
        results[leader] = result
    return results


def compare(
    config: CacheConfig, trace: list[TraceRequest], workload: str, system_prompts: int
) -> list[SharingReport]:
    """The two rows: own LMDB per engine, then one shared daemon."""
    halves = split(trace, workload, system_prompts)
    base = _with_storage(config, StorageConfig())
    with tempfile.TemporaryDirectory(prefix="hicache-bench-sharing-") as tmp:
        own = [
            _with_storage(base, StorageConfig(backend="lmdb", path=f"{tmp}/engine{e}"))
            for e in range(ENGINES)
        ]
        reports = [run_engines(OWN_LMDB, own, halves)]
        with start_daemon(DAEMON_CONFIG, Path(tmp) / "daemon-store") as daemon:
            remote = StorageConfig(backend="remote", endpoint=daemon.endpoint, timeout_s=30.0)
            shared = [_with_storage(base, remote)] * ENGINES
            reports.append(run_engines(SHARED, shared, halves))
    return reports


def _with_storage(config: CacheConfig, storage: StorageConfig) -> CacheConfig:
    """``config`` with ``storage`` (keeping its capacity) and the host tier on."""
    if storage.enabled:
        storage = replace(storage, max_bytes=max(config.storage.max_bytes, 1 << 30))
    host = config.host if config.host.enabled else replace(config.host, enabled=True)
    return replace(config, host=host, storage=storage)


def print_rows(reports: list[SharingReport]) -> None:
    print(f"{'config':<28}{'hit':>7}{'engine 0':>10}{'engine 1':>10}{'storage':>9}")
    for r in reports:
        e0, e1 = r.hit_rate_by_engine
        storage = r.hit_rate_by_tier["storage"]
        print(f"{r.name:<28}{r.hit_rate:>7.1%}{e0:>10.1%}{e1:>10.1%}{storage:>9.1%}")


def report_sharing(
    config: CacheConfig, trace: list[TraceRequest], workload: str
) -> list[dict[str, object]]:
    """Run both set-ups, print their rows and return them JSON-ready."""
    reports = compare(config, trace, workload, MultiTurnSpec().system_prompts)
    print_rows(reports)
    own, shared = reports
    verdict = "beats" if shared.hit_rate > own.hit_rate else "does NOT beat"
    print(f"shared daemon {verdict} own LMDB: {shared.hit_rate:.1%} vs {own.hit_rate:.1%}")
    return [dataclasses.asdict(r) for r in reports]
