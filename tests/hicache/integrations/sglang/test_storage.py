"""HicacheStorage as SGLang uses it: loading, namespaces, sharing, failures, threads, tenants."""

from __future__ import annotations

import subprocess
import sys
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, PoolName, PoolTransfer
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from hicache.bench.common.processes import ServerProcess
from hicache.integrations.sglang import HicacheStorage
from hicache.integrations.sglang_cpu import Controller, HostPool, chain_hashes
from tests.hicache.integrations.sglang.helpers import (
    DYNAMIC,
    lmdb_extra,
    ours,
    remote_extra,
    sglang_config,
)

if TYPE_CHECKING:
    from tests.hicache.integrations.sglang.conftest import CurveSetup, StartDaemon

PAGES = 8
SCATTER_ONLY = "tests.faulty_backends:ScatterOnlyMemory"


def filled(kind: str = "mha", layout: str = "page_first", seed: int = 0) -> HostPool:
    pool = HostPool(kind, layout, PAGES)
    for page in range(PAGES):
        pool.fill(page, seed + page)
    return pool


def keys_for(seed: int, pages: int = PAGES, page_size: int = 4) -> list[str]:
    return chain_hashes(list(range(seed, seed + pages * page_size)), None, page_size)


def test_sglang_factory_loads_it_as_dynamic(tmp_path: Path) -> None:
    pool = filled()
    backend = ours(pool, lmdb_extra(tmp_path / "s"))
    assert isinstance(backend, HiCacheStorage)
    keys = keys_for(1)
    assert backend.batch_set_v1(keys[:2], pool.page_indices([0, 1])) == [True, True]
    assert backend.batch_exists(keys) == 2
    backend.close()


def test_unknown_extra_config_key_fails_construction_naming_it(tmp_path: Path) -> None:
    cfg = sglang_config({**lmdb_extra(tmp_path / "s"), "endpiont": "tcp://127.0.0.1:1"})
    with pytest.raises(ValueError, match="unknown key 'endpiont'"):
        StorageBackendFactory.create_backend("dynamic", cfg, None)


def test_generic_single_page_api(tmp_path: Path) -> None:
    pool = filled()
    backend = ours(pool, lmdb_extra(tmp_path / "s"))
    key = keys_for(5)[0]
    assert backend.get(key) is None and not backend.exists(key)
    assert backend.set(key, pool.get_data_page(0, flat=True))
    assert backend.exists(key)
    page = backend.get(key)
    assert page is not None and bytes(page.view(torch.uint8).numpy()) == pool.page_bytes(0)
    assert backend.batch_get([key, keys_for(6)[0]])[1] is None
    backend.close()


def test_tp_ranks_are_isolated_and_mla_ranks_share(daemon_factory: StartDaemon) -> None:
    endpoint = daemon_factory().endpoint
    for kind, shared in (("mha", False), ("mla", True)):
        pool = filled(kind)
        rank0, rank1 = (ours(pool, remote_extra(endpoint), tp_rank=r, tp_size=2) for r in (0, 1))
        keys = keys_for(7)
        assert rank0.batch_set_v1(keys, pool.page_indices(range(PAGES))) == [True] * PAGES
        assert rank1.batch_exists(keys) == (PAGES if shared else 0)
        assert rank0.batch_exists(keys) == PAGES
        rank0.close()
        rank1.close()


def test_model_and_layout_separate_pages(tmp_path: Path) -> None:
    pool, other_layout = filled(), filled(layout="page_first_direct")
    a = ours(pool, lmdb_extra(tmp_path / "s"), model="a")
    keys = keys_for(8)
    a.batch_set_v1(keys, pool.page_indices(range(PAGES)))
    a.register_mem_pool_host(other_layout)  # the same store and model, another byte layout
    assert a.batch_exists(keys) == 0
    a.close()
    b = ours(pool, lmdb_extra(tmp_path / "s"), model="b")
    assert b.batch_exists(keys) == 0
    b.close()


