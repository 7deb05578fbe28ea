"""``bench storage --backend disk``: the disk backend against the disk's limit and today's ways.

A grid of cells (page size × pages per call × I/O threads). In each cell every
side of ``disk_sides`` stores the same pages into a fresh directory, batch by
batch, the sides alternating batch by batch (each batch starting with the next
side; each read goes into buffers blanked just before it) so that noise from
elsewhere and the caches' warmth hit all alike; then the files are dropped from
the page cache (where the machine allows: ``page_cache``, which says whether it
took effect) and read back once (cold), then once more (warm). The whole round
runs ``--repeat`` times in fresh directories, and each (side, op) keeps its best
round: the machines we run on are shared and their load comes in bursts. Every
read is checked against the written bytes outside the timing. Ratios are of the disk backend
over each baseline in the same cell.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import xxhash

from hicache.bench.common.page_cache import DropResult, drop_page_cache
from hicache.bench.storage.disk_sides import (
    SIDES,
    Pages,
    Side,
    make_pages,
    open_sides,
    remove_sides,
)
from hicache.config.flags import at_least

OPS = ("put", "get cold", "get warm")
DEFAULT_PAGES_KB = (64, 1024)
FULL_PAGES_KB = (16, 64, 1024, 8192)
DEFAULT_BATCHES = (16,)
FULL_BATCHES = (1, 16, 128)
THREADS = (1, 4)


class Cell(NamedTuple):
    page_bytes: int
    batch: int  # pages per call (at most the cell's pages)
    threads: int  # the disk backend's I/O pool (and the raw baseline's threads)


class CellRun(NamedTuple):
    """GB/s of each (side, op) in one cell, wall and per CPU-second, and whether its cold
    read was cold."""

    cell: Cell
    pages: int
    gbps: dict[tuple[str, str], float]
    cpu_gbps: dict[tuple[str, str], float]  # bytes per CPU-second of this process
    drop: DropResult

    def ratio(self, op: str, baseline: str) -> float:
        base = self.gbps[(baseline, op)]
        return self.gbps[("disk", op)] / base if base else 0.0

    def cpu_ratio(self, op: str, baseline: str) -> float:
        base = self.cpu_gbps[(baseline, op)]
        return self.cpu_gbps[("disk", op)] / base if base else 0.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--backend disk (the disk backend's grid)")
    group.add_argument(
        "--full",
        action="store_true",
        help="the whole grid: pages of 16 KiB, 64 KiB, 1 MiB, 8 MiB, 1/16/128 pages a call",
    )
    group.add_argument("--pages-kb", help="page sizes in KiB, comma-separated (default 64,1024)")
    group.add_argument("--batches", help="pages per call, comma-separated (default 16)")
    group.add_argument("--threads", help="I/O threads, comma-separated (default 1,4)")
    group.add_argument(
        "--cell-mb", type=at_least(1), default=32, help="bytes each side stores per cell (MiB)"
    )
    group.add_argument(
        "--plot", type=Path, help="also draw the GB/s of every side here (PNG; default: no plot)"
    )


def _ints(text: str | None, default: Sequence[int]) -> tuple[int, ...]:
    if not text:
        return tuple(default)
    values = tuple(int(part) for part in text.split(",") if part.strip())
    if not values or min(values) < 1:
        raise SystemExit(f"expected positive integers, comma-separated: {text!r}")
    return values


def cells(args: argparse.Namespace) -> list[Cell]:
    pages_kb = _ints(args.pages_kb, FULL_PAGES_KB if args.full else DEFAULT_PAGES_KB)
    batches = _ints(args.batches, FULL_BATCHES if args.full else DEFAULT_BATCHES)
    threads = _ints(args.threads, THREADS)
    cell_bytes = args.cell_mb << 20
    out = []
    for kb in pages_kb:
        count = max(1, cell_bytes // (kb << 10))
        for batch in dict.fromkeys(min(b, count) for b in batches):
            out += [Cell(kb << 10, batch, t) for t in threads]
    return out


class _Spent(NamedTuple):
    wall: float
    cpu: float


def _pass(
    sides: list[Side],
    pages: Pages,
    batch: int,
    action: Callable[[Side, slice], None],
    check: Callable[[slice, str], None],
) -> dict[str, _Spent]:
    """Wall and CPU seconds (this process, all its threads) each side spent, the sides
    alternating batch by batch, each batch starting with the next side (the first side
    after another batch's calls runs with colder caches: up to 1.25x the CPU time of the
    same code run second, measured on puts); ``check`` runs before (who: "") and after
    each side's call, outside the timing."""
    spent = {side.name: _Spent(0.0, 0.0) for side in sides}
    for n, start in enumerate(range(0, len(pages.keys), batch)):
        span = slice(start, start + batch)
        first = n % len(sides)
        for side in sides[first:] + sides[:first]:
            check(span, "")
            began, cpu = time.perf_counter(), time.process_time()
            action(side, span)
            wall, cpu = time.perf_counter() - began, time.process_time() - cpu
            spent[side.name] = _Spent(spent[side.name].wall + wall, spent[side.name].cpu + cpu)
            check(span, side.name)
    return spent


