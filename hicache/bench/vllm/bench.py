"""vLLM's secondary-tier store and load jobs through HicacheTier against vLLM's own fs tier.

Both tiers are built by vLLM's ``SecondaryTierFactory`` over the same CPU
primary-tier buffer, in one run, on the same disk (``--dir``). For each job
size (1, 8, 64 chunks a job) every tier stores ``--chunks`` fresh chunks
(all jobs submitted at once, as a busy scheduler does, then collected), then
loads them back into other primary slots, and the loaded bytes are checked.
GB/s is chunk bytes moved over the wall time from the first submit to the
last completion, the best of ``--repeat`` rounds (the tiers alternated in each,
fresh chunks every round). Targets (issue 24): LMDB >= 1.0x fs, the daemon on ipc://
>= 0.7x fs; (issue 35) the disk backend >= 1.0x fs on every cell. Needs
vLLM's wheel (``make test`` installs it).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from hicache.bench.common.processes import add_daemon_set_flag
from hicache.config.flags import at_least

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadKey

    from hicache.integrations.vllm_cpu import PrimaryBuffer, TierDriver

JOB_SIZES = (1, 8, 64)
SHM_BYTES = 1 << 30  # the daemon-shm target's slab


class DaemonArgs(NamedTuple):
    """The daemon the daemon targets run: a config (shipped name or TOML path) and
    ``SECTION.KEY=VALUE`` overrides of it."""

    config: str
    sets: tuple[str, ...] = ()

    @classmethod
    def of(cls, daemon: DaemonArgs | str) -> DaemonArgs:
        return daemon if isinstance(daemon, DaemonArgs) else cls(daemon)


class Row(NamedTuple):
    """One (target, operation, chunks per job) measurement."""

    target: str
    op: str
    per_job: int
    gbps: float
    ratio: float  # over vLLM's fs tier on the same jobs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--chunk-kb", type=at_least(4), default=1024, help="bytes per chunk, in KiB"
    )
    parser.add_argument(
        "--chunks", type=at_least(1), default=128, help="chunks stored and loaded per job size"
    )
    parser.add_argument("--dir", default="", help="where the stores go (default: a temp dir)")
    parser.add_argument(
        "--targets",
        default="lmdb,disk,daemon-ipc,daemon-shm,daemon-tcp",
        help="comma-separated: lmdb, disk, daemon-ipc, daemon-shm (ipc through the daemon's "
        "shared memory), daemon-tcp",
    )
    parser.add_argument("--workers", type=at_least(1), default=8, help="HicacheTier I/O threads")
    parser.add_argument(
        "--repeat",
        type=at_least(1),
        default=3,
        help="rounds, the tiers alternated in each (fresh chunks every round); the best counts",
    )
    parser.add_argument(
        "--daemon-config",
        default="daemon",
        help="the daemon's config (shipped name or TOML; `daemon`: store.sync = index, "
        "which fsyncs each commit of an lmdb store)",
    )
    add_daemon_set_flag(
        parser,
        "override one field of --daemon-config (repeatable; default: none), e.g. "
        "store.backend=disk or store.sync=none",
    )
    parser.add_argument(
        "--json", default="", help="also write the rows to this JSON file (default: print only)"
    )


def run(args: argparse.Namespace) -> int:
    from hicache.integrations.vllm_cpu import enter_vllm

    enter_vllm()
    for name in ("vllm", "hicache.integrations.vllm"):
        logging.getLogger(name).setLevel(logging.WARNING)
    chunk = args.chunk_kb * 1024
    if chunk % 4096 or args.chunks < max(JOB_SIZES):
        raise SystemExit(f"--chunk-kb must be a multiple of 4, --chunks >= {max(JOB_SIZES)}")
    targets = [t for t in args.targets.split(",") if t]
    unknown = set(targets) - {"lmdb", "disk", "daemon-ipc", "daemon-shm", "daemon-tcp"}
    if unknown:
        raise SystemExit(f"unknown targets {sorted(unknown)}")
    with ExitStack() as stack:
        root = (
            Path(args.dir) if args.dir else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        )
        root.mkdir(parents=True, exist_ok=True)
        daemon = DaemonArgs(args.daemon_config, tuple(args.daemon_set))
        rows = measure(
            root, chunk, args.chunks, targets, args.workers, daemon, stack, repeat=args.repeat
        )
    report(rows, chunk)
    if args.json:
        Path(args.json).write_text(json.dumps([r._asdict() for r in rows], indent=2))
    return 0


def measure(
    root: Path,
    chunk: int,
    count: int,
    targets: list[str],
    workers: int,
    daemon: DaemonArgs | str,
    stack: ExitStack,
    repeat: int = 1,
) -> list[Row]:
    """Every target's store and load GB/s per job size (best of ``repeat`` rounds, the
    tiers alternated within each so that load drift hits all alike), with its ratio
    over fs; ``daemon``: the daemon's config (a name or TOML path, or with overrides)."""
    import numpy as np

    from hicache.integrations.vllm_cpu import PrimaryBuffer, cpu_offloading_spec

    _empty_stores(root, targets)
    primary = PrimaryBuffer(2 * count, chunk)
    primary.array[:] = np.random.default_rng(0).integers(0, 256, primary.array.shape, np.uint8)
    spec = cpu_offloading_spec(chunk, 2 * count, model="bench/vllm")
    configs: dict[str, dict[str, object]] = {"fs": {"type": "fs", "root_dir": str(root / "fs")}}
    for target in targets:
        configs[target] = _tier_config(target, root, workers, DaemonArgs.of(daemon), stack)
    speeds: dict[tuple[str, str, int], float] = {}
    for per_job in JOB_SIZES:
        for rnd in range(repeat):
            for name, config in configs.items():
                prefix = f"{name}-{per_job}-{rnd}"
                with _tier(config, primary, spec) as driver:
                    store, load = _one_size(driver, primary, chunk, count, per_job, prefix)
                for op, gbps in (("store", store), ("load", load)):
                    speeds[(name, op, per_job)] = max(gbps, speeds.get((name, op, per_job), 0.0))
    return [
        Row(name, op, per_job, gbps, gbps / speeds[("fs", op, per_job)])
        for (name, op, per_job), gbps in speeds.items()
    ]


