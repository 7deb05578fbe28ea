"""What an operator meets with HicacheTier in vLLM's own classes: the primary region is
unmapped at shutdown, removals reach vLLM's KV events, and a dead daemon shows as
backend errors."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
from vllm.v1.kv_offload.base import Medium, OffloadingEvent

from hicache.integrations.vllm import HicacheTier, TierMetrics
from hicache.integrations.vllm_cpu import (
    PrimaryBuffer,
    TierDriver,
    cpu_offloading_spec,
    create_tier,
)
from storage_backends.page_format import HEADER_BYTES
from tests.hicache.integrations.vllm.helpers import CHUNK, key, lmdb_tier, payload, remote_tier
from tests.storage_backends.remote.test_remote_link import free_endpoint

KEPT_MAPPED = "mapped: buffers are still exported"


@pytest.mark.parametrize("bad_key", [False, True])
def test_shutdown_lets_vllm_unmap_the_primary_region(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad_key: bool
) -> None:
    extra = {"no_such_key": 1} if bad_key else {}
    tier = lmdb_tier(tmp_path / "db", **extra)
    spec = cpu_offloading_spec(CHUNK, 8, [tier], engine_id=f"hicache-test-{uuid.uuid4().hex}")
    with caplog.at_level(logging.WARNING, logger="vllm"):
        if bad_key:  # vLLM shuts down what it built, then unmaps, then re-raises
            with pytest.raises(ValueError, match="no_such_key"):
                spec.get_manager()
        else:
            spec.get_manager().shutdown()
    assert not [r for r in caplog.records if KEPT_MAPPED in r.getMessage()]


def make_evented(config: dict[str, object], chunks: int = 8) -> tuple[HicacheTier, PrimaryBuffer]:
    primary = PrimaryBuffer(chunks, CHUNK)
    spec = cpu_offloading_spec(CHUNK, chunks, kv_events=True)
    tier = create_tier({**config, "enable_kv_events": True}, primary, spec)
    assert isinstance(tier, HicacheTier)
    return tier, primary


def test_evicted_pages_are_sent_as_removals(tmp_path: Path) -> None:
    # A memory store of three pages: the fourth store evicts the first.
    memory = {**lmdb_tier(tmp_path / "db"), "backend": "memory"}
    tier, primary = make_evented({**memory, "max_bytes": 3 * (CHUNK + HEADER_BYTES)})
    driver = TierDriver(tier)
    try:
        for i in range(4):
            primary.fill(i, payload(i))
            assert driver.jobs([([key(i)], [i])], False)[0].success
        events: list[OffloadingEvent] = list(tier.take_events())
        stored = [k for e in events if not e.removed for k in e.keys]
        removed = [k for e in events if e.removed for k in e.keys]
        assert stored == [key(i) for i in range(4)] and removed == [key(0)]
        assert all(e.medium is Medium.STORAGE and e.ownership == tier.tier_type for e in events)
        assert not any(e.removal_expected for e in events)  # not all removals are seen
        assert list(tier.take_events()) == []
    finally:
        tier.shutdown()


def test_a_dead_daemon_counts_as_backend_errors() -> None:
    tier, _ = make_evented(remote_tier(free_endpoint(), timeout_s=0.2))
    driver = TierDriver(tier)
    try:
        assert not driver.jobs([([key(1)], [1])], True)[0].success
        assert not driver.jobs([([key(2)], [2])], False)[0].success
        stats = tier.get_stats()
        assert stats is not None
        counts = stats.reduce()
        assert counts[TierMetrics.BACKEND_ERRORS] >= 2  # the timeout, then a fast fail
        assert counts[TierMetrics.LOAD_FAILED_CHUNKS] == 1
    finally:
        tier.shutdown()
