from __future__ import annotations

import struct
import urllib.request
from dataclasses import replace

import zmq

from hicache.cache import HiRadixCache
from hicache.config import EventsConfig
from hicache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ZmqEventPublisher,
    decode_batch,
)
from hicache.metrics import CacheStats
from hicache.prometheus import Gauges, MetricsServer
from storage_backends import StorageConfig
from tests.hicache.helpers import serve, two_tier


def seq(tag: int, n: int) -> list[int]:
    return [tag * 1000 + i for i in range(n)]


def with_events(
    page_size: int = 4, pages: int = 16, storage: bool = False, store_bytes: int = 1 << 24
) -> HiRadixCache:
    store = StorageConfig(backend="memory", max_bytes=store_bytes) if storage else None
    base = two_tier(page_size, pages=pages, storage=store)
    cfg = replace(base.config, events=EventsConfig(endpoint="tcp://127.0.0.1:*"))
    base.close()
    return HiRadixCache(cfg)


class Receiver:
    """A subscriber that reads every batch published so far, checking topic
    and sequence framing."""

    def __init__(self, pub: ZmqEventPublisher) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(pub.endpoint)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
        assert pub.wait_for_subscriber(5.0)
        self.pub, self.expected = pub, 0

    def close(self) -> None:
        self.sub.close(0)
        self.ctx.term()

    def receive(self) -> list[object]:
        events: list[object] = []
        while self.expected < self.pub.sequence:
            assert self.sub.poll(5000), "no KV event batch arrived"
            topic, seq_frame, payload = self.sub.recv_multipart()
            assert topic == b"kv-events"
            assert struct.unpack(">Q", seq_frame)[0] == self.expected
            self.expected += 1
            events.extend(decode_batch(payload))
        return events


def subscribe(cache: HiRadixCache) -> Receiver:
    assert isinstance(cache.events, ZmqEventPublisher)
    return Receiver(cache.events)


def device_pages_from_events(events: list[object]) -> set[bytes]:
    pages: set[bytes] = set()
    for e in events:
        if isinstance(e, BlockStored) and e.medium == "device":
            pages.update(e.block_hashes)
        elif isinstance(e, BlockRemoved) and e.medium == "device":
            pages.difference_update(e.block_hashes)
        elif isinstance(e, AllBlocksCleared):
            pages.clear()
    return pages


def device_pages_of_tree(cache: HiRadixCache) -> set[bytes]:
    return {k for n in cache.tree.nodes() if n.device is not None for k in cache.node_page_keys(n)}


def test_subscriber_rebuilds_device_pages_from_events() -> None:
    cache = with_events(page_size=4, pages=16)
    receiver = subscribe(cache)
    seen: list[object] = []
    for step, s in enumerate([seq(1, 16), seq(2, 24), [*seq(1, 8), *seq(3, 8)], seq(1, 16)]):
        serve(cache, s)
        cache.drain()
        if step == 1:
            cache.evict(20)  # demotions and deletions
            cache.poll()
        seen.extend(receiver.receive())
        assert device_pages_from_events(seen) == device_pages_of_tree(cache)
    media = {e.medium for e in seen if isinstance(e, BlockStored)}
    assert {"device", "host"} <= media
    cache.reset()
    seen.extend(receiver.receive())
    assert device_pages_from_events(seen) == set()
    receiver.close()
    cache.close()


def test_storage_writes_and_host_evictions_are_announced() -> None:
    cache = with_events(page_size=4, pages=16, storage=True)
    receiver = subscribe(cache)
    a = seq(1, 16)
    serve(cache, a)
    cache.drain()
    cache.match_prefix(a[:8])  # split the node while nothing is in flight
    cache.evict(10**6)
    cache.evict_host(10**6)
    cache.poll()
    events = receiver.receive()
    keys = set(cache_keys(cache, a))
    stored = {
        k
        for e in events
        if isinstance(e, BlockStored)
        for k in e.block_hashes
        if e.medium == "storage"
    }
    removed_host = {
        k
        for e in events
        if isinstance(e, BlockRemoved) and e.medium == "host"
        for k in e.block_hashes
    }
    assert stored == keys and removed_host == keys
    receiver.close()
    cache.close()


def test_storage_evictions_are_announced() -> None:
    # A store of 6 pages: the second request's writes evict the first's pages.
    page_bytes = 4 * 2 * 2 * 2 * 4 * 4 + 56  # tokens × layers × K,V × heads × dim × fp32
    cache = with_events(page_size=4, pages=16, storage=True, store_bytes=6 * page_bytes)
    receiver = subscribe(cache)
    stored: set[bytes] = set()
    for tag in (1, 2, 3):
        serve(cache, seq(tag, 16))
        cache.drain()
        for e in receiver.receive():
            if isinstance(e, BlockStored) and e.medium == "storage":
                stored.update(e.block_hashes)
            elif isinstance(e, BlockRemoved) and e.medium == "storage":
                stored.difference_update(e.block_hashes)
    assert cache.storage is not None
    in_store = {
        k for k in stored | set(cache_keys(cache, seq(1, 16))) if cache.storage.backend.exists([k])
    }
    assert stored == in_store and 0 < len(stored) <= 6
    receiver.close()
    cache.close()


def cache_keys(cache: HiRadixCache, tokens: list[int]) -> list[bytes]:
    from hicache.hashing import page_keys

    return page_keys(cache.fingerprint, None, tokens, cache.page_size)


def test_stats_count_hits_per_tier_and_bytes() -> None:
    cache = two_tier(4, pages=16)
    a = seq(1, 16)
    serve(cache, a[:8])
    serve(cache, a)  # two nodes: 8 + 8 tokens
    cache.drain()
    cache.evict(8)  # the leaf goes to host
    serve(cache, a)
    cache.drain()
    stats = cache.stats()
    assert isinstance(stats, CacheStats)
    assert stats.hit_tokens_device == 16 and stats.hit_tokens_host == 8  # 8 + 8 on device
    assert stats.bytes_d2h > 0 and stats.bytes_h2d > 0
    assert stats.demoted_tokens_device == 8
    assert stats.as_dict()["requests"] == 3
    cache.close()


def test_prometheus_endpoint_serves_counters() -> None:
    stats = CacheStats(hit_tokens_device=42)
    server = MetricsServer("127.0.0.1", 0, lambda: stats, lambda: Gauges(7, 3, 1))
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        body = urllib.request.urlopen(url, timeout=5).read().decode()
    finally:
        server.close()
    assert "hicache_hit_tokens_device_total 42.0" in body
    assert "hicache_device_tokens 7.0" in body