def _empty_stores(root: Path, targets: list[str]) -> None:
    """Remove the stores an earlier run left under ``root`` (``--dir``): a store that holds
    the chunks already would make their store jobs measure nothing."""
    for name in ("fs", *targets, *(f"{t}-store" for t in targets)):
        shutil.rmtree(root / name, ignore_errors=True)


def _tier_config(
    target: str, root: Path, workers: int, daemon: DaemonArgs, stack: ExitStack
) -> dict[str, object]:
    ours: dict[str, object] = {
        "type": "HicacheTier",
        "module_path": "hicache.integrations.vllm",
        "workers": workers,
    }
    if target in ("lmdb", "disk"):
        local = {"backend": target, "path": str(root / target), "sync": False}
        return {**ours, "hicache_config": "default", **local}
    from hicache.bench.common.processes import serve_sets, start_daemon

    sockets = {"daemon-ipc": f"ipc://{root}/daemon.sock", "daemon-shm": f"ipc://{root}/shm.sock"}
    endpoint = sockets.get(target, "tcp://127.0.0.1:0")
    store, extra = root / f"{target}-store", serve_sets(daemon.sets)
    shm = target == "daemon-shm"
    if shm:  # the slab needs the ipc endpoint in the config it is checked against
        extra += ["--set", f"server.endpoint={endpoint}", "--set", f"server.shm_bytes={SHM_BYTES}"]
    server = stack.enter_context(start_daemon(daemon.config, store, endpoint, extra=extra))
    return {**ours, "hicache_config": "remote", "endpoint": server.endpoint, "shm": shm}


@contextmanager
def _tier(config: dict[str, object], primary: PrimaryBuffer, spec: object) -> Iterator[TierDriver]:
    from hicache.integrations.vllm_cpu import TierDriver, create_tier

    tier = create_tier(config, primary, spec)  # type: ignore[arg-type]
    try:
        yield TierDriver(tier, timeout_s=120.0)
    finally:
        tier.shutdown()


def _keys(prefix: str, count: int) -> list[OffloadKey]:
    import hashlib

    from vllm.v1.kv_offload.base import make_offload_key

    return [
        make_offload_key(hashlib.sha256(f"{prefix}/{i}".encode()).digest(), 0) for i in range(count)
    ]


def _one_size(
    driver: TierDriver, primary: PrimaryBuffer, chunk: int, count: int, per_job: int, prefix: str
) -> tuple[float, float]:
    """(store GB/s, load GB/s) for ``count`` chunks in jobs of ``per_job``."""
    keys = _keys(prefix, count)
    src = list(range(count))
    dst = list(range(count, 2 * count))
    expected = primary.array[:count].copy()
    primary.array[count:] = 0
    store_s = _timed(lambda: driver.jobs(_batches(keys, src, per_job), False))
    load_s = _timed(lambda: driver.jobs(_batches(keys, dst, per_job), True))
    if not (primary.array[count:] == expected).all():
        raise SystemExit(f"{prefix}: loaded bytes differ from the stored ones")
    total = count * chunk / 1e9
    return total / store_s, total / load_s


def _batches(
    keys: list[OffloadKey], slots: list[int], per_job: int
) -> list[tuple[list[OffloadKey], list[int]]]:
    return [(keys[i : i + per_job], slots[i : i + per_job]) for i in range(0, len(keys), per_job)]


def _timed(jobs: Callable[[], Sequence[object]]) -> float:
    started = time.perf_counter()
    results = jobs()
    elapsed = time.perf_counter() - started
    failed = [r for r in results if not getattr(r, "success", False)]
    if failed:
        raise SystemExit(f"{len(failed)} of {len(results)} jobs failed")
    return elapsed


def report(rows: list[Row], chunk: int) -> None:
    print(f"vLLM secondary tier jobs, {chunk // 1024} KiB chunks; ratio = over vLLM's fs tier")
    print(f"{'target':<12}{'op':<7}{'chunks/job':>11}{'GB/s':>9}{'ratio':>8}")
    for r in sorted(rows, key=lambda r: (r.op, r.per_job, r.target != "fs", r.target)):
        print(f"{r.target:<12}{r.op:<7}{r.per_job:>11}{r.gbps:>9.2f}{r.ratio:>7.2f}x")