def test_two_servers_share_pages_through_one_daemon(daemon_factory: StartDaemon) -> None:
    endpoint = daemon_factory().endpoint
    worker = [sys.executable, "-m", "tests.hicache.integrations.sglang.share_worker", endpoint, "m"]
    out = subprocess.run(
        [*worker, "0", "100", str(PAGES)], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split()[-1] == str(PAGES)
    source = filled(seed=100)  # what the other process wrote
    reader_pool = HostPool("mha", "page_first", PAGES)
    reader = ours(reader_pool, remote_extra(endpoint), model="m", tp_rank=0, tp_size=2)
    keys = keys_for(100)
    ctl = Controller(reader, reader_pool, True)
    hashes, hit_tokens = ctl.hit_query(list(range(100, 100 + PAGES * 4)))
    assert (hashes, hit_tokens) == (keys, PAGES * 4)
    assert ctl.load(keys, list(range(PAGES))) == PAGES
    assert [reader_pool.page_bytes(p) for p in range(PAGES)] == [
        source.page_bytes(p) for p in range(PAGES)
    ]
    other_rank = ours(reader_pool, remote_extra(endpoint), model="m", tp_rank=1, tp_size=2)
    assert other_rank.batch_exists(keys) == 0
    reader.close()
    other_rank.close()


def test_killed_daemon_gives_misses_and_no_exception(daemon_factory: StartDaemon) -> None:
    daemon = daemon_factory()
    pool = filled()
    extra = remote_extra(daemon.endpoint, timeout_s=0.5, breaker_failures=1)
    backend = ours(pool, extra)
    keys = keys_for(9)
    indices = pool.page_indices(range(PAGES))
    assert backend.batch_set_v1(keys, indices) == [True] * PAGES
    daemon.kill()
    assert backend.batch_exists(keys) == 0
    assert backend.batch_get_v1(keys, indices) == [False] * PAGES
    assert backend.batch_set_v1(keys, indices) == [False] * PAGES
    assert backend.batch_get(keys) == [None] * PAGES
    assert backend.batch_set(keys, [pool.get_data_page(0)] * PAGES) is False
    assert backend.get(keys[0]) is None and backend.exists(keys[0]) is False
    stats = backend.stats()
    assert stats.storage is not None and stats.storage.errors > 0
    backend.close()


@pytest.mark.parametrize("store", ["daemon", "lmdb"])
def test_three_threads_at_once(shared_daemon: ServerProcess, tmp_path: Path, store: str) -> None:
    pool = filled()
    extra = (
        remote_extra(shared_daemon.endpoint) if store == "daemon" else lmdb_extra(tmp_path / "s")
    )
    backend = ours(pool, extra, model=f"threads-{store}")
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            dst = HostPool("mha", "page_first", PAGES)
            keys = keys_for(seed)
            for _ in range(5):
                assert backend.batch_set_v1(keys, pool.page_indices(range(PAGES))) == [True] * 8
                assert backend.batch_exists(keys) == PAGES
                assert Controller(backend, dst, False).load(keys, list(range(PAGES))) == PAGES
                assert [dst.page_bytes(p) for p in range(PAGES)] == [
                    pool.page_bytes(p) for p in range(PAGES)
                ]
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(1000 * (i + 1),)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert backend.stats().failures == {}
    backend.close()


def test_curve_tenant_sees_only_its_own_pages(curve_daemon: CurveSetup) -> None:
    pool = filled()
    endpoint = curve_daemon.server.endpoint

    def tenant(name: str) -> HicacheStorage:
        secret, server = curve_daemon.client_keys(name)
        extra = remote_extra(endpoint, curve_client_key=secret, curve_server_key=server)
        return ours(pool, extra)

    alice, bob = tenant("alice"), tenant("bob")
    keys = keys_for(11)
    assert alice.batch_set_v1(keys, pool.page_indices(range(PAGES))) == [True] * PAGES
    assert alice.batch_exists(keys) == PAGES
    assert bob.batch_exists(keys) == 0
    assert bob.batch_get_v1(keys, pool.page_indices(range(PAGES))) == [False] * PAGES
    alice.close()
    bob.close()


def test_bad_calls_are_misses_counted_never_exceptions(tmp_path: Path) -> None:
    pool = filled()
    backend = ours(pool, lmdb_extra(tmp_path / "s"))
    keys = keys_for(12, pages=2)
    assert backend.batch_get_v1(keys, pool.page_indices([0])) == [False, False]  # short indices
    assert backend.batch_set(keys, None) is False
    assert backend.get(keys[0], torch.zeros(3, dtype=torch.bfloat16)) is None  # wrong size
    assert backend.batch_exists(["not-hex"]) == 0
    assert backend.batch_set(["not-hex"], [pool.get_data_page(0)])  # any key text is a key
    assert backend.batch_exists(["not-hex"]) == 1
    assert set(backend.stats().failures) == {"batch_get_v1 failed", "batch_set failed"}
    backend.close()
    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys, pool.page_indices([0, 1])) == [False, False]
    assert backend.stats().failures["batch_exists failed"] == 1


