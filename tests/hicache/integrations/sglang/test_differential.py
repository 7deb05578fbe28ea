"""Differential: the same storage traffic through SGLang's own HiCacheFile and through
HicacheStorage gives the same answers and the same bytes in the host pool.

The traffic is SGLang's: its cache controller's backup (``_page_backup``), hit
query (``_storage_hit_query``: ``batch_exists`` in chunks of 128) and
prefetch (``_generic_page_get`` / ``_page_get_zero_copy``), compiled from
the installed wheel (``sglang_code``), over host pools made of SGLang's own
page methods, for MHA and MLA, each layout, the generic and the v1 paths,
with holes in what was written.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache.bench.common.processes import ServerProcess
from hicache.integrations.sglang_cpu import Controller, HostPool, chain_hashes
from tests.hicache.integrations.sglang.helpers import (
    lmdb_extra,
    ours,
    redis_extra,
    remote_extra,
    sglang_file,
)

PAGE = 4
PAGES = 6
KINDS = ("mha", "mla")
LAYOUTS = ("layer_first", "page_first", "page_first_direct")

Round = tuple[list[bool], int]
rounds = st.lists(
    st.tuples(st.lists(st.booleans(), min_size=PAGES, max_size=PAGES), st.integers(0, PAGES)),
    min_size=1,
    max_size=3,
)
SETTINGS = settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def runs(mask: list[bool]) -> list[list[int]]:
    """Contiguous runs of the pages to write (each one SGLang backup operation)."""
    out: list[list[int]] = []
    for page, write in enumerate(mask):
        if write and out and out[-1][-1] == page - 1:
            out[-1].append(page)
        elif write:
            out.append([page])
    return out


def check_same(
    kind: str,
    layout: str,
    v1: bool,
    seed: int,
    plan: list[Round],
    extra: Callable[[Path], dict[str, Any]],
    model: str = "org/model",
) -> None:
    with tempfile.TemporaryDirectory() as root:
        src = HostPool(kind, layout, PAGES)
        for page in range(PAGES):
            src.fill(page, seed * 100 + page)
        theirs = sglang_file(src, Path(root) / "file")
        mine = ours(src, extra(Path(root)), model=model)
        tokens = [seed * 1000 + t for t in range(PAGES * PAGE)]
        hashes = chain_hashes(tokens, None, PAGE)
        try:
            for mask, query_pages in plan:
                for run in runs(mask):
                    keys = [hashes[p] for p in run]
                    written = [
                        Controller(b, src, v).backup(keys, run)
                        for b, v in ((theirs, False), (mine, v1))
                    ]
                    assert written[0] == written[1] == len(run) * PAGE
                _check_reads(kind, layout, v1, theirs, mine, src, tokens[: query_pages * PAGE])
            for key in hashes:
                assert theirs.exists(key) == mine.exists(key)
        finally:
            mine.close()


def _check_reads(
    kind: str, layout: str, v1: bool, theirs: Any, mine: Any, src: HostPool, tokens: list[int]
) -> None:
    dst = {name: HostPool(kind, layout, PAGES) for name in ("theirs", "mine")}
    queried = [
        Controller(theirs, src, False).hit_query(tokens),
        Controller(mine, src, v1).hit_query(tokens),
    ]
    assert queried[0] == queried[1]
    hit_hashes, hit_tokens = queried[0]
    # Into other host pages than they came from (reversed), as a prefetch would.
    targets = list(range(PAGES - 1, PAGES - 1 - len(hit_hashes), -1))
    loaded = []
    for name, backend, path_v1 in (("theirs", theirs, False), ("mine", mine, v1)):
        backend.register_mem_pool_host(dst[name])
        loaded.append(Controller(backend, dst[name], path_v1).load(hit_hashes, targets))
        backend.register_mem_pool_host(src)
    assert loaded[0] == loaded[1] == hit_tokens // PAGE
    for i, target in enumerate(targets):
        assert (
            dst["mine"].page_bytes(target) == dst["theirs"].page_bytes(target) == src.page_bytes(i)
        )


@pytest.mark.parametrize("v1", [False, True], ids=["generic", "v1"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", KINDS)
@SETTINGS
@given(seed=st.integers(0, 10**6), plan=rounds)
def test_lmdb_matches_hicache_file(
    kind: str, layout: str, v1: bool, seed: int, plan: list[Round]
) -> None:
    check_same(kind, layout, v1, seed, plan, lambda root: lmdb_extra(root / "lmdb"))


@pytest.mark.parametrize(("kind", "layout"), [("mha", "page_first"), ("mla", "page_first_direct")])
@SETTINGS
@given(seed=st.integers(0, 10**6), plan=rounds)
def test_daemon_matches_hicache_file(
    shared_daemon: ServerProcess, kind: str, layout: str, seed: int, plan: list[Round]
) -> None:
    endpoint = shared_daemon.endpoint
    # A fresh namespace per example: the daemon outlives the examples.
    model = f"model-{uuid.uuid4().hex}"
    check_same(kind, layout, True, seed, plan, lambda root: remote_extra(endpoint), model)


@SETTINGS
@given(seed=st.integers(0, 10**6), plan=rounds)
def test_redis_matches_hicache_file(redis_endpoint: str, seed: int, plan: list[Round]) -> None:
    prefix = f"sglang-{uuid.uuid4().hex[:12]}"
    check_same(
        "mha", "page_first", True, seed, plan, lambda root: redis_extra(redis_endpoint, prefix)
    )
