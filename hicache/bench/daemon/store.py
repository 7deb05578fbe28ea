"""The daemon's store: PUT/GET GB/s and daemon CPU per GiB on each store and sync level.

One daemon per ``--stores`` entry (``backend:sync``, e.g. ``lmdb:full``, the old
default, and ``disk:index``), all running at once; rounds alternate between them
(A/B/A/B), each round PUTs fresh pages through the ``remote`` backend and GETs
them back, and the best round of each counts. The memory tier is off, so every
GET reads the store (warm: just written, in the page cache). Ratios are against
the first entry, measured in the same run: wall GB/s, and the daemon's own CPU
seconds per GiB (``/proc/PID/stat``; what a loaded machine disturbs least).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

from hicache.bench.common.processes import ServerProcess, process_cpu_s, start_daemon
from hicache.config.daemon import STORE_BACKENDS
from hicache.config.flags import at_least
from storage_backends import StorageConfig
from storage_backends.config import SYNC_LEVELS
from storage_backends.remote.client import RemoteBackend


class StoreKind(NamedTuple):
    backend: str
    sync: str

    @property
    def name(self) -> str:
        return f"{self.backend}:{self.sync}"


@dataclass(frozen=True)
class Row:
    store: str
    op: str
    gbps: float
    ratio: float  # GB/s over the first store's
    cpu_s_per_gib: float  # the daemon's CPU seconds per GiB moved
    cpu_ratio: float  # the first store's CPU per GiB over this one's (> 1: cheaper)


class Phase(NamedTuple):
    wall_s: float
    cpu_s: float
    nbytes: int


def store_kinds(text: str) -> list[StoreKind]:
    """``--stores``: comma-separated ``backend:sync``; argparse's one-line refusal."""
    kinds = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        backend, _, sync = part.partition(":")
        if backend not in STORE_BACKENDS or sync not in SYNC_LEVELS:
            raise argparse.ArgumentTypeError(
                f"{part!r}: want BACKEND:SYNC, BACKEND in {STORE_BACKENDS}, SYNC in {SYNC_LEVELS}"
            )
        kinds.append(StoreKind(backend, sync))
    if not kinds:
        raise argparse.ArgumentTypeError("--stores needs at least one BACKEND:SYNC")
    return kinds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stores",
        type=store_kinds,
        default="lmdb:full,disk:index,disk:full",
        help="comma-separated BACKEND:SYNC daemons; ratios are against the first",
    )
    parser.add_argument("--page-kib", type=at_least(1), default=256, help="page size in KiB")
    parser.add_argument("--batch", type=at_least(1), default=16, help="pages per request")
    parser.add_argument("--mib", type=at_least(1), default=32, help="MiB per measurement")
    parser.add_argument("--repeat", type=at_least(1), default=3, help="rounds; the best counts")
    parser.add_argument(
        "--json", type=Path, default=None, help="also write the rows here (default: print only)"
    )


def _timed(pid: int, calls: list[Callable[[], list[bool]]], nbytes: int) -> Phase:
    cpu, start = process_cpu_s(pid), time.perf_counter()
    for call in calls:
        if not all(call()):
            raise RuntimeError("a page was not stored or not read back")
    return Phase(time.perf_counter() - start, process_cpu_s(pid) - cpu, nbytes)


def _config_text(kind: StoreKind, max_bytes: int) -> str:
    return (
        f'[store]\nbackend = "{kind.backend}"\nsync = "{kind.sync}"\n'
        f"max_bytes = {max_bytes}\nmemory_bytes = 0\n"
    )


class _Daemon(NamedTuple):
    kind: StoreKind
    server: ServerProcess
    client: RemoteBackend


def _round(daemon: _Daemon, tag: str, args: argparse.Namespace) -> tuple[Phase, Phase]:
    """PUT fresh pages, then GET them back; (put, get)."""
    size = args.page_kib << 10
    count = max(args.batch, (args.mib << 20) // size)
    keys = [hashlib.sha256(f"{tag}/{i}".encode()).digest() for i in range(count)]
    src = [memoryview(bytes([i % 251]) * size) for i in range(args.batch)]
    dst = [memoryview(bytearray(size)) for _ in range(args.batch)]
    spans = [keys[i : i + args.batch] for i in range(0, count, args.batch)]
    pid, client = daemon.server.pid, daemon.client
    put = _timed(pid, [partial(client.put, s, src[: len(s)]) for s in spans], count * size)
    get = _timed(pid, [partial(client.get, s, dst[: len(s)]) for s in spans], count * size)
    return put, get


def _best(phases: list[Phase]) -> Phase:
    """Fastest wall time and least CPU over the rounds (each the best of its own)."""
    return Phase(min(p.wall_s for p in phases), min(p.cpu_s for p in phases), phases[0].nbytes)


def _rows(results: dict[str, dict[str, Phase]]) -> list[Row]:
    rows = []
    first = next(iter(results.values()))
    for name, ops in results.items():
        for op, phase in ops.items():
            base = first[op]
            gib = phase.nbytes / (1 << 30)
            rows.append(
                Row(
                    name,
                    op,
                    phase.nbytes / phase.wall_s / 1e9,
                    base.wall_s / phase.wall_s,
                    phase.cpu_s / gib,
                    base.cpu_s / phase.cpu_s if phase.cpu_s > 0 else float("inf"),
                )
            )
    return rows


def _measure(daemons: list[_Daemon], args: argparse.Namespace) -> list[Row]:
    phases: dict[str, dict[str, list[Phase]]] = {
        d.kind.name: {"PUT": [], "GET": []} for d in daemons
    }
    for rnd in range(args.repeat):
        order = daemons if rnd % 2 == 0 else daemons[::-1]  # A/B, then B/A
        for daemon in order:
            put, get = _round(daemon, f"{rnd}/{daemon.kind.name}", args)
            phases[daemon.kind.name]["PUT"].append(put)
            phases[daemon.kind.name]["GET"].append(get)
    return _rows({name: {op: _best(p) for op, p in ops.items()} for name, ops in phases.items()})


def print_rows(rows: list[Row]) -> None:
    print(f"{'store':<12}{'op':<5}{'GB/s':>8}{'ratio':>8}{'CPU s/GiB':>11}{'CPU ratio':>11}")
    for r in rows:
        print(
            f"{r.store:<12}{r.op:<5}{r.gbps:>8.2f}{r.ratio:>8.2f}"
            f"{r.cpu_s_per_gib:>11.2f}{r.cpu_ratio:>11.2f}"
        )


def run(args: argparse.Namespace) -> int:
    kinds = args.stores if isinstance(args.stores, list) else store_kinds(args.stores)
    max_bytes = 2 * (args.repeat + 1) * max(args.mib << 20, args.batch * args.page_kib << 10)
    daemons: list[_Daemon] = []
    with tempfile.TemporaryDirectory(prefix="hicache-bench-daemon-store-") as tmp:
        try:
            for n, kind in enumerate(kinds):
                config = Path(tmp) / f"daemon-{n}.toml"
                config.write_text(_config_text(kind, max_bytes))
                server = start_daemon(config, Path(tmp) / f"store-{n}")
                remote = StorageConfig(backend="remote", endpoint=server.endpoint, timeout_s=60.0)
                daemons.append(_Daemon(kind, server, RemoteBackend(remote)))
            rows = _measure(daemons, args)
        finally:
            for daemon in daemons:
                daemon.client.close()
                daemon.server.stop()
    print_rows(rows)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
        print(f"report: {args.json}")
    return 0
