"""Storage backend batch put/get throughput against the plain way of storing the same bytes.

``--backend disk`` (the default, as ``disk`` is the default store) runs the disk backend's
grid (``hicache.bench.storage.disk_grid``). With another backend, for each page size
(64 KiB, 512 KiB, 2 MiB) the same pages are written through the backend in batches and
through the baseline, then read back in batches into preallocated buffers. The baseline of
the on-disk backends is one file per page (``open``/``write``, ``readinto``); both sides
read warm data (just written, in the OS page cache), so the comparison is of the code
paths, not of the disk. The baseline of ``redis`` is redis-py's client doing plain SET/GET
of the same bytes (see ``hicache.bench.storage.targets``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import xxhash

from hicache.bench.storage import disk_grid
from hicache.bench.storage import targets as storage_targets
from hicache.bench.storage.targets import Target, open_target
from hicache.config.flags import at_least
from storage_backends import StorageBackend, create

PAGE_SIZES = (64 << 10, 512 << 10, 2 << 20)


class Result(NamedTuple):
    backend: str
    op: str
    page_bytes: int
    gbps: float
    baseline_gbps: float

    @property
    def ratio(self) -> float:
        return self.gbps / self.baseline_gbps if self.baseline_gbps else 0.0

    def as_dict(self) -> dict[str, str | int | float]:
        return {
            "backend": self.backend,
            "op": self.op,
            "page_bytes": self.page_bytes,
            "gbps": round(self.gbps, 3),
            "baseline_gbps": round(self.baseline_gbps, 3),
            "ratio": round(self.ratio, 3),
        }


class Workload(NamedTuple):
    keys: list[bytes]
    src: list[memoryview]
    dst: list[memoryview]
    digests: list[int]
    batch: int

    @property
    def total_bytes(self) -> int:
        return sum(len(view) for view in self.src)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=("lmdb", "file", "redis", "mooncake", "disk"),
        default="disk",
        help="the store measured (disk, the default store: a grid against raw pwritev/preadv "
        "with and without xxh3, lmdb and one file per page, see its flags below; the others: "
        "against their plain baseline)",
    )
    parser.add_argument(
        "--json", type=Path, help="write the results as a JSON list here (default: print only)"
    )
    parser.add_argument("--dir", type=Path, help="scratch directory (default: a temp dir)")
    parser.add_argument(
        "--total-mb", type=at_least(1), default=256, help="bytes per page size (MiB)"
    )
    parser.add_argument(
        "--batch-mb", type=at_least(1), default=16, help="bytes per batch call (MiB)"
    )
    parser.add_argument(
        "--repeat", type=at_least(1), default=3, help="timed reads; the best counts"
    )
    parser.add_argument("--no-sync", action="store_true", help="do not fsync backend write batches")
    storage_targets.add_arguments(parser)
    disk_grid.add_arguments(parser)


def _workload(page_bytes: int, total_bytes: int, batch_bytes: int) -> Workload:
    count = max(1, total_bytes // page_bytes)
    source = memoryview(os.urandom(count * page_bytes))
    target = memoryview(bytearray(count * page_bytes))
    spans = [slice(i * page_bytes, (i + 1) * page_bytes) for i in range(count)]
    keys = [hashlib.sha256(f"bench-{page_bytes}-{i}".encode()).digest() for i in range(count)]
    src = [source[s] for s in spans]
    digests = [xxhash.xxh3_64_intdigest(view) for view in src]
    batch = max(1, batch_bytes // page_bytes)
    return Workload(keys, src, [target[s] for s in spans], digests, batch)


class SideTimes(NamedTuple):
    backend_s: float
    baseline_s: float


def _no_check(span: slice, what: str) -> None:
    pass


def _interleaved(
    work: Workload,
    backend: Callable[[slice], None],
    baseline: Callable[[slice], None],
    check: Callable[[slice, str], None] = _no_check,
) -> SideTimes:
    """One pass of each side, alternating batch by batch, so that load from elsewhere on
    the machine hits both alike; each side's time is the sum of its batches.
    ``check(span, what)`` runs after each batch, outside the timing."""
    spent = [0.0, 0.0]
    for start in range(0, len(work.keys), work.batch):
        span = slice(start, start + work.batch)
        for side, (what, action) in enumerate((("backend", backend), ("baseline", baseline))):
            began = time.perf_counter()
            action(span)
            spent[side] += time.perf_counter() - began
            check(span, what)
    return SideTimes(spent[0], spent[1])


def _best_reads(
    work: Workload,
    backend: Callable[[slice], None],
    baseline: Callable[[slice], None],
    repeat: int,
) -> SideTimes:
    """Fastest of ``repeat`` interleaved read passes; every batch lands in cleared
    (faulted-in) buffers and is checked, both outside the timing."""
    blank = bytes(len(work.dst[0]))

    def check(span: slice, what: str) -> None:
        if [xxhash.xxh3_64_intdigest(view) for view in work.dst[span]] != work.digests[span]:
            raise RuntimeError(f"{what} read returned different bytes")
        for view in work.dst[span]:
            view[:] = blank

    for view in work.dst:
        view[:] = blank
    passes = [_interleaved(work, backend, baseline, check) for _ in range(repeat)]
    return SideTimes(min(p.backend_s for p in passes), min(p.baseline_s for p in passes))


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def _backend_put(store: StorageBackend, work: Workload, span: slice) -> None:
    ok = store.put(work.keys[span], work.src[span])
    if not all(ok):
        raise RuntimeError(f"backend put failed for {ok.count(False)} pages")


def _backend_get(store: StorageBackend, work: Workload, span: slice) -> None:
    hits = store.get(work.keys[span], work.dst[span])
    if not all(hits):
        raise RuntimeError(f"backend get missed {hits.count(False)} pages")


def _measure(args: argparse.Namespace, target: Target, page_bytes: int) -> list[Result]:
    work = _workload(page_bytes, args.total_mb << 20, args.batch_mb << 20)
    config = target.config(page_bytes, 2 * work.total_bytes + (64 << 20), not args.no_sync)
    plain = target.baseline
    store = create(args.backend, config)
    try:
        plain.prepare(work)
        os.sync()  # no writeback from earlier work during the timed puts
        puts = _interleaved(
            work, lambda span: _backend_put(store, work, span), lambda span: plain.write(work, span)
        )
        reads = _best_reads(
            work,
            lambda span: _backend_get(store, work, span),
            lambda span: plain.read(work, span),
            args.repeat,
        )
    finally:
        if not config.path:
            store.delete(work.keys)  # a network store keeps nothing between page sizes
        store.close()
        if config.path:
            shutil.rmtree(config.path)
        plain.clear(work)
    total = work.total_bytes
    return [
        Result(args.backend, op, page_bytes, _gbps(total, t.backend_s), _gbps(total, t.baseline_s))
        for op, t in (("put", puts), ("get", reads))
    ]


def _print_table(results: list[Result], args: argparse.Namespace, baseline: str) -> None:
    print(f"storage bench: backend={args.backend}, {args.total_mb} MiB per page size,")
    print(f"  batches of {args.batch_mb} MiB, backend sync={not args.no_sync}")
    print(f"  baseline: {baseline}")
    print("  dirty pages are flushed (os.sync) before each timed write phase, outside the timing")
    print(
        f"  both sides read warm data (just written, in the OS page cache); best of {args.repeat}"
    )
    print("  puts and reads alternate between the backend and the baseline, batch by batch")
    print(f"{'backend':8} {'op':4} {'page':>8} {'GB/s':>7} {'base GB/s':>10} {'ratio':>6}")
    for r in results:
        page = f"{r.page_bytes >> 10} KiB"
        print(
            f"{r.backend:8} {r.op:4} {page:>8} {r.gbps:7.2f} {r.baseline_gbps:10.2f} {r.ratio:6.2f}"
        )


def run(args: argparse.Namespace) -> int:
    if args.backend == "disk":
        return disk_grid.run(args)
    with (
        tempfile.TemporaryDirectory(prefix="hicache-bench-", dir=args.dir) as scratch,
        open_target(args, Path(scratch)) as target,
    ):
        results = [r for size in PAGE_SIZES for r in _measure(args, target, size)]
    _print_table(results, args, target.baseline.description)
    if args.json is not None:
        args.json.write_text(json.dumps([r.as_dict() for r in results], indent=2) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