def test_unregistered_pool_means_misses(tmp_path: Path) -> None:
    cfg = sglang_config(lmdb_extra(tmp_path / "s"))
    backend = StorageBackendFactory.create_backend("dynamic", cfg, None)
    assert backend.batch_exists(keys_for(1)) == 0
    assert backend.batch_get(keys_for(1)[:1]) == [None]
    backend.close()


def test_damaged_page_is_a_miss_and_is_deleted(tmp_path: Path) -> None:
    pool = filled()
    backend = ours(
        pool,
        {**DYNAMIC, "hicache_config": "default", "backend": "file", "path": str(tmp_path / "f")},
    )
    keys = keys_for(13, pages=1)
    assert backend.batch_set_v1(keys, pool.page_indices([0])) == [True]
    (stored,) = [p for p in (tmp_path / "f").rglob("*") if p.is_file() and p.stat().st_size > 512]
    raw = bytearray(stored.read_bytes())
    raw[-1] ^= 0xFF
    stored.write_bytes(bytes(raw))
    dst = HostPool("mha", "page_first", PAGES)
    backend.register_mem_pool_host(dst)
    assert backend.batch_get_v1(keys, dst.page_indices([0])) == [False]
    assert dst.page_bytes(0) == bytes(len(pool.page_bytes(0)))  # the pool is untouched
    assert backend.batch_exists(keys) == 0
    stats = backend.stats().storage
    assert stats is not None and stats.corrupt == 1
    backend.close()


@dataclass
class FakeStorageMetrics:
    """Stands in for SGLang's StorageMetrics, whose module imports transformers."""

    prefetch_pgs: list[int] = field(default_factory=list)
    backup_pgs: list[int] = field(default_factory=list)
    prefetch_bandwidth: list[float] = field(default_factory=list)
    backup_bandwidth: list[float] = field(default_factory=list)


def test_get_stats_reports_pages_per_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("sglang.srt.observability.metrics_collector")
    module.StorageMetrics = FakeStorageMetrics  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    pool = filled()
    plain = ours(pool, lmdb_extra(tmp_path / "a"))
    assert plain.get_stats() is None
    plain.close()
    backend = ours(pool, lmdb_extra(tmp_path / "b"), metrics=True)
    keys = keys_for(14, pages=3)
    backend.batch_set_v1(keys, pool.page_indices([0, 1, 2]))
    backend.batch_get_v1(keys, pool.page_indices([3, 4, 5]))
    stats = backend.get_stats()
    assert isinstance(stats, FakeStorageMetrics)
    assert (stats.backup_pgs, stats.prefetch_pgs) == ([3], [3])
    assert stats.prefetch_bandwidth[0] > 0
    again = backend.get_stats()
    assert isinstance(again, FakeStorageMetrics) and again.backup_pgs == []
    backend.close()


def test_clear_and_v2_pools_refuse_without_raising(tmp_path: Path) -> None:
    pool = filled()
    backend = ours(pool, lmdb_extra(tmp_path / "s"))
    keys = keys_for(15, pages=2)
    backend.batch_set_v1(keys, pool.page_indices([0, 1]))
    assert backend.clear() is False
    assert backend.batch_exists(keys) == 2  # nothing deleted
    transfer = PoolTransfer(name=PoolName.MAMBA, keys=keys, host_indices=pool.page_indices([0, 1]))
    assert backend.batch_exists_v2(keys, [transfer]).kv_hit_pages == 0
    assert backend.batch_get_v2([transfer]) == {"mamba": [False, False]}
    assert backend.batch_set_v2([transfer]) == {"mamba": [False, False]}
    backend.close()


