"""State machine: every kind of bad call interleaved with good ones.

Each bad call raises ValueError (CacheError/SlotError included) before any
change; ``check_integrity()`` holds after every step; every hit hands back
the KV that was written for those tokens, bit for bit; after draining,
nothing is locked and no slot leaks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import hypothesis.strategies as st
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hicache.cache import HiRadixCache
from hicache.tree.radix_tree import TreeNode
from storage_backends import StorageConfig
from tests.hicache.helpers import check_kv, device_only, serve, two_tier, write_kv

PS = 4
# Few distinct tokens: sequences share prefixes, so matches, splits and locks interact.
sequences = st.lists(st.integers(0, 2), min_size=PS, max_size=6 * PS).map(
    lambda toks: [t * 7 + i % PS for i, t in enumerate(toks)]
)


SLOT_DAMAGE = ["dup", "shift", "range", "foreign", "float", "tail"]


class Request(NamedTuple):
    tokens: list[int]
    slots: torch.Tensor
    last: TreeNode


class Snapshot(NamedTuple):
    evictable: int
    protected: int
    request_held: int
    device_free: int
    host_reserved: int


class MisuseMachine(RuleBasedStateMachine):
    cache: HiRadixCache

    @initialize()
    def setup(self) -> None:
        storage = StorageConfig(backend="memory", max_bytes=16 << 20)
        self.cache = two_tier(page_size=PS, pages=40, host_ratio=1.0, storage=storage)
        self.stranger = device_only(PS, pages=8)  # nodes of another cache
        self.open: list[Request] = []
        self.finished: list[Request] = []

    # good calls -------------------------------------------------------------
    @rule(tokens=sequences)
    def start_request(self, tokens: list[int]) -> None:
        if len(self.open) >= 3:
            return
        cache = self.cache
        prefix, last, _ = cache.admit(cache.match_prefix(tokens))
        cache.start_loading()
        check_kv(cache, tokens, prefix)
        n_new = len(tokens) - prefix.numel()
        new = cache.alloc_device(n_new)
        if new is None:
            cache.dec_lock_ref(last)
            return
        write_kv(cache, tokens, prefix.numel(), new[:n_new])
        slots = torch.cat([prefix, new[:n_new]])
        if new.numel() > n_new:  # the partial page's unused slots go back now
            cache.free_device(new[n_new:]) if n_new % PS == 0 else None
        self.open.append(Request(tokens, slots, last))

    @precondition(lambda self: bool(self.open))
    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        req = self.open.pop(data.draw(st.integers(0, len(self.open) - 1)))
        self.cache.cache_finished_req(req.tokens, req.slots, req.last)
        self.finished = [*self.finished[-4:], req]

    @rule(tokens=sequences)
    def serve_one(self, tokens: list[int]) -> None:
        if self.cache.protected_size() + len(tokens) + PS <= 40 * PS // 2:
            serve(self.cache, tokens)  # KV of every reused page checked bit for bit

    @rule(n=st.integers(0, 64))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @rule(n=st.integers(0, 64))
    def evict_host(self, n: int) -> None:
        self.cache.evict_host(n)

    @rule()
    def drain(self) -> None:
        self.cache.drain()

    @rule()
    def poll(self) -> None:
        self.cache.poll()

    # bad calls ----------------------------------------------------------------
    def _refused(self, call: Callable[[], object]) -> None:
        before = self._snapshot()
        try:
            call()
        except ValueError:
            pass
        else:
            raise AssertionError("a bad call was accepted")
        assert self._snapshot() == before, "a refused call changed the cache"

    def _snapshot(self) -> Snapshot:
        c = self.cache
        return Snapshot(
            c.evictable_size(),
            c.protected_size(),
            c.request_held_size(),
            c.device_pool.allocator.available(),
            c.host_reserved_size(),
        )

    @rule(tokens=sequences)
    def bad_free_tree_slots(self, tokens: list[int]) -> None:
        tree_slots = self.cache.match_prefix(tokens).device_indices
        if tree_slots.numel():
            self._refused(lambda: self.cache.free_device(tree_slots))

    @precondition(lambda self: bool(self.open))
    @rule(
        data=st.data(), kind=st.sampled_from(["dup", "shift", "range", "foreign", "float", "tail"])
    )
    def bad_finish_slots(self, data: st.DataObject, kind: str) -> None:
        req = self.open[data.draw(st.integers(0, len(self.open) - 1))]
        slots = req.slots.clone()
        if kind == "dup" and slots.numel() >= 2 * PS:
            slots[-PS:] = slots[:PS]
        elif kind == "shift":
            slots = torch.roll(slots, 1)
        elif kind == "range":
            slots[-1] = self.cache.device_pool.allocator.capacity + 3
        elif kind == "foreign":
            # Another node's (tree-owned) page where the request's own belongs.
            # (Another open request's pages cannot be told apart: the allocator
            # knows a page is request-held, not by which request.)
            tree = self.cache.match_prefix(data.draw(sequences)).device_indices
            own = slots.numel() // PS * PS
            if tree.numel() < PS or own - PS < self._depth(req.last):
                return
            slots[own - PS : own] = tree[:PS]
        elif kind == "tail" and slots.numel() % PS > 1:
            slots[-1] = slots[-2]  # the partial page's slots out of order
        elif kind == "float":
            slots = slots.to(torch.float32)
        else:
            return
        self._refused(lambda: self.cache.cache_finished_req(req.tokens, slots, req.last))

    @precondition(lambda self: bool(self.finished))
    @rule(data=st.data())
    def bad_finish_twice(self, data: st.DataObject) -> None:
        req = self.finished[data.draw(st.integers(0, len(self.finished) - 1))]
        if req.last.tree is None or req.last.lock_ref == 0:
            self._refused(lambda: self.cache.cache_finished_req(req.tokens, req.slots, req.last))
            return
        depth = sum(1 for _ in self.cache.tree.path_to_root(req.last))
        if depth and len(req.tokens) // PS * PS > self._depth(req.last):
            self._refused(lambda: self.cache.cache_finished_req(req.tokens, req.slots, req.last))

    def _depth(self, node: TreeNode) -> int:
        return sum(len(n.key) for n in self.cache.tree.path_to_root(node))

    @rule(tokens=sequences, ns=st.sampled_from([5, b"t", 1.5, ("a",)]))
    def bad_namespace(self, tokens: list[int], ns: object) -> None:
        self._refused(lambda: self.cache.match_prefix(tokens, ns))  # type: ignore[arg-type]
        slots = torch.zeros(len(tokens), dtype=torch.int64)
        self._refused(lambda: self.cache.insert(tokens, slots, ns))  # type: ignore[arg-type]

    @rule(bad=st.sampled_from([{1: 2}, [-1, 3], [1.5], "abcd", [2**31]]))
    def bad_tokens(self, bad: object) -> None:
        self._refused(lambda: self.cache.match_prefix(bad))  # type: ignore[arg-type]

    @rule(size=st.sampled_from([1.5, -1, "4", None, True]))
    def bad_sizes(self, size: object) -> None:
        self._refused(lambda: self.cache.alloc_device(size))  # type: ignore[arg-type]
        self._refused(lambda: self.cache.evict(size))  # type: ignore[arg-type]
        self._refused(lambda: self.cache.evict_host(size))  # type: ignore[arg-type]
        root = self.cache.tree.root
        self._refused(lambda: self.cache.init_load_back(root, size))  # type: ignore[arg-type]

    @rule(tokens=sequences, request_id=st.sampled_from([None, 3, b"r", ("r",)]))
    def bad_request_id(self, tokens: list[int], request_id: object) -> None:
        root = self.cache.tree.root
        self._refused(lambda: self.cache.prefetch(request_id, tokens, None, root))  # type: ignore[arg-type]

    @rule(a=sequences, b=sequences)
    def bad_prefetch_off_path(self, a: list[int], b: list[int]) -> None:
        node = self.cache.match_prefix(b).last_host_node
        if (
            node is self.cache.tree.root
            or self.cache.tree.prefix_tokens(node) == a[: self._depth(node)]
        ):
            return
        self._refused(lambda: self.cache.prefetch("bad", a, None, node))

    @rule(tokens=sequences)
    def bad_foreign_node(self, tokens: list[int]) -> None:
        stranger = self.stranger.match_prefix(tokens).last_device_node
        self._refused(lambda: self.cache.inc_lock_ref(stranger))
        self._refused(lambda: self.cache.dec_lock_ref(stranger))

    @rule(tokens=sequences)
    def bad_unlock(self, tokens: list[int]) -> None:
        node = self.cache.match_prefix(tokens).last_device_node
        if node is not self.cache.tree.root and node.lock_ref == 0:
            self._refused(lambda: self.cache.dec_lock_ref(node))

    # checks -------------------------------------------------------------------
    @invariant()
    def integrity(self) -> None:
        if hasattr(self, "cache"):
            self.cache.check_integrity()

    def teardown(self) -> None:
        if not hasattr(self, "cache"):
            return
        for req in self.open:
            self.cache.cache_finished_req(req.tokens, req.slots, req.last)
        self.cache.drain()
        self.cache.check_integrity()
        assert self.cache.protected_size() == 0, "a lock leaked"
        assert self.cache.request_held_size() == 0, "request slots leaked"
        self.cache.evict(10**9)
        self.cache.evict_host(10**9)
        self.cache.check_integrity()
        device = self.cache.device_pool.allocator
        assert device.available() == device.capacity, "device slots leaked"
        host = self.cache.host_pool
        assert host is not None and host.allocator.available() == host.allocator.capacity
        self.cache.close()
        self.stranger.close()


MisuseMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestMisuse = MisuseMachine.TestCase
