"""``hicache bench sglang --linker``: the linker's rows.

The same geometry of pages through two paths into one daemon (``ipc://``):

- the linker: SGLang's ``UnifiedRadixCache`` over SGLang's device pool on CPU,
  with ``HicacheLinker`` below it (``hicache.bench.sglang.linker``). Offload:
  the request's pages inserted into the tree, which hands the new leaf to the
  linker, until SGLang has collected the finished offload. Load: a second
  request's match (the linker's lookup), ``init_load_back``, the layer-wise
  load with the forward's per-layer waits, and SGLang's verdict.
- the L3 path: SGLang's cache-controller code over ``HicacheStorage`` (v1,
  zero-copy into the host pool), calls of up to 128 pages as SGLang's backup
  and prefetch threads make them (``_page_backup``; the hit query, then
  ``batch_get_v1``).

Fresh pages every run (nothing is skipped as already stored); both paths
alternate within a run, best of ``--repeat``; ratio = linker / L3 in this run.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hicache.bench.sglang.l3 import (
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
from hicache.bench.sglang.linker import SglangModules, Shape, UnifiedServer
from hicache.integrations.sglang_cpu import Controller, HostPool, chain_hashes

TARGET = "linker, daemon ipc://"
L3_BATCH = 128  # SGLang's STORAGE_BATCH_SIZE: pages per backup/prefetch call


def _linker_offload(server: UnifiedServer, tokens: list[int], seed: int) -> float:
    slots, _ = server.write(len(tokens), seed)
    start = time.perf_counter()
    server.insert(tokens, slots)
    server.settle()
    return time.perf_counter() - start


def _linker_load(server: UnifiedServer, tokens: list[int], pages: int) -> float:
    server.evict()
    start = time.perf_counter()
    got = server.fetch(tokens, keep=False)
    seconds = time.perf_counter() - start
    if got.aborted or len(got.loaded_slots) != pages * server.shape.page_size:
        raise RuntimeError(f"linker load: {len(got.loaded_slots)} slots, aborted={got.aborted}")
    return seconds


def _best(results: dict[str, float], key: str, nbytes: int, fn: Callable[[], float]) -> None:
    results[key] = max(results.get(key, 0.0), nbytes / fn() / 1e9)


def measure(geometry: Geometry, root: Path, repeat: int) -> list[Row]:
    """Offload ("set") and load ("get") GB/s of the linker, each with the L3
    path's figure of the same op on the same pages and daemon."""
    from hicache.bench.common.processes import start_daemon

    g = geometry
    sg = SglangModules()
    shape = Shape("mha", g.layers, g.heads, g.head_dim, g.page_size, 2 * g.pages * g.page_size)
    layout = g.layout if g.layout in ("page_first", "layer_first") else "page_first"
    ipc = f"ipc://{root / 'linker-daemon.sock'}"
    nbytes, best = g.pages * g.page_bytes, dict[str, float]()
    with start_daemon(daemon_config(root), root / "store-linker", ipc) as daemon:
        extra: dict[str, object] = {"hicache_config": "remote", "endpoint": daemon.endpoint}
        extra["layout"] = layout
        server = UnifiedServer(sg, shape, "python", extra, model="bench/model")
        source, dst = host_pool(g, 1), host_pool(g, 2)
        l3 = open_storage("daemon", source, root, daemon.endpoint)
        try:
            for rep in range(repeat):
                tokens = tokens_for(g, (2 * rep + 1) * 1_000_000)
                offload = functools.partial(_linker_offload, server, tokens, rep)
                _best(best, "linker set", nbytes, offload)
                load = functools.partial(_linker_load, server, tokens, g.pages)
                _best(best, "linker get", nbytes, load)
                _l3_once(l3, source, dst, tokens_for(g, (2 * rep + 2) * 1_000_000), best)
        finally:
            close_storage(l3)
            server.close()
    return [
        Row(TARGET, op, g.pages, best[f"linker {op}"], best[f"l3 {op}"]) for op in ("set", "get")
    ]


def _l3_once(
    l3: object, source: HostPool, dst: HostPool, tokens: list[int], best: dict[str, float]
) -> None:
    """SGLang's backup thread then its prefetch (hit query, reads) on fresh pages."""
    hashes = chain_hashes(tokens, None, source.page_size)
    nbytes = len(hashes) * _page_bytes(source)
    writer = Controller(l3, source, True)
    backup = functools.partial(backup_pages, writer, hashes, L3_BATCH)
    _best(best, "l3 set", nbytes, lambda: timed(backup, len(hashes)))
    l3.register_mem_pool_host(dst)  # type: ignore[attr-defined]
    reader = Controller(l3, dst, True)
    prefetch = functools.partial(prefetch_pages, reader, tokens, L3_BATCH)
    _best(best, "l3 get", nbytes, lambda: timed(prefetch, len(hashes)))
    l3.register_mem_pool_host(source)  # type: ignore[attr-defined]


def _page_bytes(pool: HostPool) -> int:
    page = pool.get_dummy_flat_data_page()
    return int(page.numel() * page.element_size())


def print_rows(rows: Sequence[Row]) -> None:
    """The linker's rows: its GB/s against the L3 path's on the same pages and daemon."""
    print("linker (SGLang's UnifiedRadixCache, device pool on CPU) against the L3 path")
    print("  (HicacheStorage v1 under SGLang's cache-controller code), same pages and daemon")
    print(f"{'target':28} {'op':3} {'pages/call':>10} {'GB/s':>7} {'L3 GB/s':>10} {'ratio':>6}")
    for r in rows:
        print(
            f"{r.target:28} {r.op:3} {r.pages_per_call:>10} {r.gbps:7.2f} "
            f"{r.baseline_gbps:10.2f} {r.ratio:6.2f}"
        )
