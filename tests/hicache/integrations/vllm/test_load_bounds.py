"""vLLM tier loads bounded by the deadline the store's measured reads give (with
``prefill_tokens_per_s``): vLLM's own job flow over a store whose every get
takes 50 ms (``tests.faulty_backends:SlowMemory``)."""

from __future__ import annotations

from hicache.integrations.vllm import HicacheTier, TierMetrics
from hicache.integrations.vllm_cpu import (
    PrimaryBuffer,
    TierDriver,
    cpu_offloading_spec,
    create_tier,
)
from tests.hicache.integrations.vllm.helpers import CHUNK, OURS, key, payload

SLOW = "tests.faulty_backends:SlowMemory"
CHUNKS = 8


def slow_tier(prefill: float | None) -> tuple[HicacheTier, PrimaryBuffer]:
    config: dict[str, object] = {**OURS, "hicache_config": "default", "backend": SLOW}
    if prefill is not None:
        config["prefill_tokens_per_s"] = prefill
    primary = PrimaryBuffer(2 * CHUNKS, CHUNK)
    tier = create_tier(config, primary, cpu_offloading_spec(CHUNK, 2 * CHUNKS))
    assert isinstance(tier, HicacheTier)
    return tier, primary


def store_then_load(tier: HicacheTier, primary: PrimaryBuffer) -> tuple[bool, set[object]]:
    driver = TierDriver(tier)
    for c in range(CHUNKS):
        primary.fill(c, payload(c))
    keys = [key(c) for c in range(CHUNKS)]
    assert driver.jobs([(keys, list(range(CHUNKS)))], False)[0].success
    for _ in range(3):  # measured fast: the load's deadline is a few ms
        tier.bounds.rates.record_s2h(1 << 30, 0.01)
    result = driver.jobs([(keys, list(range(CHUNKS, 2 * CHUNKS)))], True)[0]
    return result.success, set(keys) if result.success else set(result.successful_keys or ())


def test_a_load_past_its_deadline_reports_the_chunks_that_arrived() -> None:
    tier, primary = slow_tier(prefill=1000.0)
    try:
        ok, loaded = store_then_load(tier, primary)
        assert not ok and loaded == {key(0)}  # the first piece took 50 ms: cut there
        assert primary.chunk(CHUNKS) == payload(0)
        stats = tier.get_stats()
        assert stats is not None
        assert stats.reduce()[TierMetrics.LOAD_FAILED_CHUNKS] == CHUNKS - 1
    finally:
        tier.shutdown()


def test_without_a_prefill_speed_every_chunk_is_loaded() -> None:
    tier, primary = slow_tier(prefill=None)
    try:
        ok, loaded = store_then_load(tier, primary)
        assert ok and loaded == {key(c) for c in range(CHUNKS)}
        assert [primary.chunk(CHUNKS + c) for c in range(CHUNKS)] == [
            payload(c) for c in range(CHUNKS)
        ]
    finally:
        tier.shutdown()
