"""The fault-injecting property test (``test_fault_stateful``) under the ``cost``
policy, with storage reads that stall and are cut at their deadline.

Everything of ``FaultMachine`` (failing copies held and reordered, junk in
freed device slots, bit-for-bit KV checks, unfinished requests, resets,
``check_integrity`` after every step), plus: a store whose reads can stall
at a chosen piece, a fake clock that the machine moves past a read's
deadline, so that the request goes on with the pages that arrived while the
stalled piece and its job land later (or stay stalled across other steps).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import initialize, precondition, rule

import hicache.tiers.storage as storage_tier
from hicache.bench.engine.throttle import ThrottledBackend
from hicache.cache import HiRadixCache
from hicache.config.cache import CacheConfig, DeviceConfig, HostConfig, ModelConfig, PolicyConfig
from hicache.factory import build_device_pool, build_host_pool
from storage_backends import StorageConfig
from storage_backends.memory import MemoryBackend
from tests.hicache.fake_clock import FakeClock
from tests.hicache.test_fault_stateful import FaultMachine, junk_on_free, namespaces, tokens
from transfer import CpuTransferEngine, FaultInjection


class StallingStore(ThrottledBackend):
    """A fast store on the fake clock whose ``stall_at``-th get waits for ``opened``."""

    def __init__(self, inner: MemoryBackend, clock: FakeClock) -> None:
        super().__init__(inner, 1e8, sleep=clock.advance, clock=clock)
        self.gets = 0
        self.stall_at = 0
        self.stalled = threading.Event()
        self.opened = threading.Event()
        self._count = threading.Lock()

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        with self._count:
            self.gets += 1
            stall = self.gets == self.stall_at
        if stall:
            self.stalled.set()
            self.opened.wait(10)
        return super().get(keys, dst)

    def open(self) -> None:
        self.opened.set()
        self.stall_at = 0


def build(page_size: int, seed: int, fail_every: int, clock: FakeClock) -> HiRadixCache:
    cfg = CacheConfig(
        model=ModelConfig(num_layers=2, kv_heads=2, head_dim=4, dtype="float32"),
        device=DeviceConfig(device="cpu", page_size=page_size, num_tokens=64),
        host=HostConfig(enabled=True, ratio=0.5, reserve_gb=0.0),
        policy=PolicyConfig(
            load_back_threshold=1,
            prefetch_threshold=1,
            prefetch_policy="cost",
            prefill_tokens_per_s=1e4,
        ),
        storage=StorageConfig(backend="memory", max_bytes=1 << 20, timeout_s=0.05),
    )
    device = build_device_pool(cfg)
    host = build_host_pool(cfg, device)
    assert host is not None
    faults = FaultInjection(hold=True, reorder=True, seed=seed, fail_every=fail_every)
    store = StallingStore(MemoryBackend(cfg.storage), clock)
    engine = CpuTransferEngine(device, host, faults=faults)
    return HiRadixCache(cfg, device, host, engine, store, clock=clock)


class CutMachine(FaultMachine):
    store: StallingStore

    @initialize(
        page_size=st.sampled_from([1, 2, 4]),
        seed=st.integers(0, 2**16),
        fail_every=st.sampled_from([0, 3, 5]),
        measured=st.booleans(),
    )
    def setup(self, page_size: int, seed: int, fail_every: int, measured: bool) -> None:
        self._pieces = storage_tier.PIECE_BYTES
        storage_tier.PIECE_BYTES = 1  # reads in up to 8 pieces: cuts keep some
        self.clock = FakeClock()
        self.cache = build(page_size, seed, fail_every, self.clock)
        inner = self.cache.storage.backend._backend  # type: ignore[union-attr]  # the guard's
        assert isinstance(inner, StallingStore)
        self.store = inner
        if measured:  # else cold start: the timeout budget bounds each wait
            self.cache.observer.rates.record_s2h(1 << 20, 0.01)
        junk_on_free(self.cache)
        self.locks = []
        self.running = []
        self.n = 0

    def _maybe_prefetch(self, seq: list[int], ns: str | None) -> None:
        c = self.cache
        m = c.match_prefix(seq, ns)
        rid = f"r{self.n}"
        self.n += 1
        if not c.prefetch(rid, seq, ns, m.last_host_node):
            return
        self._settle(rid)
        status = c.check_prefetch(rid)
        if not status.ready:  # move past its deadline (or timeout budget) on the fake clock
            self.clock.advance(status.wait_s + 1e-3)
            status = c.check_prefetch(rid)
        assert status.ready
        before = c.stats().prefetch_cuts
        c.release_prefetch(rid)
        c.check_integrity()
        if c.stats().prefetch_cuts > before:
            event(f"cut with {'pages' if status.fetched_tokens else 'nothing'} arrived")

    def _settle(self, rid: str) -> None:
        """Until the read stalls at its armed piece or ends (a bounded wait)."""
        for _ in range(2000):
            if self.store.stalled.is_set() or self.cache.check_prefetch(rid).done:
                return
            self.cache.wait_prefetch(rid, timeout_s=0.001)

    @rule(seq=tokens, ns=namespaces, at=st.integers(1, 4), keep_stalled=st.booleans())
    def cut_request(self, seq: list[int], ns: str | None, at: int, keep_stalled: bool) -> None:
        """A request whose prompt only storage holds, read until its ``at``-th
        piece stalls and cut at its deadline; its reused KV is checked bit for
        bit. The stalled piece lands now, or later (``unstall``)."""
        c = self.cache
        if self.store.stall_at > self.store.gets or not self._fits(len(seq)):
            return
        self.request(seq, ns, True, False)
        self._engine().release()
        c.drain()
        c.evict(10**9)
        c.evict_host(10**9)
        self.stall(at)
        self.request(seq, ns, True, True)
        if not keep_stalled:
            self.unstall()

    @rule(at=st.integers(1, 4))
    def stall(self, at: int) -> None:
        """The ``at``-th next read piece stalls until ``unstall``."""
        if self.store.stall_at <= self.store.gets:
            self.store.stalled.clear()
            self.store.opened.clear()
            self.store.stall_at = self.store.gets + at

    @precondition(lambda self: hasattr(self, "store") and self.store.stall_at > 0)
    @rule()
    def unstall(self) -> None:
        self.store.open()
        self.cache.drain()

    @rule(seconds=st.floats(0.0, 60.0))
    def wait(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.open()
        try:
            super().teardown()
        finally:
            if hasattr(self, "_pieces"):
                storage_tier.PIECE_BYTES = self._pieces


CutMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
TestCutMachine = CutMachine.TestCase
