"""Promises of docs/vllm.md that the other tier tests do not state.

- the namespace: two models never see each other's chunks, two servers of the same
  model share them;
- per-key presence (a lookup window with holes) is exact, in one store call;
- a store skips chunks already in the store (the first page stays);
- a load that misses some chunks reports the ones that loaded, leaves the others'
  primary bytes alone, and counts each failed chunk once in ``get_stats``;
- a job whose chunk ids fall outside the primary tier is a failed ``JobResult``,
  never an exception into vLLM nor bytes written elsewhere;
- with KV events on (ours and vLLM's), a stored chunk is announced, a failed store not.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.v1.kv_offload.base import LookupResult

from hicache.integrations.vllm import HicacheTier, TierMetrics, present_per_key
from hicache.integrations.vllm_cpu import (
    PrimaryBuffer,
    TierDriver,
    cpu_offloading_spec,
    create_tier,
)
from storage_backends.base import StorageBackend
from tests.hicache.integrations.vllm.helpers import CHUNK, key, lmdb_tier, payload

HIT, MISS = LookupResult.HIT, LookupResult.MISS


def make(
    config: dict[str, object], model: str = "org/model", tokens_per_block: int = 16
) -> tuple[HicacheTier, PrimaryBuffer]:
    primary = PrimaryBuffer(8, CHUNK)
    spec = cpu_offloading_spec(CHUNK, 8, model=model, tokens_per_block=tokens_per_block)
    tier = create_tier(config, primary, spec)
    assert isinstance(tier, HicacheTier)
    return tier, primary


def lookups(
    config: dict[str, object], keys: list[int], model: str, tokens_per_block: int = 16
) -> list[LookupResult]:
    tier, _ = make(config, model, tokens_per_block)
    try:
        return TierDriver(tier).lookup([key(k) for k in keys])
    finally:
        tier.shutdown()


def test_models_keep_apart_and_one_model_shares(tmp_path: Path) -> None:
    config = lmdb_tier(tmp_path / "db")
    tier, primary = make(config, model="org/a")
    try:
        primary.fill(0, payload(0))
        assert TierDriver(tier).jobs([([key(0)], [0])], False)[0].success
    finally:
        tier.shutdown()
    assert lookups(config, [0], model="org/a") == [HIT]  # another server, same model
    assert lookups(config, [0], model="org/b") == [MISS]
    assert lookups(config, [0], model="org/a", tokens_per_block=32) == [MISS]


class CountingStore:
    """Only what ``present_per_key`` uses: the protocol's per-key ``contains``."""

    def __init__(self, present: set[bytes]) -> None:
        self.present = present
        self.calls = 0

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        self.calls += 1
        return [k in self.present for k in keys]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=24))
def test_presence_per_key_is_exact_in_one_store_call(flags: list[bool]) -> None:
    keys = [bytes([i]) * 32 for i in range(len(flags))]
    store = CountingStore({k for k, f in zip(keys, flags, strict=True) if f})
    assert present_per_key(cast(StorageBackend, store), keys) == flags
    assert store.calls == 1  # a window with holes is one call, not one per hole


def test_a_store_keeps_the_first_page_of_a_chunk(tmp_path: Path) -> None:
    tier, primary = make(lmdb_tier(tmp_path / "db"))
    driver = TierDriver(tier)
    try:
        primary.fill(0, payload(0))
        primary.fill(1, payload(7))
        assert driver.jobs([([key(0)], [0])], False)[0].success
        assert driver.jobs([([key(0)], [1])], False)[0].success  # already there: skipped
        assert driver.jobs([([key(0)], [2])], True)[0].success
        assert primary.chunk(2) == payload(0)
    finally:
        tier.shutdown()


def test_a_partial_load_reports_what_loaded_and_counts_the_rest_once(tmp_path: Path) -> None:
    tier, primary = make(lmdb_tier(tmp_path / "db"))
    driver = TierDriver(tier)
    try:
        primary.fill(0, payload(0))
        assert driver.jobs([([key(0)], [0])], False)[0].success
        for c in (3, 4, 5):
            primary.fill(c, b"\x5a" * CHUNK)
        result = driver.jobs([([key(1), key(0), key(2)], [3, 4, 5])], True)[0]
        assert not result.success
        assert result.successful_keys is not None and set(result.successful_keys) == {key(0)}
        assert [primary.chunk(c) for c in (3, 4, 5)] == [
            b"\x5a" * CHUNK,
            payload(0),
            b"\x5a" * CHUNK,
        ]
        stats = tier.get_stats()
        assert stats is not None
        assert stats.reduce()[TierMetrics.LOAD_FAILED_CHUNKS] == 2
        assert tier.get_stats() is None  # reported once
        assert driver.lookup([key(1), key(0), key(2)]) == [MISS, HIT, MISS]
    finally:
        tier.shutdown()


def test_chunk_ids_outside_the_primary_tier_fail_the_job_and_touch_nothing(tmp_path: Path) -> None:
    tier, primary = make(lmdb_tier(tmp_path / "db"))
    driver = TierDriver(tier)
    try:
        primary.fill(0, payload(0))
        assert driver.jobs([([key(0)], [0])], False)[0].success
        before = [primary.chunk(c) for c in range(8)]
        bad = driver.jobs([([key(0)], [8]), ([key(0)], [-1]), ([key(0), key(1)], [1])], True)
        assert [r.success for r in bad] == [False, False, False]
        assert not driver.jobs([([key(5)], [9])], False)[0].success
        assert [primary.chunk(c) for c in range(8)] == before
        assert driver.lookup([key(5)]) == [MISS]
        stats = tier.get_stats()
        assert stats is not None and stats.reduce()[TierMetrics.BACKEND_ERRORS] == 4
        assert driver.jobs([([key(0)], [3])], True)[0].success  # the workers live on
        assert primary.chunk(3) == payload(0)
    finally:
        tier.shutdown()


def test_only_stored_chunks_are_announced_and_only_with_vllms_events_on(tmp_path: Path) -> None:
    primary = PrimaryBuffer(8, CHUNK)
    for events_on in (True, False):
        spec = cpu_offloading_spec(CHUNK, 8, kv_events=events_on)
        config = {**lmdb_tier(tmp_path / f"db-{events_on}"), "enable_kv_events": True}
        tier = create_tier(config, primary, spec)
        assert isinstance(tier, HicacheTier)
        driver = TierDriver(tier)
        try:
            primary.fill(0, payload(0))
            assert not driver.jobs([([key(1)], [9])], False)[0].success
            assert driver.jobs([([key(0)], [0])], False)[0].success
            stored = [k for e in tier.take_events() if not e.removed for k in e.keys]
            assert stored == ([key(0)] if events_on else [])
        finally:
            tier.shutdown()
