"""Under heavy eviction pressure every request finishes, correctly, and nothing leaks.

The device pool is only a few pages larger than one request, so admission
waits, the cache evicts (demoting to host when there is one) and running
requests are retracted and recomputed. ``run_checked`` asserts every cache
invariant after each scheduler tick.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hicache.engine import Request
from tests.hicache.engine.helpers import (
    assert_clean,
    assert_same,
    config,
    engine,
    generate,
    reference,
    tokens,
)


def crowd(seed: int, count: int = 8) -> list[Request]:
    """Requests of about 70 tokens sharing a 40-token prefix, two namespaces."""
    rng = random.Random(seed)
    system = tokens(rng, 40)
    return [
        Request(f"r{i}", tuple(system + tokens(rng, rng.randrange(8, 20))), 12, f"ns{i % 2}")
        for i in range(count)
    ]


def pool_tokens(page_size: int, requests: list[Request], spare_pages: int) -> int:
    longest = max(len(r.prompt) + r.max_new_tokens for r in requests)
    return (-(-longest // page_size) + spare_pages) * page_size


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("tiers", ["device", "host", "storage"])
def test_pressure_finishes_correct_and_clean(tmp_path: Path, page_size: int, tiers: str) -> None:
    requests = crowd(page_size)
    want = generate(reference(), requests)
    device = pool_tokens(page_size, requests, spare_pages=2 if page_size == 16 else 24)
    store = tmp_path / "store" if tiers == "storage" else None
    eng = engine(config(page_size, device, host=tiers == "host", store=store), chunk_size=32)
    got = generate(eng, requests)
    assert_same(got, want)
    assert sum(out.retractions for out in got) > 0, "the pool was meant to be too small"
    assert_clean(eng.cache)
    eng.cache.close()


@pytest.mark.parametrize("page_size", [1, 16])
def test_reference_mode_under_pressure_is_clean(page_size: int) -> None:
    requests = crowd(11, count=5)
    want = generate(reference(), requests)
    device = pool_tokens(page_size, requests, spare_pages=1)
    eng = engine(config(page_size, device), use_cache=False, chunk_size=16)
    assert_same(generate(eng, requests), want)
    assert_clean(eng.cache)


def test_request_larger_than_the_pool_is_refused() -> None:
    eng = engine(config(16, 64))
    with pytest.raises(ValueError, match="device pool"):
        eng.submit(Request("big", tuple(range(60)), 8))
    with pytest.raises(ValueError, match="vocabulary"):
        eng.submit(Request("oov", (1, 2, 10**6), 1))
