"""KV events over a real socket, decoded by each engine release's own Structs (from its wheel)."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest
import zmq

from hicache.cache import HiRadixCache
from hicache.config.cache import EventsConfig
from hicache.events.formats import block_hash
from hicache.events.kv import ZmqEventPublisher
from hicache.keys.hashing import page_keys
from storage_backends import StorageConfig
from tests.hicache.events.kv_event_peers import SGLANG, VLLM, PeerStructs, load
from tests.hicache.events.kv_event_peers.subscriber import Receiver
from tests.hicache.helpers import serve, two_tier

# (format, the release whose Structs decode it, that release's namespace field)
PEERS = [("vllm", VLLM, "lora_name"), ("sglang", SGLANG, "cache_salt")]
PEER_IDS = [VLLM, SGLANG]


def seq(tag: int, n: int) -> list[int]:
    return [tag * 1000 + i for i in range(n)]


def with_events(
    wire: str = "vllm",
    page_size: int = 4,
    pages: int = 16,
    store: StorageConfig | None = None,
) -> HiRadixCache:
    base = two_tier(page_size, pages=pages, storage=store)
    events = EventsConfig(endpoint="tcp://127.0.0.1:*", format=wire)
    cfg = replace(base.config, events=events)
    base.close()
    return HiRadixCache(cfg)


class Tiers:
    """What a router rebuilds from the events: block hashes per medium."""

    def __init__(self, peer: PeerStructs, names: dict[str, str]) -> None:
        self.peer, self.names = peer, names  # hicache tier -> the peer's medium name
        self.media: dict[str, set[int]] = {}
        self.ever: set[int] = set()

    def apply(self, events: list[object]) -> None:
        for e in events:
            if isinstance(e, self.peer.BlockStored):
                assert e.parent_block_hash is None or e.parent_block_hash in self.ever
                assert len(e.token_ids) == len(e.block_hashes) * e.block_size
                self.media.setdefault(e.medium, set()).update(e.block_hashes)
                self.ever.update(e.block_hashes)
            elif isinstance(e, self.peer.BlockRemoved):
                self.media.setdefault(e.medium, set()).difference_update(e.block_hashes)
            else:
                assert isinstance(e, self.peer.AllBlocksCleared)
                for medium in set(self.media) - {self.names["storage"]}:
                    self.media[medium] = set()

    def tier(self, name: str) -> set[int]:
        return self.media.get(self.names[name], set())


def tree_hashes(cache: HiRadixCache, tier: str) -> set[int]:
    nodes = [n for n in cache.tree.nodes() if getattr(n, tier) is not None]
    return {block_hash(k) for n in nodes for k in cache.node_page_keys(n)}


def run_workload(cache: HiRadixCache, tiers: Tiers, receiver: Receiver) -> list[object]:
    """Requests in two namespaces, demotions, host evictions, storage writes
    and prefetches back from storage; tiers checked against the tree each step."""
    seen: list[object] = []
    steps = [(seq(1, 16), None), (seq(2, 24), "tenant-a"), ([*seq(1, 8), *seq(3, 8)], None)]
    for tokens, ns in [*steps, (seq(1, 16), None), (seq(2, 24), "tenant-a")]:
        serve(cache, tokens, ns)
        cache.drain()
        if tokens == steps[-1][0]:  # push everything out: back comes from storage
            cache.evict(10**9)
            cache.evict_host(10**9)
            cache.poll()
        events = receiver.receive()
        tiers.apply(events)
        seen.extend(events)
        assert tiers.tier("device") == tree_hashes(cache, "device")
        assert tiers.tier("host") == tree_hashes(cache, "host")
    return seen


@pytest.mark.parametrize(("wire", "release", "ns_field"), PEERS, ids=PEER_IDS)
def test_peer_decodes_every_batch_of_a_workload(
    tmp_path: Path, wire: str, release: str, ns_field: str
) -> None:
    peer = load(release)
    store = StorageConfig(backend="lmdb", path=str(tmp_path / "store"), max_bytes=64 << 20)
    cache = with_events(wire, store=store)
    receiver = Receiver(cache, peer)
    tiers = Tiers(peer, PEER_MEDIA[wire])
    seen = run_workload(cache, tiers, receiver)
    stored = [e for e in seen if isinstance(e, peer.BlockStored)]
    assert {e.medium for e in stored} == set(PEER_MEDIA[wire].values()) <= peer.MEDIA
    assert {getattr(e, ns_field) for e in stored} == {None, "tenant-a"}
    assert all(e.lora_id is None for e in stored)
    assert cache.storage is not None
    keys = page_keys(cache.fingerprint, "tenant-a", seq(2, 24), cache.page_size)
    assert {block_hash(k) for k in keys} <= tiers.tier("storage")
    cache.reset()
    tiers.apply(receiver.receive())
    assert not tiers.tier("device") and not tiers.tier("host") and tiers.tier("storage")
    receiver.close()
    cache.close()


PEER_MEDIA = {
    "vllm": {"device": "GPU", "host": "CPU", "storage": "STORAGE"},
    "sglang": {"device": "GPU", "host": "CPU_PINNED", "storage": "DISK"},
}


def test_storage_evictions_are_announced() -> None:
    # A store of 6 pages: the second request's writes evict the first's pages.
    page_bytes = 4 * 2 * 2 * 2 * 4 * 4 + 56  # tokens × layers × K,V × heads × dim × fp32
    store = StorageConfig(backend="memory", max_bytes=6 * page_bytes)
    sglang = load(SGLANG)  # first: a release that is not installed skips before any socket
    cache = with_events("sglang", store=store)
    receiver = Receiver(cache, sglang)
    stored: set[int] = set()
    for tag in (1, 2, 3):
        serve(cache, seq(tag, 16))
        cache.drain()
        for e in receiver.receive():
            if isinstance(e, sglang.BlockStored) and e.medium == "EXTERNAL":
                stored.update(e.block_hashes)
            elif isinstance(e, sglang.BlockRemoved) and e.medium == "EXTERNAL":
                stored.difference_update(e.block_hashes)
    assert cache.storage is not None
    every = [k for tag in (1, 2, 3) for k in page_keys(cache.fingerprint, None, seq(tag, 16), 4)]
    in_store = {block_hash(k) for k in every if cache.storage.backend.exists([k])}
    assert stored == in_store and 0 < len(stored) <= 6
    receiver.close()
    cache.close()


class ReplayClient:
    """A DEALER speaking to the replay ROUTER with the REQ envelope ``[b"", start]``
    (a DEALER, unlike a REQ, can read every reply of one request)."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.connect(endpoint)

    def request(self, frames: list[bytes]) -> list[list[bytes]]:
        """Send ``[b"", *frames]``; every reply up to the end marker, envelope stripped."""
        self.sock.send_multipart([b"", *frames])
        replies: list[list[bytes]] = []
        for _ in range(1000):
            assert self.sock.poll(5000), "replay server did not answer"
            reply = self.sock.recv_multipart()
            assert reply[0] == b""
            replies.append(reply[1:])
            if reply[-2] == struct.pack(">q", -1) and reply[-1] == b"":
                return replies
        raise AssertionError("no end marker")

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def publish(pub: ZmqEventPublisher, n: int) -> None:
    from hicache.events.kv import BlockRemoved

    for i in range(n):
        pub.emit(BlockRemoved((bytes([i]) * 32,), "host"))
        pub.flush()


