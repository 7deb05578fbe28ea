"""HicacheTier through vLLM's own factory and classes: creation, round trips,
damage, a killed daemon, and vLLM's tiering manager end to end on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm.v1.kv_offload.base import LookupResult, Medium, ReqContext, ScheduleEndContext
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from hicache.bench.common.processes import ServerProcess
from hicache.integrations.vllm import HicacheTier, TierMetrics
from hicache.integrations.vllm_cpu import (
    PrimaryBuffer,
    TierDriver,
    cpu_offloading_spec,
    create_tier,
)
from tests.hicache.integrations.vllm.helpers import CHUNK, key, lmdb_tier, payload, remote_tier
from tests.polling import wait_until

HIT, MISS = LookupResult.HIT, LookupResult.MISS


def make(config: dict[str, object], chunks: int = 16) -> tuple[HicacheTier, PrimaryBuffer]:
    primary = PrimaryBuffer(chunks, CHUNK)
    tier = create_tier(config, primary, cpu_offloading_spec(CHUNK, chunks))
    assert isinstance(tier, HicacheTier)
    return tier, primary


def test_factory_loads_the_out_of_tree_tier(tmp_path: Path) -> None:
    tier, _ = make(lmdb_tier(tmp_path / "db"))
    try:
        assert isinstance(tier, SecondaryTierManager)
        assert tier.tier_type == "HicacheTier"
        assert tier.medium is Medium.STORAGE
        assert tier.config_info() == {"hicache_backend": "lmdb"}
        assert "model_name=org/model" in tier.namespace.describe()
        assert not tier.has_pending_work()
        assert tier.get_stats() is None  # nothing failed yet
    finally:
        tier.shutdown()
        tier.shutdown()  # idempotent


def test_vllm_spec_sees_our_metrics_and_info_labels(tmp_path: Path) -> None:
    """vLLM registers a tier's metrics and info labels from the spec's config."""
    extra = {"secondary_tiers": [lmdb_tier(tmp_path / "db")]}
    assert set(TierMetrics.DOCS) <= set(TieringOffloadingSpec.build_metric_definitions(extra))
    assert "hicache_backend" in TieringOffloadingSpec.config_info_keys(extra)


def test_unknown_key_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown key 'endpont'"):
        make({**lmdb_tier(tmp_path / "db"), "endpont": "tcp://127.0.0.1:1"})
    with pytest.raises(ValueError, match="hicache_config 'no-such-config'"):
        make({**lmdb_tier(tmp_path / "db"), "hicache_config": "no-such-config"})


def test_store_lookup_load_round_trip(tmp_path: Path) -> None:
    tier, primary = make(lmdb_tier(tmp_path / "db"))
    driver = TierDriver(tier)
    try:
        for i in range(4):
            primary.fill(i, payload(i))
        stored = driver.jobs([([key(0), key(1)], [0, 1]), ([key(2), key(3)], [2, 3])], False)
        assert [r.success for r in stored] == [True, True]
        assert stored[0].transfer_bytes == 2 * CHUNK
        assert driver.lookup([key(0), key(3), key(9), key(1, group=1)]) == [HIT, HIT, MISS, MISS]
        loaded = driver.jobs([([key(3), key(0)], [8, 9])], True)
        assert loaded[0].success
        assert primary.chunk(8) == payload(3) and primary.chunk(9) == payload(0)
        assert not tier.has_pending_work()
    finally:
        tier.shutdown()


def test_damaged_page_fails_its_load_and_leaves_the_chunk(tmp_path: Path) -> None:
    """A page damaged in the store: that key's load fails (the others load),
    its primary chunk keeps its bytes, and its lookup turns to MISS."""
    tier, primary = make({**lmdb_tier(tmp_path / "pages"), "backend": "file"})
    driver = TierDriver(tier)
    try:
        primary.fill(0, payload(0))
        primary.fill(1, payload(1))
        assert driver.jobs([([key(0), key(1)], [0, 1])], False)[0].success
        assert driver.lookup([key(0), key(1)]) == [HIT, HIT]
        pages = sorted(
            p for p in (tmp_path / "pages").rglob("*") if p.is_file() and p.stat().st_size > CHUNK
        )
        assert len(pages) == 2
        blob = bytearray(pages[0].read_bytes())
        blob[-1] ^= 0xFF
        pages[0].write_bytes(bytes(blob))
        primary.fill(5, b"\x5a" * CHUNK)
        primary.fill(6, b"\x5a" * CHUNK)
        result = driver.jobs([([key(0), key(1)], [5, 6])], True)[0]
        assert not result.success
        assert result.successful_keys is not None and len(result.successful_keys) == 1
        good = next(iter(result.successful_keys))
        bad_chunk, good_chunk = (6, 5) if good == key(0) else (5, 6)
        assert primary.chunk(good_chunk) == payload(0 if good == key(0) else 1)
        assert primary.chunk(bad_chunk) == b"\x5a" * CHUNK
        bad_key = key(1) if good == key(0) else key(0)
        assert driver.lookup([bad_key, good]) == [MISS, HIT]
    finally:
        tier.shutdown()


def test_killed_daemon_gives_misses_and_failed_jobs(own_daemon: ServerProcess) -> None:
    tier, primary = make(remote_tier(own_daemon.endpoint, timeout_s=0.5))
    driver = TierDriver(tier)
    try:
        primary.fill(0, payload(0))
        assert driver.jobs([([key(0)], [0])], False)[0].success
        assert driver.lookup([key(0)]) == [HIT]
        own_daemon.kill()  # every wait below is bounded: TierDriver raises on a hang
        assert driver.lookup([key(0), key(1)]) == [MISS, MISS]
        assert not driver.jobs([([key(0)], [3])], True)[0].success
        assert not driver.jobs([([key(2)], [0])], False)[0].success
        assert primary.chunk(3) == bytes(CHUNK)
        stats = tier.get_stats()
        assert stats is not None and not stats.is_empty()
    finally:
        tier.shutdown()


def step(manager: TieringOffloadingManager) -> None:
    with manager.lock:
        manager.on_schedule_end(ScheduleEndContext((), ()))


def settled(manager: TieringOffloadingManager) -> bool:
    """One scheduler tick (vLLM's manager moves jobs only when stepped); True once
    no job is pending."""
    step(manager)
    return not manager.has_pending_work()


def lookup_until_settled(
    manager: TieringOffloadingManager, k: bytes, ctx: ReqContext
) -> LookupResult:
    """vLLM's manager lookup, stepping the engine while it says RETRY/HIT_PENDING."""
    results: list[LookupResult] = []

    def answered() -> bool:
        with manager.lock:
            results.append(manager.lookup(k, ctx))  # type: ignore[arg-type]
        if results[-1] in (HIT, MISS):
            return True
        step(manager)
        return False

    wait_until(answered, timeout_s=20, interval_s=0.001)
    return results[-1]


def test_tiering_manager_end_to_end(tmp_path: Path) -> None:
    """vLLM's TieringOffloadingManager with a CPU primary tier of 4 chunks and
    our tier: stores cascade to us, the primary tier evicts, and a later lookup
    promotes the chunk back with its bytes."""
    chunks = 4
    spec = cpu_offloading_spec(
        CHUNK, chunks, [lmdb_tier(tmp_path / "db")], engine_id=f"e2e-{tmp_path.name}"
    )
    manager = spec.get_manager()
    assert isinstance(manager, TieringOffloadingManager)
    (tier,) = manager.secondary_tiers
    assert isinstance(tier, HicacheTier)
    view = manager.primary_tier.get_kv_memoryview().cast("B")
    ctx = ReqContext(req_id="writer")
    try:
        with manager.lock:
            manager.on_new_request(ctx)
        for n in range(2 * chunks):  # twice the primary tier: the first ones are evicted
            with manager.lock:
                out = manager.prepare_store([key(n)], ctx)  # type: ignore[list-item]
            assert out is not None and out.keys_to_store == [key(n)]
            (chunk,) = out.store_spec.chunk_ids  # type: ignore[attr-defined]
            view[int(chunk) * CHUNK : (int(chunk) + 1) * CHUNK] = payload(n)  # "GPU → CPU"
            with manager.lock:
                manager.complete_store([key(n)], ctx)  # type: ignore[list-item]
            assert wait_until(lambda: settled(manager), timeout_s=20, interval_s=0.001)
        with manager.lock:
            manager.on_request_finished(ctx)
        assert tier.failure_counts() == {}
        reader = ReqContext(req_id="reader")
        with manager.lock:
            manager.on_new_request(reader)
            assert manager.primary_tier.lookup(key(0), reader) is MISS  # evicted
        assert lookup_until_settled(manager, key(0), reader) is HIT  # promoted back
        with manager.lock:
            spec_ = manager.prepare_load([key(0)], reader)  # type: ignore[list-item]
        (chunk,) = spec_.chunk_ids  # type: ignore[attr-defined]
        assert bytes(view[int(chunk) * CHUNK : (int(chunk) + 1) * CHUNK]) == payload(0)
        with manager.lock:
            manager.complete_load([key(0)], reader)  # type: ignore[list-item]
            manager.on_request_finished(reader)
        assert lookup_until_settled(manager, key(99), ReqContext(req_id="x")) is MISS
    finally:
        manager.shutdown()
