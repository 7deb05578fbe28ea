"""A backup's completion after the node it copies was split while the copy was in
flight: the completion covers both parts (the copy ran over the whole node), unlocks
the node the backup locked, and, when the copy failed, drops the host slots of every
part. ``test_fault_stateful`` reaches this state only in some draws; here it is
reached on purpose, every run, for each write policy that backs up in the background.

Completions are held until the test releases them (``FaultInjection(hold=True)``); a
match that ends inside the node splits it meanwhile. ``check_integrity()`` after every
step; the KV that comes back from host is compared bit for bit (``serve``).
"""

from __future__ import annotations

import pytest

from hicache.cache import HiRadixCache
from tests.hicache.helpers import serve, two_tier
from transfer import CpuTransferEngine, FaultInjection

PAGE = 4
TOKENS = list(range(1, 4 * PAGE + 1))  # one node of four pages
# Matches that end inside the node, each splitting it once more (pages 1, 3, 2).
SPLITS = ([*TOKENS[:PAGE], 99], [*TOKENS[: 3 * PAGE], 99], [*TOKENS[: 2 * PAGE], 98])


def engine(cache: HiRadixCache) -> CpuTransferEngine:
    transfer = cache.transfer
    assert isinstance(transfer, CpuTransferEngine)
    return transfer


def cache_with_a_backup_in_flight(policy: str, fail: bool) -> HiRadixCache:
    """A cache whose only node is being backed up (its completion held)."""
    faults = FaultInjection(hold=True, fail_every=1 if fail else 0)
    cache = two_tier(PAGE, pages=16, host_ratio=2.0, write_policy=policy, faults=faults)
    serve(cache, TOKENS)  # write_through: its backup starts at the insert
    if policy == "write_through_selective":  # ... on the second hit
        for _ in range(2):
            cache.match_prefix(TOKENS)
            cache.check_integrity()
    return cache


def split_then_complete(cache: HiRadixCache, splits: int) -> None:
    for tokens in SPLITS[:splits]:
        assert cache.match_prefix(tokens).device_hit_length < len(TOKENS)
        cache.check_integrity()
    assert engine(cache).release(1, timeout=10.0) == 1, "no backup was in flight"
    cache.poll()
    cache.check_integrity()


def all_free(cache: HiRadixCache) -> None:
    """Nothing locked any more: everything can be evicted from both tiers."""
    cache.evict(10**9)
    cache.evict_host(10**9)
    cache.check_integrity()
    dev, host = cache.device_pool.allocator, cache.host_pool
    assert dev.available() == dev.capacity, "a node is still locked on the device"
    assert host is not None and host.allocator.available() == host.allocator.capacity


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("policy", ["write_through", "write_through_selective"])
def test_a_backup_that_lands_after_its_node_split_unlocks_and_backs_up_every_part(
    policy: str, splits: int
) -> None:
    cache = cache_with_a_backup_in_flight(policy, fail=False)
    split_then_complete(cache, splits)
    cache.evict(10**9)  # every part unlocked, with a host copy: demoted, not deleted
    cache.check_integrity()
    assert cache.device_pool.allocator.available() == cache.device_pool.allocator.capacity
    assert cache.match_prefix(TOKENS).host_hit_length == len(TOKENS)
    engine(cache).release()  # loads go through as they finish from here on
    assert serve(cache, TOKENS) == len(TOKENS)  # loaded back from host, bit for bit
    engine(cache).release(timeout=10.0)
    cache.drain()
    all_free(cache)
    cache.close()


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("policy", ["write_through", "write_through_selective"])
def test_a_failed_backup_that_lands_after_its_node_split_drops_every_parts_host_copy(
    policy: str, splits: int
) -> None:
    cache = cache_with_a_backup_in_flight(policy, fail=True)
    split_then_complete(cache, splits)
    assert cache.protected_size() == 0, "a part is still locked by the failed backup"
    host = cache.host_pool
    assert host is not None and host.allocator.available() == host.allocator.capacity, (
        "a part kept host slots the failed copy never filled"
    )
    cache.close()
