"""Property test with the host tier (and optionally storage): completions
arrive late and out of order; every reused token's KV is checked bit for bit."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hicache.cache import HiRadixCache
from hicache.policies.write import WRITE_POLICIES
from hicache.tree.radix_tree import TreeNode
from storage_backends import StorageConfig
from tests.hicache.helpers import serve, two_tier
from transfer import CpuTransferEngine, FaultInjection

tokens = st.lists(st.integers(0, 3), min_size=0, max_size=16)
namespaces = st.sampled_from([None, "a"])


class HostCacheMachine(RuleBasedStateMachine):
    """Every served request checks its reused KV bit for bit (``serve``)."""

    cache: HiRadixCache

    @initialize(
        page_size=st.sampled_from([1, 2, 4]),
        policy=st.sampled_from(sorted(WRITE_POLICIES)),
        layout=st.sampled_from(["layer_first", "page_first"]),
        seed=st.integers(0, 2**16),
        with_storage=st.booleans(),
    )
    def setup(
        self, page_size: int, policy: str, layout: str, seed: int, with_storage: bool
    ) -> None:
        faults = FaultInjection(hold=True, reorder=True, seed=seed)
        storage = StorageConfig(backend="memory", max_bytes=1 << 20) if with_storage else None
        self.cache = two_tier(
            page_size,
            pages=64 // page_size,
            host_ratio=1.0,
            write_policy=policy,
            layout=layout,
            faults=faults,
            storage=storage,
        )
        self.locks: list[TreeNode] = []

    def _engine(self) -> CpuTransferEngine:
        engine = self.cache.transfer
        assert isinstance(engine, CpuTransferEngine)
        return engine

    @rule(seq=tokens, ns=namespaces)
    def request(self, seq: list[int], ns: str | None) -> None:
        free = self.cache.device_pool.allocator.capacity - self.cache.protected_size()
        if 2 * len(seq) + 2 * self.cache.page_size > free:
            self._engine().release()
            self.cache.drain()
            return
        serve(self.cache, seq, ns)

    @rule(seq=tokens, ns=namespaces)
    def lock(self, seq: list[int], ns: str | None) -> None:
        m = self.cache.match_prefix(seq, ns)
        self.cache.inc_lock_ref(m.last_device_node)
        self.locks.append(m.last_device_node)

    @precondition(lambda self: bool(self.locks))
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        node = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.cache.dec_lock_ref(node)

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

    @invariant()
    def integrity(self) -> None:
        if hasattr(self, "cache"):
            self.cache.check_integrity()

    def teardown(self) -> None:
        if not hasattr(self, "cache"):
            return
        self._engine().release()
        self.cache.drain()
        for node in self.locks:
            self.cache.dec_lock_ref(node)
        self.cache.check_integrity()
        assert self.cache.protected_size() == 0 and self.cache.request_held_size() == 0
        self.cache.evict(10**9)
        self.cache.drain()  # storage writes started by write-back pin host copies
        self.cache.evict_host(10**9)
        dev, host = self.cache.device_pool.allocator, self.cache.host_pool
        assert dev.available() == dev.capacity
        assert host is not None and host.allocator.available() == host.allocator.capacity
        self.cache.close()


HostCacheMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestHostCache = HostCacheMachine.TestCase
