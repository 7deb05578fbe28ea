from __future__ import annotations

import pytest
import torch

from device_pool import SlotError
from hicache.cache import CacheError
from hicache.policies.eviction import EVICTION_POLICIES
from tests.hicache.helpers import device_only, run_request


@pytest.fixture(params=[1, 16, 64])
def page_size(request: pytest.FixtureRequest) -> int:
    return request.param


def test_match_empty_cache(page_size: int) -> None:
    cache = device_only(page_size)
    m = cache.match_prefix(list(range(3 * page_size)))
    assert m.device_hit_length == 0 and m.host_hit_length == 0
    assert m.last_device_node is cache.tree.root
    cache.check_integrity()


def test_insert_then_match_is_page_aligned(page_size: int) -> None:
    cache = device_only(page_size)
    tokens = list(range(3 * page_size + page_size // 2 + 1))
    run_request(cache, tokens)
    aligned = len(tokens) // page_size * page_size
    m = cache.match_prefix(tokens)
    assert m.device_hit_length == aligned
    assert cache.evictable_size() == aligned
    # The partial tail page was freed, so nothing is held by requests.
    assert cache.request_held_size() == 0
    cache.check_integrity()


def test_split_when_match_ends_inside_node(page_size: int) -> None:
    cache = device_only(page_size)
    run_request(cache, list(range(4 * page_size)))
    before = cache.match_prefix(list(range(4 * page_size))).device_indices
    m = cache.match_prefix([*range(2 * page_size), *[9999] * page_size])
    assert m.device_hit_length == 2 * page_size
    assert torch.equal(m.device_indices, before[: 2 * page_size])
    assert len(m.last_device_node.key) == 2 * page_size
    assert len(m.last_device_node.children) == 1
    cache.check_integrity()
    # The split did not change what is cached.
    assert torch.equal(cache.match_prefix(list(range(4 * page_size))).device_indices, before)


def test_branching_and_duplicates_are_freed(page_size: int) -> None:
    cache = device_only(page_size)
    a = [*range(2 * page_size), *range(100, 100 + 2 * page_size)]
    b = [*range(2 * page_size), *range(200, 200 + 2 * page_size)]
    run_request(cache, a)
    run_request(cache, b)
    assert cache.evictable_size() == 6 * page_size
    free_before = cache.device_pool.allocator.available()
    # A request that computed everything itself: its duplicates must be freed.
    slots = cache.alloc_device(len(a))
    assert slots is not None
    res = cache.insert(a, slots)
    assert res.prefix_len == len(a)
    cache.free_device(torch.empty(0, dtype=torch.int64))
    assert cache.device_pool.allocator.available() == free_before
    assert cache.request_held_size() == 0
    cache.check_integrity()


def test_namespaces_never_share(page_size: int) -> None:
    cache = device_only(page_size)
    tokens = list(range(2 * page_size))
    run_request(cache, tokens, "a")
    assert cache.match_prefix(tokens, "b").device_hit_length == 0
    assert cache.match_prefix(tokens).device_hit_length == 0
    run_request(cache, tokens, "b")
    ma, mb = cache.match_prefix(tokens, "a"), cache.match_prefix(tokens, "b")
    assert ma.device_hit_length == mb.device_hit_length == len(tokens)
    assert set(ma.device_indices.tolist()).isdisjoint(mb.device_indices.tolist())
    assert ma.last_device_node is not mb.last_device_node
    cache.check_integrity()


def test_lock_accounting_and_errors(page_size: int) -> None:
    cache = device_only(page_size)
    tokens = list(range(3 * page_size))
    run_request(cache, tokens)
    node = cache.match_prefix(tokens).last_device_node
    cache.inc_lock_ref(node)
    cache.inc_lock_ref(node)
    assert cache.protected_size() == 3 * page_size and cache.evictable_size() == 0
    assert cache.evict(10**6).freed == 0
    cache.dec_lock_ref(node)
    cache.dec_lock_ref(node)
    assert cache.protected_size() == 0
    with pytest.raises(CacheError):
        cache.dec_lock_ref(node)
    other = device_only(page_size)
    run_request(other, tokens)
    with pytest.raises(CacheError):
        cache.inc_lock_ref(other.match_prefix(tokens).last_device_node)
    cache.check_integrity()


def test_unfinished_moves_lock(page_size: int) -> None:
    cache = device_only(page_size)
    tokens = list(range(2 * page_size + 1))
    last = run_request(cache, tokens, finish=False)
    aligned = len(tokens) // page_size * page_size
    assert last.lock_ref == 1 and cache.protected_size() == aligned
    # The partial tail page, if any, stays the request's.
    assert cache.request_held_size() == (page_size if aligned < len(tokens) else 0)
    longer = [*tokens, *range(500, 500 + 2 * page_size)]
    m = cache.match_prefix(longer)
    assert m.last_device_node is last
    slots = cache.alloc_device(len(longer) - m.device_hit_length)
    assert slots is not None
    cache.free_device(slots)
    cache.check_integrity()


def test_eviction_lru_order(page_size: int) -> None:
    cache = device_only(page_size)
    seqs = [[i * 1000 + j for j in range(2 * page_size)] for i in range(1, 4)]
    for s in seqs:
        run_request(cache, s)
    cache.match_prefix(seqs[0])  # touch the oldest: now the second is LRU
    res = cache.evict(1)
    assert res.freed == 2 * page_size and res.deleted == 2 * page_size
    assert cache.match_prefix(seqs[1]).device_hit_length == 0
    assert cache.match_prefix(seqs[0]).device_hit_length == 2 * page_size
    cache.check_integrity()


def test_eviction_lfu_order(page_size: int) -> None:
    cache = device_only(page_size, eviction="lfu")
    seqs = [[i * 1000 + j for j in range(page_size)] for i in range(1, 4)]
    for s in seqs:
        run_request(cache, s)
    for _ in range(3):
        cache.match_prefix(seqs[0])
        cache.match_prefix(seqs[2])
    cache.evict(1)
    assert cache.match_prefix(seqs[1]).device_hit_length == 0
    assert cache.match_prefix(seqs[0]).device_hit_length == page_size
    cache.check_integrity()


def test_eviction_fifo_order(page_size: int) -> None:
    cache = device_only(page_size, eviction="fifo")
    seqs = [[i * 1000 + j for j in range(page_size)] for i in range(1, 4)]
    for s in seqs:
        run_request(cache, s)
    for _ in range(3):
        cache.match_prefix(seqs[0])  # use does not save the first inserted
    cache.evict(1)
    assert cache.match_prefix(seqs[0]).device_hit_length == 0
    assert cache.match_prefix(seqs[1]).device_hit_length == page_size
    cache.evict(1)
    assert cache.match_prefix(seqs[1]).device_hit_length == 0
    assert cache.match_prefix(seqs[2]).device_hit_length == page_size
    cache.check_integrity()


def test_eviction_priority_order(page_size: int) -> None:
    cache = device_only(page_size, eviction="priority")
    seqs = [[i * 1000 + j for j in range(page_size)] for i in range(1, 4)]
    for s, priority in zip(seqs, (2, 0, 1), strict=True):
        run_request(cache, s, priority=priority)
    cache.match_prefix(seqs[1])  # recent use does not outrank priority
    cache.evict(1)
    assert cache.match_prefix(seqs[1]).device_hit_length == 0
    cache.evict(1)
    assert cache.match_prefix(seqs[2]).device_hit_length == 0
    assert cache.match_prefix(seqs[0]).device_hit_length == page_size
    # A later request of higher priority raises a shared prefix's priority.
    run_request(cache, seqs[1], priority=0)
    run_request(cache, [*seqs[1], *range(50, 50 + page_size)], priority=3)
    cache.evict(1)
    assert cache.match_prefix(seqs[0]).device_hit_length == 0
    cache.check_integrity()


@pytest.mark.parametrize("eviction", sorted(EVICTION_POLICIES))
def test_every_eviction_policy_spares_locked_prefixes(eviction: str) -> None:
    cache = device_only(4, pages=8, eviction=eviction)
    keep = list(range(8))
    m_node = run_request(cache, keep, finish=False)  # locked, in use
    for tag in range(1, 6):
        run_request(cache, [tag * 100 + j for j in range(8)])  # forces eviction
    assert cache.match_prefix(keep).device_hit_length == 8
    res = cache.evict(10**6)
    assert res.freed == res.deleted > 0
    assert cache.evictable_size() == 0 and cache.device_tokens() == 8
    cache.dec_lock_ref(m_node)
    cache.check_integrity()


def test_parent_joins_heap_after_children_go(page_size: int) -> None:
    cache = device_only(page_size)
    base = list(range(page_size))
    run_request(cache, [*base, *range(100, 100 + page_size)])
    run_request(cache, [*base, *range(200, 200 + page_size)])
    res = cache.evict(3 * page_size)
    assert res.freed == 3 * page_size
    assert cache.evictable_size() == 0 and cache.device_pool.allocator.available() == (
        cache.device_pool.allocator.capacity
    )
    cache.check_integrity()


def test_bad_tokens_rejected_before_touching_tree() -> None:
    cache = device_only(4)
    run_request(cache, list(range(8)))
    snapshot = cache.pretty_print()
    for bad in ([1, 2, -1, 4], [1, 2, 2**31, 4], [1.5, 2, 3, 4], "abcd", torch.ones(4)):
        with pytest.raises(ValueError):
            cache.match_prefix(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            cache.insert(bad, torch.arange(4, dtype=torch.int64))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3, 4], torch.arange(3, dtype=torch.int64))
    assert cache.pretty_print() == snapshot
    cache.check_integrity()


def test_tensor_tokens_accepted() -> None:
    cache = device_only(4)
    run_request(cache, list(range(8)))
    assert cache.match_prefix(torch.arange(8)).device_hit_length == 8


def test_reset_and_pretty_print() -> None:
    cache = device_only(4)
    run_request(cache, list(range(8)))
    assert "TreeNode" in cache.pretty_print()
    node = cache.match_prefix(list(range(8))).last_device_node
    cache.inc_lock_ref(node)
    with pytest.raises(CacheError):
        cache.reset()
    cache.dec_lock_ref(node)
    cache.reset()
    assert cache.match_prefix(list(range(8))).device_hit_length == 0
    assert cache.device_pool.allocator.available() == cache.device_pool.allocator.capacity
    with pytest.raises(CacheError):
        cache.inc_lock_ref(node)  # from before the reset
    cache.check_integrity()


def test_page_keys_cached_and_split_consistently() -> None:
    cache = device_only(4)
    tokens = list(range(16))
    run_request(cache, tokens)
    node = cache.match_prefix(tokens).last_device_node
    whole = cache.node_page_keys(node)
    assert len(whole) == 4
    cache.match_prefix([0, 1, 2, 3, 4, 5, 6, 7, 99, 99, 99, 99])  # split after 2 pages
    upper = cache.match_prefix(tokens[:8]).last_device_node
    assert cache.node_page_keys(upper) + cache.node_page_keys(node) == whole


def test_tree_owned_slots_cannot_be_freed_or_inserted_again() -> None:
    cache = device_only(page_size=4)
    a, b = list(range(16)), list(range(100, 116))
    run_request(cache, a)
    tree_slots = cache.match_prefix(a).device_indices
    with pytest.raises(SlotError):
        cache.free_device(tree_slots[:4])  # a tree page, not the request's
    m = cache.match_prefix(b)
    cache.inc_lock_ref(m.last_device_node)
    with pytest.raises(SlotError):  # a's slots passed off as b's KV
        cache.cache_finished_req(b, tree_slots, m.last_device_node)
    cache.check_integrity()
    cache.dec_lock_ref(m.last_device_node)
    assert cache.match_prefix(a).device_hit_length == 16
    assert cache.match_prefix(b).device_hit_length == 0
    cache.check_integrity()


def test_match_result_slots_are_the_callers_copy(page_size: int) -> None:
    """The tree keeps its slots to itself: writing into a match's
    ``device_indices`` (or a node's ``device`` read back as a tensor) of a
    caller's copy never changes what the tree serves."""
    cache = device_only(page_size)
    tokens = list(range(3 * page_size))
    run_request(cache, tokens)
    m = cache.match_prefix(tokens)
    served = m.device_indices.clone()
    m.device_indices.fill_(0)
    again = cache.match_prefix(tokens)
    assert torch.equal(again.device_indices, served)
    node = again.last_device_node
    assert node.device is not None and node.device.dtype == torch.int64
    assert torch.equal(node.device, served[-len(node.key) :])
    cache.check_integrity()