def test_namespace_reads_ranks_with_defaults() -> None:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    from hicache.integrations.sglang import PageGeometry, namespace_fields

    geometry = PageGeometry(4, 4, 128, 512, torch.bfloat16, "page_first", True)
    mha = namespace_fields(sglang_config({}, tp_rank=1, tp_size=2), geometry)
    assert (mha["tp_rank"], mha["tp_size"], mha["dtype"]) == (1, 2, "bfloat16")
    assert "pp_rank" not in mha
    pp = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=1, pp_size=2, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=True, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="m",
    )  # fmt: skip
    mla = namespace_fields(pp, geometry)
    assert "tp_rank" not in mla and (mla["pp_rank"], mla["pp_size"]) == (1, 2)

    class OldConfig:  # an older release's config: fields missing
        model_name = "m"

    assert namespace_fields(OldConfig(), geometry)["tp_rank"] == 0  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_v1_pages_are_read_straight_into_their_runs(kind: str) -> None:
    # A store whose plain get() fails: only a scatter read into the page's runs (K and V
    # of an MHA page) hits, so a staging copy in between shows as misses.
    pool = filled(kind)
    backend = ours(pool, {**DYNAMIC, "hicache_config": "default", "backend": SCATTER_ONLY})
    keys, indices = keys_for(21), pool.page_indices(range(PAGES))
    assert backend.batch_set_v1(keys, indices) == [True] * PAGES
    for page in range(PAGES):
        pool.fill(page, 100 + page)  # overwrite, then read the stored pages back
    assert backend.batch_get_v1(keys, indices) == [True] * PAGES
    expected = filled(kind)
    for page in range(PAGES):
        assert torch.equal(pool.get_data_page(page), expected.get_data_page(page))
    backend.close()


def test_a_dead_daemon_is_counted_as_backend_errors(daemon_factory: StartDaemon) -> None:
    daemon = daemon_factory()
    pool = filled()
    backend = ours(pool, remote_extra(daemon.endpoint, timeout_s=0.3))  # breaker_failures 3
    keys, indices = keys_for(31), pool.page_indices(range(PAGES))
    assert backend.batch_set_v1(keys, indices) == [True] * PAGES
    assert backend.stats().backend_errors == 0
    daemon.kill()
    assert backend.batch_exists(keys) == 0  # the one call that waits
    after_one = backend.stats().backend_errors
    assert after_one >= 1
    assert backend.batch_get_v1(keys, indices) == [False] * PAGES  # fails fast, counted too
    assert backend.stats().backend_errors > after_one
    assert backend.stats().failures == {}  # no exception reached the adapter
    backend.close()


@pytest.mark.parametrize("shift", ["past", "before", "short"])
def test_page_runs_that_do_not_fit_the_pool_are_a_failure_not_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shift: str
) -> None:
    """``get_page_buffer_meta`` pointing past the pool, or runs that do not make up a
    page: every page a miss, nothing written into the pool, nothing stored."""
    pool = filled()
    backend = ours(pool, lmdb_extra(tmp_path / "s"))
    keys = keys_for(9, pages=2)
    assert backend.batch_set_v1(keys, pool.page_indices([0, 1])) == [True, True]
    real = pool.get_page_buffer_meta

    def bad_meta(indices: torch.Tensor) -> tuple[list[int], list[int]]:
        ptrs, sizes = real(indices)
        if shift in ("past", "before"):
            moved = pool.kv_buffer.nbytes * (1 if shift == "past" else -1)
            return [p + moved for p in ptrs], list(sizes)
        return list(ptrs), [s - 1 for s in sizes]

    monkeypatch.setattr(pool, "get_page_buffer_meta", bad_meta)
    before = pool.kv_buffer.clone()
    assert backend.batch_get_v1(keys, pool.page_indices([2, 3])) == [False, False]
    assert torch.equal(pool.kv_buffer, before)
    assert backend.batch_set_v1(keys_for(10, pages=2), pool.page_indices([0, 1])) == [False] * 2
    assert backend.batch_exists(keys_for(10, pages=2)) == 0
    backend.close()