@pytest.mark.parametrize(
    ("wire", "release", "topic_in_reply"),
    [
        ("vllm", VLLM, True),
        ("sglang", SGLANG, True),
    ],
)
def test_replay_serves_missed_batches_from_a_bounded_buffer(
    wire: str, release: str, topic_in_reply: bool
) -> None:
    # Loaded first: a release that is not installed skips before any socket is open.
    decoder = msgspec.msgpack.Decoder(load(release).KVEventBatch)
    config = EventsConfig(
        "tcp://127.0.0.1:*", format=wire, replay_endpoint="tcp://127.0.0.1:*", replay_buffer=4
    )
    pub = ZmqEventPublisher.from_config(config, "lmdb")
    publish(pub, 6)  # no subscriber: every batch is lost to PUB/SUB, kept for replay
    client = ReplayClient(pub.replay_endpoint)
    try:
        replies = client.request([struct.pack(">Q", 3)])
        *batches, end = replies
        assert end == ([b""] if topic_in_reply else []) + [struct.pack(">q", -1), b""]
        assert [struct.unpack(">Q", r[-2])[0] for r in batches] == [3, 4, 5]
        for i, r in enumerate(batches, start=3):
            assert (r[0] == b"kv-events") if topic_in_reply else len(r) == 2
            (event,) = decoder.decode(r[-1]).events
            assert event.block_hashes == [block_hash(bytes([i]) * 32)]
        # Batches 0 and 1 left the 4-batch buffer: replay starts at the oldest kept.
        oldest = client.request([struct.pack(">Q", 0)])[0]
        assert struct.unpack(">Q", oldest[-2])[0] == 2
        # A malformed request gets the end marker alone, and is counted.
        assert client.request([b"\x01\x02"]) == [end]
        assert pub.stats().replay_errors == 1 and pub.stats().replays == 2
    finally:
        client.close()
        pub.close()


def test_events_config_is_checked() -> None:
    with pytest.raises(ValueError, match=r"events\.format"):
        EventsConfig("tcp://127.0.0.1:*", format="hicache")
    with pytest.raises(ValueError, match=r"events\.replay_buffer"):
        EventsConfig("tcp://127.0.0.1:*", replay_buffer=0)
    with pytest.raises(ValueError, match=r"needs events\.endpoint"):
        EventsConfig(replay_endpoint="tcp://127.0.0.1:*")


def test_a_replay_endpoint_that_cannot_bind_is_a_clear_error() -> None:
    taken = ZmqEventPublisher("tcp://127.0.0.1:*")
    try:
        with pytest.raises(ValueError, match=r"events\.replay_endpoint"):
            ZmqEventPublisher("tcp://127.0.0.1:*", replay_endpoint=taken.endpoint)
    finally:
        taken.close()


def test_an_any_port_endpoint_says_which_port_it_bound(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="hicache.events.kv"):
        cache = with_events()
    try:
        assert cache.events is not None
        endpoint = cache.events.endpoint
        host, _, port = endpoint.rpartition(":")
        assert host == "tcp://127.0.0.1" and int(port) > 0
        assert any(endpoint in r.getMessage() for r in caplog.records if r.levelname == "INFO")
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.connect(endpoint)  # what the log and the attribute name is where events come
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        assert isinstance(cache.events, ZmqEventPublisher)
        assert cache.events.wait_for_subscriber(5.0)
        serve(cache, seq(3, 8))
        assert sub.poll(5000), "no batch arrived on the logged endpoint"
        topic, _, _ = sub.recv_multipart()
        assert topic == b"kv-events"
        sub.close(0)
        ctx.term()
    finally:
        cache.close()
