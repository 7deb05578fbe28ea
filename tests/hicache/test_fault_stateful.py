"""Property test with failing copies, unfinished requests, unawaited prefetches
and resets; freed device slots are overwritten with junk so that any reuse of
freed or never-loaded KV shows up in the bit-for-bit checks."""

from __future__ import annotations

import contextlib

import hypothesis.strategies as st
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hicache.cache import HiRadixCache
from hicache.policies.write import WRITE_POLICIES
from hicache.tree.errors import CacheError
from hicache.tree.radix_tree import TreeNode
from storage_backends import StorageConfig
from tests.hicache.helpers import expected_kv, two_tier, write_kv
from transfer import CpuTransferEngine, FaultInjection, TransferError

tokens = st.lists(st.integers(0, 2), min_size=0, max_size=20)
namespaces = st.sampled_from([None, "a"])
Running = tuple[list[int], str | None, torch.Tensor, TreeNode]


def kv_ok(cache: HiRadixCache, toks: list[int], slots: torch.Tensor) -> bool:
    pool = cache.device_pool
    for layer in range(pool.shape.num_layers):
        for b, buf in enumerate(pool.layer_buffers(layer)):
            if not torch.equal(buf[slots], expected_kv(cache, toks[: slots.numel()], layer, b)):
                return False
    return True


def junk_on_free(cache: HiRadixCache) -> None:
    """Make the device allocator overwrite what it frees."""
    alloc, pool = cache.device_pool.allocator, cache.device_pool
    free = alloc.free

    def free_and_scribble(slots: torch.Tensor) -> None:
        for layer in range(pool.shape.num_layers):
            for buf in pool.layer_buffers(layer):
                buf[slots] = -99.0
        free(slots)

    alloc.free = free_and_scribble  # type: ignore[method-assign]


class FaultMachine(RuleBasedStateMachine):
    cache: HiRadixCache

    @initialize(
        page_size=st.sampled_from([1, 2, 4]),
        policy=st.sampled_from(sorted(WRITE_POLICIES)),
        seed=st.integers(0, 2**16),
        fail_every=st.sampled_from([0, 2, 3, 5]),
        with_storage=st.booleans(),
    )
    def setup(
        self, page_size: int, policy: str, seed: int, fail_every: int, with_storage: bool
    ) -> None:
        # Completions are held until released: runs are deterministic.
        faults = FaultInjection(hold=True, reorder=True, seed=seed, fail_every=fail_every)
        storage = StorageConfig(backend="memory", max_bytes=1 << 20) if with_storage else None
        self.cache = two_tier(
            page_size,
            pages=64 // page_size,
            host_ratio=0.5,
            write_policy=policy,
            faults=faults,
            storage=storage,
            prefetch_policy="best_effort",
        )
        junk_on_free(self.cache)
        self.locks: list[TreeNode] = []
        self.running: list[Running] = []
        self.n = 0

    def _engine(self) -> CpuTransferEngine:
        engine = self.cache.transfer
        assert isinstance(engine, CpuTransferEngine)
        return engine

    def _fits(self, n: int) -> bool:
        c = self.cache
        free = c.device_pool.allocator.capacity - c.protected_size() - c.request_held_size()
        return 2 * n + 2 * c.page_size <= free

    def _maybe_prefetch(self, seq: list[int], ns: str | None) -> None:
        c = self.cache
        m = c.match_prefix(seq, ns, with_storage=True)
        rid = f"r{self.n}"
        self.n += 1
        if c.prefetch(rid, seq, ns, m.last_host_node):
            c.check_prefetch(rid)
            c.release_prefetch(rid)  # not waited for: it lands whenever it lands

    @rule(seq=tokens, ns=namespaces, finish=st.booleans(), prefetch=st.booleans())
    def request(self, seq: list[int], ns: str | None, finish: bool, prefetch: bool) -> None:
        c = self.cache
        if not self._fits(len(seq)):
            self._engine().release()
            c.drain()
            return
        if prefetch and c.storage is not None:
            self._maybe_prefetch(seq, ns)
        prefix, last, _ = c.admit(c.match_prefix(seq, ns))
        c.start_loading()
        try:
            for layer in range(c.device_pool.shape.num_layers):
                c.wait_layer(layer)
        except TransferError:  # the engine retracts the batch
            c.dec_lock_ref(last)
            c.drain()
            return
        assert kv_ok(c, seq, prefix), "reused KV differs"
        n_new = len(seq) - prefix.numel()
        new = c.alloc_device(n_new)
        assert new is not None
        write_kv(c, seq, prefix.numel(), new[:n_new])
        slots = torch.cat([prefix, new[:n_new]])
        if finish:
            c.cache_finished_req(seq, slots, last, ns)
        else:
            res = c.cache_unfinished_req(seq, slots, last, ns)
            slots = torch.cat([res.device_indices, slots[res.device_indices.numel() :]])
            assert kv_ok(c, seq, slots), "unfinished request's KV differs"
            self.running.append((seq, ns, slots, res.last_node))
        c.poll()

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def finish_running(self, data: st.DataObject) -> None:
        idx = data.draw(st.integers(0, len(self.running) - 1))
        seq, ns, slots, last = self.running.pop(idx)
        assert kv_ok(self.cache, seq, slots), "running request's KV changed"
        self.cache.cache_finished_req(seq, slots, last, ns)

    @rule(seq=tokens, ns=namespaces)
    def admit_and_hold(self, seq: list[int], ns: str | None) -> None:
        if self._fits(len(seq)):
            self.locks.append(self.cache.admit(self.cache.match_prefix(seq, ns)).last_node)
            self.cache.start_loading()

    @rule(seq=tokens, ns=namespaces)
    def match_check(self, seq: list[int], ns: str | None) -> None:
        c = self.cache
        c.start_loading()  # a new batch that loads nothing; the match settles old loads
        assert kv_ok(c, seq, c.match_prefix(seq, ns).device_indices), "matched KV differs"

    @precondition(lambda self: bool(self.locks))
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        self.cache.dec_lock_ref(self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1))))

    @rule(n=st.integers(0, 40))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @rule(n=st.integers(0, 40))
    def evict_host(self, n: int) -> None:
        self.cache.evict_host(n)

    @rule(n=st.integers(1, 4))
    def deliver(self, n: int) -> None:
        self._engine().release(n)
        self.cache.poll()

    @rule()
    def reset(self) -> None:
        self._engine().release()
        with contextlib.suppress(CacheError):  # refused while requests hold locks
            self.cache.reset()

    @invariant()
    def integrity(self) -> None:
        if hasattr(self, "cache"):
            self.cache.check_integrity()

    def teardown(self) -> None:
        if not hasattr(self, "cache"):
            return
        c = self.cache
        self._engine().release()
        c.drain()
        for seq, ns, slots, last in self.running:
            c.cache_finished_req(seq, slots, last, ns)
        for node in self.locks:
            c.dec_lock_ref(node)
        self._engine().release()
        c.drain()
        c.check_integrity()
        assert c.protected_size() == 0 and c.request_held_size() == 0
        for _ in range(20):  # a failed write-back backup keeps its node: go again
            c.evict(10**9)
            self._engine().release()
            c.drain()
            c.evict_host(10**9)
        dev, host = c.device_pool.allocator, c.host_pool
        assert dev.available() == dev.capacity
        assert host is not None and host.allocator.available() == host.allocator.capacity
        c.close()


FaultMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
TestFaultMachine = FaultMachine.TestCase
