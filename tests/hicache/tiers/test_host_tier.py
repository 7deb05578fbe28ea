from __future__ import annotations

import pytest
import torch

from hicache.cache import CacheError
from tests.hicache.helpers import serve, two_tier
from transfer import FaultInjection


def seq(tag: int, n: int) -> list[int]:
    return [tag * 1000 + i for i in range(n)]


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_demote_and_load_back_bit_identical(layout: str, page_size: int, attention: str) -> None:
    cache = two_tier(page_size, pages=8, layout=layout, attention=attention, dtype="bfloat16")
    a = seq(1, 4 * page_size)
    serve(cache, a)
    cache.drain()
    res = cache.evict(10**6)
    assert res.demoted == 4 * page_size and res.deleted == 0
    m = cache.match_prefix(a)
    assert m.device_hit_length == 0 and m.host_hit_length == 4 * page_size
    assert serve(cache, a) == 4 * page_size  # loaded back and checked bit for bit
    cache.drain()
    cache.check_integrity()
    assert cache.match_prefix(a).device_hit_length == 4 * page_size
    cache.close()


def test_partial_load_back_extends_device_prefix() -> None:
    cache = two_tier(4, pages=16)
    a = seq(1, 16)
    serve(cache, a[:8])
    serve(cache, a)  # two nodes of 8 tokens
    cache.drain()
    cache.evict(8)  # the deeper node goes to host
    m = cache.match_prefix(a)
    assert (m.device_hit_length, m.host_hit_length) == (8, 8)
    assert serve(cache, [*a, *seq(2, 8)]) == 16
    cache.drain()
    cache.close()


def test_write_through_backs_up_every_insert() -> None:
    cache = two_tier(4, faults=FaultInjection(hold=True))
    serve(cache, seq(1, 8))
    assert cache.protected_size() == 8  # locked until the backup's ack is applied
    cache.transfer.release()  # type: ignore[union-attr]
    cache.drain()
    assert cache.protected_size() == 0
    assert cache.evict(8).demoted == 8
    cache.check_integrity()
    cache.close()


def test_write_through_selective_waits_for_hits() -> None:
    cache = two_tier(4, write_policy="write_through_selective")
    a = seq(1, 8)
    serve(cache, a)
    cache.drain()
    assert cache.evict(8).deleted == 8  # never hit: no host copy
    serve(cache, a)
    cache.match_prefix(a)
    cache.match_prefix(a)  # second hit: backed up now
    cache.drain()
    assert cache.evict(8).demoted == 8
    cache.close()


def test_write_back_backs_up_on_eviction_under_pressure() -> None:
    cache = two_tier(4, pages=8, host_ratio=4.0, write_policy="write_back")
    seqs = [seq(t, 12) for t in range(1, 8)]
    for s in seqs:
        serve(cache, s)  # each request evicts the previous ones
    cache.drain()
    for s in seqs:
        m = cache.match_prefix(s)
        assert m.device_hit_length + m.host_hit_length == 12
    for s in seqs:
        assert serve(cache, s) == 12  # bit-identical after write-back and load-back
    cache.drain()
    cache.close()


def test_host_full_evicts_host_leaves_for_new_backups() -> None:
    cache = two_tier(4, pages=8, host_ratio=1.0)  # host holds 32 tokens
    for t in range(1, 6):
        serve(cache, seq(t, 8))
        cache.drain()
        cache.evict(8)
    hits = [cache.match_prefix(seq(t, 8)).host_hit_length for t in range(1, 6)]
    assert hits == [0, 8, 8, 8, 8]  # the oldest host-only leaf made room
    cache.check_integrity()
    cache.close()


def test_host_full_without_host_leaves_stays_device_only() -> None:
    cache = two_tier(4, pages=8, host_ratio=0.25)  # host holds 8 tokens
    serve(cache, seq(1, 8))
    serve(cache, seq(2, 8))  # host full of a device+host node: no backup
    cache.drain()
    assert cache.protected_size() == 0
    res = cache.evict(16)
    assert (res.demoted, res.deleted) == (8, 8)
    cache.check_integrity()
    cache.close()


def test_evict_host_deletes_host_only_leaves() -> None:
    cache = two_tier(4)
    serve(cache, seq(1, 8))
    cache.drain()
    cache.evict(8)
    assert cache.evict_host(1) == 8
    m = cache.match_prefix(seq(1, 8))
    assert m.device_hit_length == 0 and m.host_hit_length == 0
    cache.check_integrity()
    cache.close()


def test_load_back_threshold_skips_small_loads() -> None:
    cache = two_tier(4, load_back_threshold=16)
    a = seq(1, 8)
    serve(cache, a)
    cache.drain()
    cache.evict(8)
    m = cache.match_prefix(a)
    lb = cache.init_load_back(m.last_host_node, m.host_hit_length)
    assert lb.loaded_tokens == 0 and lb.last_node is m.last_device_node
    cache.check_integrity()
    cache.close()


