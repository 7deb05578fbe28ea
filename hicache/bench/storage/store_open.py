"""Open time, index bytes per page and RSS of local stores of 10k to 10M pages, cold and warm.

Each backend's store grows to every ``--sizes`` count in turn (small pages, so
that 10M pages fit on a test machine). At each size the store is closed
cleanly, its files are dropped from the page cache (where the machine allows:
``page_cache`` says whether it did) and a fresh process opens it (cold), then
``--repeat`` more fresh processes do (warm, the best counts). Each process
reports the open's wall time, its first ``get`` of a few pages, and its resident
memory before and after the open: what a process holding the store open pays.

With ``--unclean`` a process then opens the store and is killed (SIGKILL), so
that no clean-close marker is left, and the open after that crash (page cache
dropped) is timed too: the index check it runs is bounded by the index's size.
Filling uses the backend's own ``put`` in large batches (``--fill-batch``), each
batch's keys in sorted order, which the index takes fastest; the keys stay sha256
digests, spread over the whole key space as real page keys are.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import select
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from hicache.bench.common.page_cache import drop_page_cache
from hicache.config.flags import at_least
from storage_backends import StorageConfig, create

DEFAULT_SIZES = (10_000, 100_000)
DEFAULT_FILL_BATCH = 16384
_PROBES = 16
_HOLD_WAIT_S = 3600.0  # the crashed holder's open (an index check of a big store included)
_INDEX_ROOM = 1024  # bytes of index map per page (an entry, its recency, B-tree pages)
# The opening process: prints one JSON line (times in seconds, RSS in KiB).
_CHILD = textwrap.dedent(
    """
    import hashlib, importlib, json, sys, time
    from storage_backends import StorageConfig, create
    from storage_backends.builtins import BUILTIN_BACKENDS

    def rss_kib():
        with open("/proc/self/status") as f:
            return int(next(l for l in f if l.startswith("VmRSS:")).split()[1])

    spec = json.loads(sys.argv[1])
    importlib.import_module(BUILTIN_BACKENDS[spec["backend"]].split(":")[0])  # not the open's
    before = rss_kib()
    began = time.perf_counter()
    store = create(spec["backend"], StorageConfig(**spec["config"]))
    opened = time.perf_counter() - began
    after_open = rss_kib()
    step = max(1, spec["pages"] // spec["probes"])
    keys = [hashlib.sha256(f"open-bench-{i}".encode()).digest()
            for i in range(0, spec["pages"], step)][: spec["probes"]]
    dst = [memoryview(bytearray(spec["page_bytes"])) for _ in keys]
    began = time.perf_counter()
    hits = store.get(keys, dst)
    first_get = time.perf_counter() - began
    store.close()
    print(json.dumps(dict(open_s=opened, first_get_s=first_get, hits=sum(hits),
                          probes=len(keys), rss_before_kib=before, rss_open_kib=after_open)))
    """
)

# A process that opens the store, says so, and waits to be killed (no clean close).
_HOLDER = textwrap.dedent(
    """
    import json, sys
    from storage_backends import StorageConfig, create

    spec = json.loads(sys.argv[1])
    store = create(spec["backend"], StorageConfig(**spec["config"]))
    print("open", flush=True)
    sys.stdin.read()  # until killed
    """
)


class OpenFigure(NamedTuple):
    backend: str
    pages: int
    index_bytes_per_page: float  # the LMDB file that must be read to find a page
    store_bytes_per_page: float  # everything in the store directory
    cold_open_s: float
    warm_open_s: float
    cold_first_get_s: float
    rss_open_mib: float  # resident memory of the process after opening
    rss_growth_mib: float  # what the open added to it
    page_cache_dropped: bool
    fill_pages_per_s: float  # how fast the bench's puts grew the store to this size
    unclean_open_s: float | None  # cold open after a holder was killed (``--unclean``)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backends", default="disk,lmdb", help="comma-separated: disk, lmdb (default both)"
    )
    parser.add_argument(
        "--sizes",
        default=",".join(str(n) for n in DEFAULT_SIZES),
        help="page counts, comma-separated, ascending (the issue's: 10000,100000,1000000,10000000)",
    )
    parser.add_argument("--page-bytes", type=at_least(1), default=512, help="bytes per page")
    parser.add_argument("--repeat", type=at_least(1), default=3, help="warm opens; the best counts")
    parser.add_argument(
        "--fill-batch",
        type=at_least(1),
        default=DEFAULT_FILL_BATCH,
        help="pages a put while filling",
    )
    parser.add_argument(
        "--unclean",
        action="store_true",
        help="also time the cold open after a process holding the store was killed",
    )
    parser.add_argument("--dir", type=Path, help="where the stores go (default: a temp dir)")
    parser.add_argument(
        "--json", type=Path, help="also write the rows here as JSON (default: print only)"
    )


def _key(i: int) -> bytes:
    return hashlib.sha256(f"open-bench-{i}".encode()).digest()


def _config(backend: str, root: Path, pages: int, page_bytes: int) -> StorageConfig:
    room = int(pages * (page_bytes + 128) * 1.5) + (256 << 20)
    # disk sizes its index's map for pages of 4 KiB and more; these are smaller.
    index = pages * _INDEX_ROOM + (64 << 20) if backend == "disk" else 0
    return StorageConfig(
        backend=backend, path=str(root), max_bytes=room, map_size=index, sync=False
    )


def _fill(config: StorageConfig, start: int, stop: int, page_bytes: int, batch: int) -> float:
    """Put pages ``start`` to ``stop`` (one payload for all); return pages a second."""
    payload = memoryview(os.urandom(page_bytes))
    began = time.perf_counter()
    store = create(config.backend, config)
    try:
        for first in range(start, stop, batch):
            keys = sorted(_key(i) for i in range(first, min(stop, first + batch)))
            ok = store.put(keys, [payload] * len(keys))
            if not all(ok):
                raise RuntimeError(f"{config.backend}: {ok.count(False)} pages not stored")
    finally:
        store.close()
    return (stop - start) / max(time.perf_counter() - began, 1e-9)


def _spec(config: StorageConfig, pages: int, page_bytes: int) -> str:
    fields = {"backend": config.backend, "path": config.path, "max_bytes": config.max_bytes}
    spec = {
        "backend": config.backend,
        "config": {**fields, "sync": config.sync, "map_size": config.map_size},
        "pages": pages,
        "page_bytes": page_bytes,
        "probes": _PROBES,
    }
    return json.dumps(spec)


def _child_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def _open_in_child(config: StorageConfig, pages: int, page_bytes: int) -> dict[str, float]:
    """Open the store in a fresh process; its figures (see ``_CHILD``)."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, _spec(config, pages, page_bytes)],
        capture_output=True,
        text=True,
        timeout=3600,
        env=_child_env(),
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"opening {config.path} failed: {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    if result["hits"] != result["probes"]:
        raise RuntimeError(f"{config.backend}: {result['hits']} of {result['probes']} pages served")
    return result


def _crash_holder(config: StorageConfig, pages: int, page_bytes: int) -> None:
    """Open the store in a process and SIGKILL it once it is open: no clean close."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, _spec(config, pages, page_bytes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_child_env(),
    )
    try:
        out = holder.stdout
        if out is None or not select.select([out], [], [], _HOLD_WAIT_S)[0]:
            raise RuntimeError(f"the holder of {config.path} did not open it in time")
        if out.readline().strip() != "open":
            raise RuntimeError(f"the holder of {config.path} could not open it")
    finally:
        holder.kill()
        holder.wait(timeout=60)


def _index_file(backend: str, root: Path) -> Path:
    return root / "index" / "data.mdb" if backend == "disk" else root / "data.mdb"


def _bytes_on_disk(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def measure(
    backend: str, root: Path, sizes: list[int], args: argparse.Namespace
) -> Iterator[OpenFigure]:
    """Grow one store through ``sizes`` and open it cold and warm at each."""
    stored = 0
    for pages in sizes:
        config = _config(backend, root, sizes[-1], args.page_bytes)
        fill_rate = _fill(config, stored, pages, args.page_bytes, args.fill_batch)
        stored = pages
        drop = drop_page_cache(root)
        cold = _open_in_child(config, pages, args.page_bytes)
        warm = min(
            (_open_in_child(config, pages, args.page_bytes) for _ in range(args.repeat)),
            key=lambda r: r["open_s"],
        )
        unclean = None
        if args.unclean:
            _crash_holder(config, pages, args.page_bytes)
            drop_page_cache(root)
            unclean = _open_in_child(config, pages, args.page_bytes)["open_s"]
        yield OpenFigure(
            backend,
            pages,
            _index_file(backend, root).stat().st_size / pages,
            _bytes_on_disk(root) / pages,
            cold["open_s"],
            warm["open_s"],
            cold["first_get_s"],
            cold["rss_open_kib"] / 1024,
            (cold["rss_open_kib"] - cold["rss_before_kib"]) / 1024,
            drop.took_effect,
            fill_rate,
            unclean,
        )


def print_header(page_bytes: int) -> None:
    print(f"store open: pages of {page_bytes} B, each open in a fresh process")
    print("  cold: page cache dropped first (when it could not be, the row says so); warm: best")
    print("  unclean: cold open after a process holding the store was killed (SIGKILL)")
    print(
        f"{'backend':8} {'pages':>11} {'index B/pg':>10} {'store B/pg':>10} {'cold open s':>11} "
        f"{'warm open s':>11} {'1st get s':>9} {'RSS MiB':>8} {'+open MiB':>9} "
        f"{'unclean s':>9} {'fill pg/s':>9}  cold",
        flush=True,
    )


def print_row(f: OpenFigure) -> None:
    unclean = "-" if f.unclean_open_s is None else f"{f.unclean_open_s:.3f}"
    print(
        f"{f.backend:8} {f.pages:>11,} {f.index_bytes_per_page:10.1f} "
        f"{f.store_bytes_per_page:10.1f} {f.cold_open_s:11.3f} {f.warm_open_s:11.3f} "
        f"{f.cold_first_get_s:9.4f} {f.rss_open_mib:8.1f} {f.rss_growth_mib:9.1f} "
        f"{unclean:>9} {f.fill_pages_per_s:9,.0f}  "
        f"{'dropped' if f.page_cache_dropped else 'NOT dropped'}",
        flush=True,
    )


def print_summary(figures: list[OpenFigure]) -> None:
    for backend in dict.fromkeys(f.backend for f in figures):
        mine = [f for f in figures if f.backend == backend]
        if len(mine) > 1:
            growth = mine[-1].cold_open_s / mine[0].cold_open_s if mine[0].cold_open_s else 0.0
            scale = mine[-1].pages / mine[0].pages
            print(f"  {backend}: {scale:,.0f}x the pages, {growth:.2f}x the cold open time")


def run(args: argparse.Namespace) -> int:
    sizes = sorted({int(n) for n in args.sizes.split(",") if n.strip()})
    backends = [b for b in args.backends.split(",") if b]
    if not sizes or sizes[0] < _PROBES or set(backends) - {"disk", "lmdb"}:
        raise SystemExit(f"--sizes must be counts >= {_PROBES}; --backends disk and/or lmdb")
    figures: list[OpenFigure] = []
    print_header(args.page_bytes)
    with tempfile.TemporaryDirectory(prefix="hicache-open-bench-", dir=args.dir) as scratch:
        for backend in backends:
            for figure in measure(backend, Path(scratch) / backend, sizes, args):
                print_row(figure)
                figures.append(figure)
    print_summary(figures)
    if args.json is not None:
        args.json.write_text(json.dumps([f._asdict() for f in figures], indent=2) + "\n")
    return 0