def _read_checker(pages: Pages) -> Callable[[slice, str], None]:
    """Before a read (``who`` empty): blank the destinations, so that every side writes
    into buffers just touched (in the CPU's cache), not only the sides after the first
    (the first side paid for cold buffers: 64 KiB pages x 16, 2.8 GB/s of CPU time instead of 3.9).
    After a read: the bytes must be the written ones."""
    blank = bytes(pages.page_bytes)

    def check(span: slice, who: str) -> None:
        if not who:
            for view in pages.dst[span]:
                view[:] = blank
            return
        got = [xxhash.xxh3_64_intdigest(view) for view in pages.dst[span]]
        if got != pages.digests[span]:
            raise RuntimeError(f"{who} read returned different bytes")

    return check


def _nothing(span: slice, who: str) -> None:
    pass


class _Round(NamedTuple):
    seconds: dict[tuple[str, str], _Spent]
    drop: DropResult


def _one_round(cell: Cell, root: Path, pages: Pages) -> _Round:
    """Fresh stores: put everything, drop the page cache, read once cold, once warm."""
    sides = open_sides(root, pages, cell.threads)
    check = _read_checker(pages)
    try:
        os.sync()  # no writeback of earlier work during the timed puts
        put = _pass(sides, pages, cell.batch, lambda s, span: s.put(span), _nothing)
        for side in sides:
            side.close()  # a mapped file (LMDB) cannot be dropped from the page cache
        drop = drop_page_cache(root)
        for side in sides:
            side.reopen()
        cold = _pass(sides, pages, cell.batch, lambda s, span: s.get(span), check)
        warm = _pass(sides, pages, cell.batch, lambda s, span: s.get(span), check)
    finally:
        remove_sides(sides)
    seconds: dict[tuple[str, str], _Spent] = {}
    for name in SIDES:
        seconds |= {(name, "put"): put[name], (name, "get cold"): cold[name]}
        seconds[(name, "get warm")] = warm[name]
    return _Round(seconds, drop)


