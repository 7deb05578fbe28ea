"""Misuse found in issue 10 ("Wrong KV served later"): each bad call raises
before anything changes, and what the cache held is still served bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from hicache.cache import HiRadixCache
from hicache.tree.errors import CacheError
from storage_backends import StorageConfig
from tests.hicache.helpers import serve, two_tier, write_kv

PS = 4


class Snapshot(NamedTuple):
    evictable: int
    protected: int
    request_held: int
    device_free: int


def snapshot(cache: HiRadixCache) -> Snapshot:
    return Snapshot(
        cache.evictable_size(),
        cache.protected_size(),
        cache.request_held_size(),
        cache.device_pool.allocator.available(),
    )


def seq(tag: int, n: int = 16) -> list[int]:
    return [tag * 1000 + i for i in range(n)]


@pytest.fixture
def cache() -> HiRadixCache:
    c = two_tier(page_size=PS, pages=32)
    yield c
    c.close()


def _refused(cache: HiRadixCache, call: object, *args: object) -> None:
    """``call(*args)`` raises ValueError (CacheError included) and changes nothing."""
    before = snapshot(cache)
    with pytest.raises(ValueError):
        call(*args)  # type: ignore[operator]
    cache.check_integrity()
    assert snapshot(cache) == before


def _reuse_every_free_slot(cache: HiRadixCache) -> None:
    """Another request takes (and overwrites) every free device slot."""
    other = seq(900, cache.device_pool.allocator.available())
    slots = cache.alloc_device(len(other))
    assert slots is not None
    write_kv(cache, other, 0, slots)
    cache.free_device(slots)


def test_free_device_refuses_tree_owned_slots(cache: HiRadixCache) -> None:
    a = seq(1)
    serve(cache, a)
    held = cache.alloc_device(16)  # so the count check alone cannot catch it
    assert held is not None
    tree_slots = cache.match_prefix(a).device_indices
    _refused(cache, cache.free_device, tree_slots)
    cache.free_device(held)
    _reuse_every_free_slot(cache)
    assert serve(cache, a) == 16  # checked bit for bit


@pytest.mark.parametrize("kind", ["duplicated", "misaligned", "another_nodes"])
def test_finished_request_refuses_foreign_slots(cache: HiRadixCache, kind: str) -> None:
    a, b = seq(1), seq(2)
    serve(cache, a)
    m = cache.match_prefix(b)
    cache.inc_lock_ref(m.last_device_node)
    new = cache.alloc_device(16)
    assert new is not None
    if kind == "duplicated":
        bad = torch.cat([new[:PS], new[:PS], new[2 * PS :]])
    elif kind == "misaligned":
        bad = torch.cat([new[1:], new[:1]])
    else:
        bad = torch.cat([cache.match_prefix(a).device_indices[:PS], new[PS:]])
    write_kv(cache, b, 0, new)
    _refused(cache, cache.cache_finished_req, b, bad, m.last_device_node)
    cache.cache_finished_req(b, new, m.last_device_node)
    cache.check_integrity()
    _reuse_every_free_slot(cache)
    assert serve(cache, a) == 16
    assert serve(cache, b) == 16


def test_out_of_range_slots_refused_before_insert(cache: HiRadixCache) -> None:
    b = seq(2)
    m = cache.match_prefix(b)
    cache.inc_lock_ref(m.last_device_node)
    new = cache.alloc_device(16)
    assert new is not None
    beyond = torch.arange(16, dtype=torch.int64) + cache.device_pool.allocator.capacity
    _refused(cache, cache.cache_finished_req, b, beyond, m.last_device_node)
    cache.free_device(new)
    cache.dec_lock_ref(m.last_device_node)
    cache.drain()
    assert cache.protected_size() == 0 and cache.request_held_size() == 0
    assert cache.match_prefix(b).device_hit_length == 0


def test_finishing_twice_keeps_the_other_requests_lock(cache: HiRadixCache) -> None:
    shared = seq(1, 8)
    a, b = [*shared, *seq(2, 8)], [*shared, *seq(3, 8)]
    serve(cache, shared)
    locks = []
    for tokens in (a, b):
        m = cache.match_prefix(tokens)
        cache.inc_lock_ref(m.last_device_node)
        new = cache.alloc_device(8)
        assert new is not None
        write_kv(cache, tokens, 8, new)
        locks.append((tokens, torch.cat([m.device_indices, new]), m.last_device_node))
    tokens, slots, last = locks[0]
    cache.cache_finished_req(tokens, slots, last)
    _refused(cache, cache.cache_finished_req, tokens, slots, last)
    cache.evict(10**6)
    assert cache.match_prefix(b).device_hit_length >= 8  # b's prefix still locked
    cache.cache_finished_req(*locks[1])
    cache.check_integrity()


def test_prefetch_refuses_a_node_off_the_tokens_path(tmp_path: Path) -> None:
    storage = StorageConfig(backend="memory", path="", max_bytes=64 << 20)
    cache = two_tier(page_size=PS, pages=32, storage=storage)
    a, b = seq(1), seq(2)
    serve(cache, a)
    cache.drain()
    cache.evict(10**6)
    cache.evict_host(10**6)
    serve(cache, b)
    cache.drain()
    off_path = cache.match_prefix(b).last_host_node
    _refused(cache, cache.prefetch, "r", a, None, off_path)
    cache.close()


@pytest.mark.parametrize("namespace", [5, b"tenant", ("t",), 1.5])
def test_namespace_must_be_str_or_none(cache: HiRadixCache, namespace: object) -> None:
    b = seq(2)
    new = cache.alloc_device(16)
    assert new is not None
    write_kv(cache, b, 0, new)
    _refused(cache, cache.insert, b, new, namespace)
    _refused(cache, cache.match_prefix, b, namespace)
    cache.free_device(new)


def test_tokens_must_be_a_sequence_not_a_mapping(cache: HiRadixCache) -> None:
    _refused(cache, cache.match_prefix, {i: 0 for i in range(16)})


@pytest.mark.parametrize("size", [1.5, -1, "4", True])
def test_alloc_device_size_names_the_argument(cache: HiRadixCache, size: object) -> None:
    before = snapshot(cache)
    with pytest.raises(ValueError, match="num_tokens"):
        cache.alloc_device(size)  # type: ignore[arg-type]
    assert snapshot(cache) == before


def test_failed_allocation_says_what_holds_the_pool(cache: HiRadixCache) -> None:
    a = seq(1, 32)
    serve(cache, a)
    m = cache.match_prefix(a)
    cache.inc_lock_ref(m.last_device_node)
    held = cache.alloc_device(64)
    assert held is not None
    assert cache.alloc_device(64) is None
    short = cache.device_shortfall(64)
    assert (short.needed, short.locked, short.request_held) == (64, 32, 64)
    assert short.free == cache.device_pool.allocator.available() < 64
    assert "32 locked" in str(short) and "64 held by requests" in str(short)
    cache.free_device(held)
    cache.dec_lock_ref(m.last_device_node)
    cache.check_integrity()


@pytest.mark.parametrize("finished", [True, False])
@pytest.mark.parametrize("extra", [0, 1])  # a partial last page or none
def test_tree_slots_past_the_locked_node_are_refused(
    cache: HiRadixCache, finished: bool, extra: int
) -> None:
    """A request that matched before another inserted the same tokens must
    not pass that request's (now tree-owned) slots as its own past the node it
    locked: refused before anything changes, its own slots still its own."""
    tokens = seq(4, 3 * PS + extra)
    m = cache.match_prefix(tokens)  # nothing cached yet: the root is locked
    cache.inc_lock_ref(m.last_device_node)
    mine = cache.alloc_device(len(tokens))
    assert mine is not None
    serve(cache, tokens)  # another request inserts the same tokens
    tree = cache.match_prefix(tokens).device_indices
    slots = torch.cat([tree, mine[len(tree) : len(tokens)]])
    call = cache.cache_finished_req if finished else cache.cache_unfinished_req
    _refused(cache, call, tokens, slots, m.last_device_node)
    cache.cache_finished_req(tokens, mine[: len(tokens)], m.last_device_node)  # its own: fine
    if extra == 0:
        cache.free_device(mine[len(tokens) :])
    cache.drain()  # backups in flight hold locks until their acks
    cache.check_integrity()
    assert cache.protected_size() == 0 and cache.request_held_size() == 0


def test_a_partial_page_outside_the_pool_is_refused(cache: HiRadixCache) -> None:
    """The partial last page is freed by its first slot's page: a slot past
    the pool (page-aligned, so the layout check passes) is refused before
    anything changes, and the request's own slots are accepted afterwards."""
    tokens = seq(6, 2 * PS + 1)
    m = cache.match_prefix(tokens)
    cache.inc_lock_ref(m.last_device_node)
    mine = cache.alloc_device(len(tokens))
    assert mine is not None
    outside = torch.tensor([cache.device_pool.allocator.capacity], dtype=torch.int64)
    slots = torch.cat([mine[: 2 * PS], outside])
    _refused(cache, cache.cache_finished_req, tokens, slots, m.last_device_node)
    cache.cache_finished_req(tokens, mine[: len(tokens)], m.last_device_node)
    cache.drain()  # backups in flight hold locks until their acks
    cache.check_integrity()
    assert cache.protected_size() == 0 and cache.request_held_size() == 0


@pytest.mark.parametrize("tail", [[1], [0, 2], [1, 0], [0, 1, 3]])  # offsets into one page
def test_a_partial_page_not_in_order_from_its_start_is_refused(
    cache: HiRadixCache, tail: list[int]
) -> None:
    """The partial last page's slots must be its page's first slots, in order:
    anything else is refused before anything changes."""
    tokens = seq(7, 2 * PS + len(tail))
    m = cache.match_prefix(tokens)
    cache.inc_lock_ref(m.last_device_node)
    mine = cache.alloc_device(len(tokens))
    assert mine is not None
    start = int(mine[2 * PS])
    slots = torch.cat([mine[: 2 * PS], torch.tensor([start + t for t in tail])])
    with pytest.raises(CacheError, match="partial last page"):
        cache.cache_finished_req(tokens, slots, m.last_device_node)
    _refused(cache, cache.cache_finished_req, tokens, slots, m.last_device_node)
    cache.cache_finished_req(tokens, mine[: len(tokens)], m.last_device_node)
    cache.drain()
    cache.check_integrity()
    assert cache.protected_size() == 0 and cache.request_held_size() == 0
