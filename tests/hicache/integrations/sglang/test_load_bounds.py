"""The L3 adapter's loads bounded by the deadline the store's measured reads give
(with ``prefill_tokens_per_s``): SGLang's own ``batch_get_v1``, over a store
whose every get takes 50 ms (``tests.faulty_backends:SlowMemory``)."""

from __future__ import annotations

import pytest
import torch
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from hicache.integrations.sglang import HicacheStorage
from tests.hicache.integrations.sglang.helpers import DYNAMIC, ours, sglang_config
from tests.hicache.integrations.sglang.test_storage import PAGES, filled, keys_for

SLOW = "tests.faulty_backends:SlowMemory"


def slow_store(prefill: float | None) -> dict[str, object]:
    extra: dict[str, object] = {**DYNAMIC, "hicache_config": "default", "backend": SLOW}
    if prefill is not None:
        extra["prefill_tokens_per_s"] = prefill
    return extra


def stored(backend: HicacheStorage, seed: int) -> tuple[list[str], torch.Tensor]:
    pool = backend.mem_pool_host
    keys, indices = keys_for(seed), pool.page_indices(range(PAGES))
    assert backend.batch_set_v1(keys, indices) == [True] * PAGES
    for page in range(PAGES):
        pool.fill(page, 900 + page)  # overwrite: what a read brings back shows
    return keys, indices


def measured(backend: HicacheStorage, bytes_per_s: float) -> None:
    assert backend.bounds is not None
    for _ in range(3):
        backend.bounds.rates.record_s2h(1 << 20, (1 << 20) / bytes_per_s)


def test_a_read_past_its_deadline_returns_the_pages_that_arrived() -> None:
    pool = filled()
    backend = ours(pool, slow_store(prefill=1000.0))  # 32 tokens recompute in 32 ms
    keys, indices = stored(backend, 1)
    measured(backend, 1e9)  # expected: microseconds; deadline: a few ms
    hits = backend.batch_get_v1(keys, indices)
    assert hits == [True] + [False] * (PAGES - 1)  # the first piece took 50 ms: cut there
    expected = filled()
    assert torch.equal(pool.get_data_page(0), expected.get_data_page(0))
    assert not torch.equal(pool.get_data_page(1), expected.get_data_page(1))
    backend.close()


def test_a_store_measured_hopeless_is_not_read() -> None:
    pool = filled()
    backend = ours(pool, slow_store(prefill=1e6))
    keys, indices = stored(backend, 2)
    measured(backend, 1e3)
    assert backend.batch_get_v1(keys, indices) == [False] * PAGES
    assert backend.bounds is not None and backend.bounds.rates.snapshot().s2h is not None
    backend.close()


def test_without_a_prefill_speed_every_page_is_read() -> None:
    pool = filled()
    backend = ours(pool, slow_store(prefill=None))
    keys, indices = stored(backend, 3)
    measured(backend, 1e3)
    assert backend.batch_get_v1(keys, indices) == [True] * PAGES
    backend.close()


def test_a_bad_prefill_speed_fails_construction() -> None:
    cfg = sglang_config(slow_store(prefill=-1.0))
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        StorageBackendFactory.create_backend("dynamic", cfg, None)
