"""Property test: random match / insert / lock / unlock / evict against a model."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hicache.cache import HiRadixCache
from hicache.policies.eviction import EVICTION_POLICIES
from hicache.tree.radix_tree import TreeNode
from tests.hicache.helpers import device_only, run_request

tokens = st.lists(st.integers(0, 3), min_size=0, max_size=14)
namespaces = st.sampled_from([None, "a"])


class DeviceCacheMachine(RuleBasedStateMachine):
    """The model is the set of cached page-aligned prefixes, per namespace."""

    cache: HiRadixCache

    @initialize(
        page_size=st.sampled_from([1, 2, 4]), eviction=st.sampled_from(sorted(EVICTION_POLICIES))
    )
    def setup(self, page_size: int, eviction: str) -> None:
        self.ps = page_size
        self.cache = device_only(page_size, pages=48 // page_size, eviction=eviction)
        self.model: set[tuple[str | None, tuple[int, ...]]] = set()
        self.locks: list[tuple[TreeNode, str | None, tuple[int, ...]]] = []

    def _expected_hit(self, seq: list[int], ns: str | None) -> int:
        best = 0
        for end in range(self.ps, len(seq) + 1, self.ps):
            if (ns, tuple(seq[:end])) in self.model:
                best = end
        return best

    def _cached_prefixes(self) -> set[tuple[str | None, tuple[int, ...]]]:
        out = set()
        for node in self.cache.tree.nodes():
            full = self.cache.tree.prefix_tokens(node)
            start = len(full) - len(node.key)
            for end in range(start + self.ps, len(full) + 1, self.ps):
                out.add((node.namespace, tuple(full[:end])))
        return out

    @rule(seq=tokens, ns=namespaces, priority=st.integers(0, 2))
    def insert(self, seq: list[int], ns: str | None, priority: int) -> None:
        cap = self.cache.device_pool.allocator.capacity
        if len(seq) + self.ps > cap - self.cache.protected_size():
            return
        assert self.cache.match_prefix(seq, ns).device_hit_length == self._expected_hit(seq, ns)
        run_request(self.cache, seq, ns, priority=priority)  # may evict others to make room
        new = {(ns, tuple(seq[:end])) for end in range(self.ps, len(seq) + 1, self.ps)}
        cached = self._cached_prefixes()
        assert new <= cached and cached <= self.model | new
        self.model = cached

    @rule(seq=tokens, ns=namespaces)
    def match(self, seq: list[int], ns: str | None) -> None:
        m = self.cache.match_prefix(seq, ns)
        assert m.device_hit_length == self._expected_hit(seq, ns)
        assert m.device_indices.numel() == m.device_hit_length

    @rule(seq=tokens, ns=namespaces)
    def lock(self, seq: list[int], ns: str | None) -> None:
        m = self.cache.match_prefix(seq, ns)
        self.cache.inc_lock_ref(m.last_device_node)
        self.locks.append((m.last_device_node, ns, tuple(seq[: m.device_hit_length])))

    @precondition(lambda self: bool(self.locks))
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        idx = data.draw(st.integers(0, len(self.locks) - 1))
        node, _, _ = self.locks.pop(idx)
        self.cache.dec_lock_ref(node)

    @rule(n=st.integers(0, 40))
    def evict(self, n: int) -> None:
        before = self.cache.evictable_size()
        res = self.cache.evict(n)
        assert res.freed >= min(n, before) or self.cache.evictable_size() == 0
        after = self._cached_prefixes()
        assert after <= self.model
        for _, ns, prefix in self.locks:
            if prefix:
                assert (ns, prefix) in after, "a locked prefix was evicted"
        self.model = after

    @invariant()
    def integrity(self) -> None:
        if not hasattr(self, "cache"):
            return
        self.cache.check_integrity()
        alloc = self.cache.device_pool.allocator
        held = self.cache.evictable_size() + self.cache.protected_size()
        assert alloc.available() + held + self.cache.request_held_size() == alloc.capacity

    def teardown(self) -> None:
        if not hasattr(self, "cache"):
            return
        for node, _, _ in self.locks:
            self.cache.dec_lock_ref(node)
        assert self.cache.protected_size() == 0
        self.cache.evict(10**9)
        alloc = self.cache.device_pool.allocator
        assert alloc.available() == alloc.capacity


DeviceCacheMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDeviceCache = DeviceCacheMachine.TestCase
