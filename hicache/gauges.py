"""The sizes a Prometheus scrape reads across a cache's parts (``Gauges``).

Runs on the metrics server's thread: it only reads (allocator counts, the
residency tree's accounting, the backend's ``stats()``, which is thread-safe).
"""

from __future__ import annotations

from device_pool import DeviceKVPool
from hicache.observe.prometheus import Gauges
from hicache.policies.rates import Rates
from hicache.tiers.residency import ResidencyTree
from host_pool import HostKVPool
from transfer.storage_io import StorageIO


def read_gauges(
    device_pool: DeviceKVPool,
    host_pool: HostKVPool | None,
    residency: ResidencyTree,
    storage: StorageIO | None,
    rates: Rates,
) -> Gauges:
    """Tokens held per tier and their capacities, the store's size and counters,
    and the measured rates, now."""
    host = host_capacity = 0
    if host_pool is not None:
        alloc = host_pool.allocator
        host, host_capacity = alloc.capacity - alloc.available(), alloc.capacity
    store = storage.backend.stats() if storage is not None else None
    return Gauges(
        residency.device_tokens(),
        host,
        residency.protected_size(),
        device_capacity_tokens=device_pool.allocator.capacity,
        host_capacity_tokens=host_capacity,
        bytes_per_token=device_pool.shape.bytes_per_token,
        storage_bytes=store.bytes_used if store else 0,
        storage_capacity_bytes=store.capacity_bytes if store else 0,
        storage_pages=store.entries if store else 0,
        storage=store,
        rates=rates.snapshot(),
    )