def measure_cell(cell: Cell, root: Path, cell_bytes: int, repeat: int) -> CellRun:
    """The best of ``repeat`` rounds for each (side, op): this machine's load comes in bursts."""
    pages = make_pages(cell.page_bytes, max(1, cell_bytes // cell.page_bytes))
    rounds = [_one_round(cell, root / f"round-{k}", pages) for k in range(repeat)]
    total = pages.total_bytes / 1e9
    keys = rounds[0].seconds
    gbps = {key: total / min(r.seconds[key].wall for r in rounds) for key in keys}
    cpu = {key: total / max(1e-9, min(r.seconds[key].cpu for r in rounds)) for key in keys}
    drops = [r.drop for r in rounds]
    cold = next((d for d in drops if not d.took_effect), drops[0])  # the worst says it
    return CellRun(cell, len(pages.keys), gbps, cpu, cold)


def _cold_note(drop: DropResult) -> str:
    if drop.took_effect:
        return "dropped"
    if drop.resident_after is None:
        return "NOT dropped (no fadvise/mincore here)"
    share = drop.resident_after / drop.nbytes if drop.nbytes else 0.0
    return f"NOT dropped ({share:.0%} still cached)"


def _size(page_bytes: int) -> str:
    return f"{page_bytes >> 10} KiB" if page_bytes < 1 << 20 else f"{page_bytes >> 20} MiB"


def _row(run: CellRun, op: str) -> str:
    c = run.cell
    base = " ".join(f"{run.gbps[(name, op)]:6.2f}" for name in SIDES[1:])
    wall = " ".join(f"{run.ratio(op, name):5.2f}" for name in SIDES[1:])
    cpu = " ".join(f"{run.cpu_ratio(op, name):5.2f}" for name in SIDES[1:])
    note = _cold_note(run.drop) if op == "get cold" else ""
    head = f"{_size(c.page_bytes):>8} {c.batch:>5} {c.threads:>3} {op:8}"
    return f"{head} {run.gbps[('disk', op)]:9.2f} {base} | {wall} | {cpu}  {note}"


def print_tables(runs: list[CellRun], args: argparse.Namespace) -> None:
    print(f"disk backend grid: {args.cell_mb} MiB per side per cell, no side fsyncs (sync=none)")
    print("  sides: disk (I/O threads = threads), raw pwrite/preadv into one preallocated file")
    print("  (same threads: the limit), lmdb backend, one file per page + rename (HiCacheFile)")
    print("  cold: page cache dropped before the first read; warm: the read after it")
    print(f"  each figure: best of {args.repeat} rounds, each round in fresh stores")
    print("  ratios: disk over each baseline, by wall time, then by CPU time of this process")
    print("  (CPU ratios are steadier on a loaded machine; cold reads wait on the disk, not CPU)")
    names = " ".join(f"{'/' + n[:4]:>5}" for n in SIDES[1:])
    head = f"{'page':>8} {'batch':>5} {'thr':>3} {'op':8} {'disk GB/s':>9}"
    print(f"{head} {'raw':>6} {'lmdb':>6} {'file':>6} | {names} | {names}  cold")
    for run in runs:
        for op in OPS:
            print(_row(run, op))
    if not all(run.drop.took_effect for run in runs):
        print("  the page cache could NOT be dropped in some cells: their cold reads are warm")


def as_json(runs: list[CellRun]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for run in runs:
        for op in OPS:
            rows.append(
                {
                    **run.cell._asdict(),
                    "pages": run.pages,
                    "op": op,
                    "gbps": {name: round(run.gbps[(name, op)], 3) for name in SIDES},
                    "ratio": {name: round(run.ratio(op, name), 3) for name in SIDES[1:]},
                    "cpu_gbps": {name: round(run.cpu_gbps[(name, op)], 3) for name in SIDES},
                    "cpu_ratio": {name: round(run.cpu_ratio(op, name), 3) for name in SIDES[1:]},
                    "page_cache_dropped": run.drop.took_effect if op == "get cold" else None,
                }
            )
    return rows


def plot(runs: list[CellRun], path: Path) -> bool:
    """GB/s of every side, one panel per op; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{r.cell.page_bytes >> 10}K×{r.cell.batch}\n{r.cell.threads}t" for r in runs]
    fig, axes = plt.subplots(len(OPS), 1, figsize=(max(6, len(runs) * 1.2), 9), sharex=True)
    width = 0.8 / len(SIDES)
    for ax, op in zip(axes, OPS, strict=True):
        for k, name in enumerate(SIDES):
            xs = [i + k * width for i in range(len(runs))]
            ax.bar(xs, [r.gbps[(name, op)] for r in runs], width, label=name)
        ax.set_ylabel(f"{op} GB/s")
    axes[0].legend(ncol=len(SIDES), fontsize="small")
    axes[-1].set_xticks([i + 0.4 - width / 2 for i in range(len(runs))], labels, fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def run(args: argparse.Namespace) -> int:
    grid = cells(args)
    runs = []
    with tempfile.TemporaryDirectory(prefix="hicache-disk-bench-", dir=args.dir) as scratch:
        for i, cell in enumerate(grid):
            root = Path(scratch) / f"cell-{i}"
            runs.append(measure_cell(cell, root, args.cell_mb << 20, args.repeat))
    print_tables(runs, args)
    if args.json is not None:
        args.json.write_text(json.dumps(as_json(runs), indent=2) + "\n")
    if args.plot is not None:
        drawn = plot(runs, args.plot)
        print(f"plot: {args.plot}" if drawn else "no plot: matplotlib is not installed")
    return 0