def test_failed_backup_keeps_node_device_only() -> None:
    cache = two_tier(4, faults=FaultInjection(fail_every=1))
    serve(cache, seq(1, 8))
    cache.drain()
    assert cache.protected_size() == 0
    assert cache.evict(8).deleted == 8  # no host copy to demote to
    cache.check_integrity()
    cache.close()


def test_failed_load_is_never_matched_and_is_retired() -> None:
    cache = two_tier(4, faults=FaultInjection(fail_every=2))  # op 1 ok (backup), op 2 fails
    a = seq(1, 8)
    serve(cache, a)
    cache.drain()
    cache.evict(8)
    m = cache.match_prefix(a)
    lb = cache.init_load_back(m.last_host_node, m.host_hit_length)
    assert lb.loaded_tokens == 8
    cache.start_loading()
    cache.drain()
    assert cache.match_prefix(a).device_hit_length == 0
    cache.poll()
    m = cache.match_prefix(a)
    # Retired with its host copy: the next request recomputes instead of
    # failing the same load again.
    assert m.device_hit_length == 0 and m.host_hit_length == 0
    cache.check_integrity()
    cache.close()


def test_completions_late_and_out_of_order() -> None:
    faults = FaultInjection(hold=True, reorder=True, seed=3)
    cache = two_tier(4, pages=32, faults=faults)
    for t in range(1, 5):
        serve(cache, seq(t, 8))
    assert cache.protected_size() == 32  # every backup still unacknowledged
    assert cache.evict(10**6).freed == 0
    cache.transfer.release()  # type: ignore[union-attr]
    cache.drain()
    assert cache.protected_size() == 0
    assert cache.evict(10**6).demoted == 32
    for t in range(1, 5):
        assert serve(cache, seq(t, 8)) == 8
    cache.transfer.release()  # type: ignore[union-attr]
    cache.drain()
    cache.check_integrity()
    cache.close()


def test_reset_frees_both_tiers() -> None:
    cache = two_tier(4)
    serve(cache, seq(1, 8))
    cache.reset()
    assert cache.device_pool.allocator.available() == cache.device_pool.allocator.capacity
    assert cache.host_pool is not None
    assert cache.host_pool.allocator.available() == cache.host_pool.allocator.capacity
    cache.check_integrity()
    cache.close()


def test_host_disabled_has_no_host_operations() -> None:
    from tests.hicache.helpers import device_only

    cache = device_only(4)
    assert cache.host_pool is None and cache.evict_host(10) == 0
    assert cache.poll().total == 0
    cache.start_loading()
    cache.wait_layer(0)
    assert torch.equal(cache.match_prefix([1, 2, 3, 4]).device_indices, torch.empty(0).long())


def test_admit_loads_back_and_locks() -> None:
    cache = two_tier(4, pages=16)
    a = seq(1, 16)
    serve(cache, a[:8])
    serve(cache, a)
    cache.drain()
    cache.evict(8)
    adm = cache.admit(cache.match_prefix(a))
    assert adm.loaded_tokens == 8 and adm.device_indices.numel() == 16
    assert adm.last_node.lock_ref >= 1 and cache.protected_size() == 16
    cache.start_loading()
    cache.drain()
    cache.dec_lock_ref(adm.last_node)
    assert cache.protected_size() == 0
    cache.check_integrity()
    cache.close()


def test_match_settles_a_failed_load_from_an_earlier_batch() -> None:
    cache = two_tier(4, faults=FaultInjection(fail_every=2))  # the load (op 2) fails
    a = seq(1, 8)
    serve(cache, a)
    cache.drain()
    cache.evict(8)
    adm = cache.admit(cache.match_prefix(a))
    assert adm.loaded_tokens == 8
    cache.start_loading()
    # The engine's forward pass would see wait_layer raise; a new match must
    # not hand the failed copy out as a device hit, even before poll().
    m = cache.match_prefix(a)
    assert m.device_hit_length == 0
    cache.dec_lock_ref(adm.last_node)
    cache.poll()
    m = cache.match_prefix(a)
    assert m.device_hit_length == 0 and m.host_hit_length == 0  # a failed load is a miss
    cache.check_integrity()
    cache.close()


def test_use_after_close_changes_nothing() -> None:
    cache = two_tier(4)
    a = seq(1, 8)
    serve(cache, a)
    cache.drain()
    cache.evict(8)
    m = cache.match_prefix(a)
    cache.close()
    with pytest.raises(CacheError):
        cache.init_load_back(m.last_host_node, m.host_hit_length)
    serve(cache, seq(2, 8))  # device-only from here on: no backup, no leak
    cache.check_integrity()
    assert cache.protected_size() == 0
