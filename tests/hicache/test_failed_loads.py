"""Failed load-backs: their KV is never handed out, in any path through the cache."""

from __future__ import annotations

import pytest
import torch

from storage_backends import StorageConfig
from tests.hicache.helpers import expected_kv, serve, two_tier, write_kv
from transfer import FaultInjection, TransferError


def seq(tag: int, n: int) -> list[int]:
    return [tag * 1000 + i for i in range(n)]


def failing_load(tokens: list[int], pages: int = 16):  # type: ignore[no-untyped-def]
    """A cache whose next load-back (op 2) fails, with ``tokens`` on host only
    and junk in the freed device slots."""
    cache = two_tier(4, pages=pages, faults=FaultInjection(fail_every=2))
    serve(cache, tokens)
    cache.drain()
    cache.evict(len(tokens))
    for layer in range(cache.device_pool.shape.num_layers):
        for buf in cache.device_pool.layer_buffers(layer):
            buf.fill_(-7)
    return cache


def test_split_of_a_failed_node_is_not_matched() -> None:
    a = seq(1, 8)
    cache = failing_load(a)
    adm = cache.admit(cache.match_prefix(a))
    assert adm.loaded_tokens == 8
    cache.start_loading()
    assert cache.match_prefix(a).device_hit_length == 0
    assert cache.match_prefix(a[:4]).device_hit_length == 0  # splits the failed node
    cache.dec_lock_ref(adm.last_node)
    cache.poll()
    cache.check_integrity()
    cache.close()


def test_insert_through_a_failed_node_keeps_the_requests_kv() -> None:
    a = seq(1, 12)
    cache = failing_load(a[:8])
    cache.admit(cache.match_prefix(a[:8]))  # this request's load fails
    cache.start_loading()
    m = cache.match_prefix(a)  # another request: the failure is applied
    assert m.device_hit_length == 0
    cache.inc_lock_ref(m.last_device_node)
    slots = cache.alloc_device(12)
    assert slots is not None
    write_kv(cache, a, 0, slots)
    res = cache.cache_unfinished_req(a, slots, m.last_device_node)
    cache.check_integrity()
    n = res.device_indices.numel()
    own = torch.cat([res.device_indices, slots[n:]])  # what the request reads next
    for layer in range(cache.device_pool.shape.num_layers):
        for b, buf in enumerate(cache.device_pool.layer_buffers(layer)):
            assert torch.equal(buf[own], expected_kv(cache, a, layer, b))
    cache.cache_finished_req(a, own, res.last_node)
    cache.check_integrity()
    cache.close()


def test_failed_load_launched_by_drain_is_reported_to_wait_layer() -> None:
    a = seq(1, 8)
    cache = failing_load(a)
    adm = cache.admit(cache.match_prefix(a))
    assert adm.loaded_tokens == 8
    assert cache.alloc_device(64) is None  # a second request does not fit ...
    cache.drain()  # ... so the engine waits for in-flight work,
    cache.start_loading()  # then runs the batch:
    with pytest.raises(TransferError):
        cache.wait_layer(0)
    cache.dec_lock_ref(adm.last_node)
    cache.poll()
    cache.start_loading()  # the next batch loads nothing: no stale failure
    cache.wait_layer(0)
    cache.check_integrity()
    cache.close()


def test_selective_backup_in_a_match_cannot_evict_the_matched_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = StorageConfig(backend="file", path=str(tmp_path / "store"), max_bytes=1 << 24)
    a = seq(1, 16)
    writer = two_tier(4, pages=16, storage=store)
    serve(writer, a)
    writer.close()
    cache = two_tier(
        4, pages=16, host_ratio=0.125, write_policy="write_through_selective", storage=store
    )
    m = cache.match_prefix(a[:8])
    cache.inc_lock_ref(m.last_device_node)
    new = cache.alloc_device(8)
    assert new is not None
    write_kv(cache, a[:8], 0, new)
    cache.cache_finished_req(a[:8], new, m.last_device_node)  # device-only, not hit yet
    m = cache.match_prefix(a)  # first hit
    assert cache.prefetch("r", a, None, m.last_host_node) == 8  # the rest, host-only
    cache.drain()
    cache.release_prefetch("r")
    m = cache.match_prefix(a)  # second hit: backs up the device node; host is full
    assert m.last_host_node.tree is cache.tree and m.host_hit_length == 8
    cache.dec_lock_ref(cache.admit(m).last_node)
    cache.drain()
    cache.check_integrity()
    cache.close()
