"""SGLang's L3 traffic through hicache's SGLang backend against SGLang's own HiCacheFile.

The same pages (a real host pool layout: SGLang's own page methods, see
``hicache.integrations.sglang_cpu``) go through SGLang's cache-controller
code: backups (``_page_backup``: ``batch_set`` / ``batch_set_v1``), then the
prefetch thread's hit query (``batch_exists`` in chunks of 128) and reads
(``batch_get`` into flat pages, or ``batch_get_v1`` straight into the host
pool). Targets, one after the other on the same pages and the same disk:
SGLang's ``HiCacheFile`` (generic path: one file per page, ``readinto``, no
fsync) as the baseline; ``HicacheStorage`` over LMDB and over the ``disk``
backend in-process (v1, sync off like the baseline, checksums on), over the
daemon on ``ipc://`` and on ``tcp://`` (sync off); and the daemon, and one
``disk`` store, read by 2 processes at once against HiCacheFile read by 2
processes at once. Reads are warm (just written: in the
OS page cache or the daemon's memory), so the comparison is of code paths.
Figures are GB/s of page payload, best of ``--repeat``; ratio = target /
HiCacheFile in this run.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from hicache.bench.common.processes import add_daemon_set_flag, serve_sets
from hicache.bench.sglang.l3 import (
    BASELINE,
    Geometry,
    Row,
    backup_pages,
    close_storage,
    daemon_config,
    host_pool,
    open_storage,
    prefetch_pages,
    timed,
    tokens_for,
)
from hicache.config.flags import at_least
from hicache.integrations.sglang_cpu import Controller, chain_hashes, enter_sglang

BATCHES = (1, 4, 16)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pages", type=at_least(1), default=64, help="pages per run")
    parser.add_argument("--page-size", type=at_least(1), default=32, help="tokens per page")
    parser.add_argument("--layers", type=at_least(1), default=32, help="model layers")
    parser.add_argument("--kv-heads", type=at_least(1), default=1, help="KV heads per TP rank")
    parser.add_argument("--head-dim", type=at_least(1), default=128, help="head dimension")
    parser.add_argument(
        "--layout",
        choices=("page_first", "page_first_direct", "layer_first"),
        default="page_first",
        help="SGLang's host pool layout (--hicache-mem-layout)",
    )
    parser.add_argument("--repeat", type=at_least(1), default=3, help="timed runs; the best counts")
    parser.add_argument(
        "--torch-threads",
        type=at_least(1),
        default=1,
        help="torch intra-op threads (SGLang's page copies are torch ops; on a loaded "
        "machine more threads make every copy wait for a busy core)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        help="the run's scratch goes in a fresh directory made here, removed after "
        "(created if missing; default: the system's temp dir)",
    )
    parser.add_argument(
        "--linker",
        action="store_true",
        help="add the linker's rows: SGLang's UnifiedRadixCache with HicacheLinker below it "
        "against the L3 path, same pages and daemon (imports SGLang's tree: slower start)",
    )
    add_daemon_set_flag(
        parser,
        "override one field of the daemon's config (repeatable; the bench's own: "
        "store.sync=false, store.memory_bytes=1 GiB, the daemon's default store.backend), "
        "e.g. store.backend=lmdb",
    )
    parser.add_argument(
        "--json", type=Path, help="write the rows as a JSON list here (default: print only)"
    )


class _Target:
    """One storage object with a source pool (written from) and a target pool (read into)."""

    def __init__(
        self, name: str, geometry: Geometry, root: Path, endpoint: str, daemon_pid: int = 0
    ) -> None:
        self.name, self.geometry, self.v1 = name, geometry, name != BASELINE
        self.daemon_pid = daemon_pid
        self.pool, self.dst = host_pool(geometry, 1), host_pool(geometry, 2)
        self.backend = open_storage(name, self.pool, root, endpoint)
        self.best: dict[tuple[str, int], float] = {}
        self.best_cpu: dict[tuple[str, int], float] = {}

    def once(self, batch: int, seed: int) -> None:
        """Write fresh pages ``batch`` per call, then look them up and read them back."""
        g = self.geometry
        tokens = tokens_for(g, seed * g.pages * g.page_size)
        hashes = chain_hashes(tokens, None, g.page_size)
        writer = Controller(self.backend, self.pool, self.v1)
        self._keep("set", batch, functools.partial(backup_pages, writer, hashes, batch))
        self.backend.register_mem_pool_host(self.dst)
        reader = Controller(self.backend, self.dst, self.v1)
        self._keep("get", batch, functools.partial(prefetch_pages, reader, tokens, batch))
        self.backend.register_mem_pool_host(self.pool)

    def _keep(self, op: str, batch: int, fn: Callable[[], int]) -> None:
        cpu = _cpu_seconds(self.daemon_pid)
        seconds = timed(fn, self.geometry.pages)
        cpu = _cpu_seconds(self.daemon_pid) - cpu
        nbytes = self.geometry.pages * self.geometry.page_bytes
        key = (op, batch)
        self.best[key] = max(self.best.get(key, 0.0), nbytes / seconds / 1e9)
        self.best_cpu[key] = max(self.best_cpu.get(key, 0.0), nbytes / max(cpu, 1e-6) / 1e9)


def _cpu_seconds(daemon_pid: int) -> float:
    """CPU time of this process, plus the daemon's (from /proc) when there is one."""
    own = time.process_time()
    if not daemon_pid:
        return own
    try:
        fields = Path(f"/proc/{daemon_pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return own
    return own + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_targets(targets: Sequence[_Target], repeat: int) -> None:
    """Every target once per (batch, repeat), back to back: load drift hits all alike."""
    for batch in BATCHES:
        for rep in range(repeat):
            for target in targets:
                target.once(batch, batch * 1000 + rep)


def _run_target(
    target: str, geometry: Geometry, root: Path, endpoint: str, repeat: int
) -> dict[tuple[str, int], float]:
    """GB/s of set and get per batch size for one target alone (best of ``repeat``)."""
    one = _Target(target, geometry, root, endpoint)
    _run_targets([one], repeat)
    close_storage(one.backend)
    return one.best


def _reader_process(
    target: str,
    geometry: Geometry,
    root: str,
    endpoint: str,
    seed: int,
    start: object,
    out: object,
    torch_threads: int,
) -> None:
    """One of 2 reading processes: set up, wait at the ``start`` barrier, read every
    page in calls of 16; put its seconds on ``out``."""
    enter_sglang()
    torch.set_num_threads(torch_threads)
    dst = host_pool(geometry, 3)
    backend = open_storage(target, dst, Path(root), endpoint)
    reader = Controller(backend, dst, target != BASELINE)
    start.wait()  # type: ignore[attr-defined]
    seconds = timed(
        functools.partial(prefetch_pages, reader, tokens_for(geometry, seed), 16), geometry.pages
    )
    out.put(seconds)  # type: ignore[attr-defined]
    close_storage(backend)


def _two_readers(target: str, geometry: Geometry, root: Path, endpoint: str) -> float:
    """Aggregate GB/s of 2 processes reading the same pages at once."""
    seed = 7_000_000
    pool = host_pool(geometry, 1)
    backend = open_storage(target, pool, root, endpoint)
    hashes = chain_hashes(tokens_for(geometry, seed), None, geometry.page_size)
    backup_pages(Controller(backend, pool, target != BASELINE), hashes, 16)
    close_storage(backend)
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(2, timeout=600), ctx.Queue()
    args = (target, geometry, str(root), endpoint, seed, start, out, torch.get_num_threads())
    procs = [ctx.Process(target=_reader_process, args=args) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"a reader process failed on {target}")
    # Both start at the barrier; the pair is done when the slower one is.
    wall = max(out.get(timeout=10) for _ in procs)
    return 2 * geometry.pages * geometry.page_bytes / wall / 1e9


def measure(
    geometry: Geometry, root: Path, repeat: int, daemon_sets: Sequence[str] = ()
) -> list[Row]:
    """Every target's rows, each with the baseline's figure of the same op and batch;
    ``daemon_sets``: ``SECTION.KEY=VALUE`` overrides of the daemons' config."""
    from hicache.bench.common.processes import start_daemon

    config = daemon_config(root)
    ipc = f"ipc://{root / 'daemon.sock'}"
    extra = serve_sets(daemon_sets)
    with (
        start_daemon(config, root / "store-ipc", ipc, extra=extra) as on_ipc,
        start_daemon(config, root / "store-tcp", "tcp://127.0.0.1:0", extra=extra) as on_tcp,
    ):
        targets = [
            _Target(BASELINE, geometry, root, ""),
            _Target("lmdb (in-process)", geometry, root, ""),
            _Target("disk (in-process)", geometry, root, ""),
            _Target("daemon ipc://", geometry, root, on_ipc.endpoint, on_ipc.pid),
            _Target("daemon tcp://", geometry, root, on_tcp.endpoint, on_tcp.pid),
        ]
        _run_targets(targets, repeat)
        for target in targets:
            close_storage(target.backend)
        shared = disk_shared = file_shared = 0.0
        for _ in range(repeat):  # alternating, best of each
            shared = max(shared, _two_readers("daemon", geometry, root, on_ipc.endpoint))
            disk_shared = max(disk_shared, _two_readers("disk", geometry, root, ""))
            file_shared = max(file_shared, _two_readers(BASELINE, geometry, root, ""))
    base, base_cpu = targets[0].best, targets[0].best_cpu
    rows = [
        Row(t.name, op, batch, gbps, base[key], t.best_cpu[key], base_cpu[key])
        for t in targets
        for key, gbps in t.best.items()
        for op, batch in [key]
    ]
    rows.append(Row("daemon ipc://, 2 processes", "get", 16, shared, file_shared))
    rows.append(Row("disk, 2 processes", "get", 16, disk_shared, file_shared))
    return rows


def _print(rows: Sequence[Row], geometry: Geometry) -> None:
    print(
        f"sglang bench: {geometry.pages} pages of {geometry.page_bytes >> 10} KiB "
        f"({geometry.layout}, {geometry.layers} layers × {geometry.heads} kv heads × "
        f"{geometry.head_dim} × {geometry.page_size} tokens, bf16); baseline: {BASELINE}"
    )
    print("  GB/s: wall time; GB/cpu-s: per CPU-second of the caller and the daemon")
    print(
        f"{'target':28} {'op':3} {'pages/call':>10} {'GB/s':>7} {'base GB/s':>10} {'ratio':>6}"
        f" {'GB/cpu-s':>9} {'base':>6} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r.target:28} {r.op:3} {r.pages_per_call:>10} {r.gbps:7.2f} "
            f"{r.baseline_gbps:10.2f} {r.ratio:6.2f} {r.cpu_gbps:9.2f} "
            f"{r.baseline_cpu_gbps:6.2f} {r.cpu_ratio:6.2f}"
        )


def _linker_rows(geometry: Geometry, root: Path, repeat: int) -> list[Row]:
    from hicache.bench.sglang import linker_rows

    return linker_rows.measure(geometry, root, repeat)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.torch_threads)
    try:
        enter_sglang()
        import sglang.srt.mem_cache.hicache_storage  # noqa: F401
    except ImportError as exc:
        print(f"hicache bench sglang needs SGLang's wheel (pip install sglang --no-deps): {exc}")
        return 2
    geometry = Geometry(
        args.pages, args.page_size, args.layers, args.kv_heads, args.head_dim, args.layout
    )
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="hicache-sglang-", dir=args.dir))
    try:
        rows = measure(geometry, root, args.repeat, args.daemon_set)
        linker_rows = _linker_rows(geometry, root, args.repeat) if args.linker else []
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _print(rows, geometry)
    if linker_rows:
        from hicache.bench.sglang.linker_rows import print_rows

        print_rows(linker_rows)
    rows += linker_rows
    if args.json is not None:
        data = [
            {**asdict(r), "ratio": round(r.ratio, 3), "cpu_ratio": round(r.cpu_ratio, 3)}
            for r in rows
        ]
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 0
