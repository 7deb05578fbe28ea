"""HicacheStorage.batch_set_v1 through SGLang's real host pool classes with multi-run pages
(an MHA page is its K run and its V run): stored straight from the runs (``put_gather``),
read back bit-exact through the v1 and the generic path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hicache.bench.common.processes import ServerProcess
from hicache.integrations.sglang_cpu import HostPool, chain_hashes
from tests.hicache.integrations.sglang.helpers import DYNAMIC, lmdb_extra, ours, remote_extra

PAGES = 8
GATHER_ONLY = "tests.faulty_backends:GatherOnlyMemory"


def filled(layout: str, seed: int = 0, kind: str = "mha") -> HostPool:
    pool = HostPool(kind, layout, PAGES)
    for page in range(PAGES):
        pool.fill(page, seed + page)
    return pool


def keys_for(seed: int) -> list[str]:
    return chain_hashes(list(range(seed, seed + PAGES * 4)), None, 4)


def runs_per_page(pool: HostPool) -> int:
    ptrs, _sizes = pool.get_page_buffer_meta(pool.page_indices([0]))
    return len(ptrs)


def check_read_back(backend: object, pool: HostPool, keys: list[str]) -> None:
    """The stored pages are the pool's flat pages (K then V), read both ways: into flat
    pages, and (after the pool is overwritten) straight back into the pool's runs."""
    expected = [pool.page_bytes(p) for p in range(PAGES)]
    flat = [torch.zeros_like(pool.get_dummy_flat_data_page()) for _ in range(PAGES)]
    got = backend.batch_get(keys, flat)  # type: ignore[attr-defined]
    assert all(page is not None for page in got)
    assert [bytes(page.view(torch.uint8).numpy()) for page in flat] == expected
    for page in range(PAGES):
        pool.fill(page, 900 + page)
    assert backend.batch_get_v1(keys, pool.page_indices(range(PAGES))) == [True] * PAGES  # type: ignore[attr-defined]
    assert [pool.page_bytes(p) for p in range(PAGES)] == expected


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_v1_pages_are_stored_straight_from_their_runs(layout: str) -> None:
    # A store whose plain put() fails: only a gather write from the page's runs stores,
    # so a staging copy in between shows as failures.
    pool = filled(layout)
    assert runs_per_page(pool) > 1
    backend = ours(pool, {**DYNAMIC, "hicache_config": "default", "backend": GATHER_ONLY})
    try:
        keys = keys_for(7)
        assert backend.batch_set_v1(keys, pool.page_indices(range(PAGES))) == [True] * PAGES
        check_read_back(backend, pool, keys)
        assert backend.stats().failures == {}
    finally:
        backend.close()


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
@pytest.mark.parametrize("store", ["daemon", "lmdb"])
def test_multi_run_pages_round_trip_bit_exact(
    shared_daemon: ServerProcess, tmp_path: Path, layout: str, store: str
) -> None:
    # The daemon client builds records from the runs; lmdb is served by the fallback.
    pool = filled(layout, seed=40)
    extra = (
        remote_extra(shared_daemon.endpoint) if store == "daemon" else lmdb_extra(tmp_path / "s")
    )
    backend = ours(pool, extra, model=f"gather-{store}-{layout}")
    try:
        keys = keys_for(11)
        assert backend.batch_set_v1(keys, pool.page_indices(range(PAGES))) == [True] * PAGES
        check_read_back(backend, pool, keys)
        assert backend.stats().failures == {}
    finally:
        backend.close()  # a failed check must not leave a socket (and its context) open
