from __future__ import annotations

import hashlib

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.events.formats import FORMATS, block_hash, create_format
from hicache.events.kv import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from tests.hicache.events.kv_event_peers import SGLANG, VLLM, load

KEYS = tuple(hashlib.sha256(bytes([i])).digest() for i in range(3))


def test_block_hash_is_the_signed_big_endian_prefix_of_the_page_key() -> None:
    assert block_hash(b"\x00" * 7 + b"\x05" + b"\xff" * 24) == 5
    assert block_hash(b"\xff" * 8) == -1
    assert block_hash(b"\x80" + b"\x00" * 7) == -(2**63)
    assert len({block_hash(k) for k in KEYS}) == 3
    with pytest.raises(ValueError, match="8"):
        block_hash(b"short")


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_wire_layout(name: str) -> None:
    """Envelope positional, events tagged maps, defaults omitted, ints for hashes."""
    wire = create_format(name, "lmdb")
    stored = BlockStored(KEYS[1:], KEYS[0], (1, 2, 3, 4), 2, "ns", "device")
    payload = wire.encode(12.5, [stored, BlockRemoved(KEYS[:1], "host"), AllBlocksCleared()])
    ts, events, rank = msgpack.unpackb(payload)
    assert (ts, rank) == (12.5, None)
    namespace_field = {"vllm": "lora_name", "sglang": "cache_salt"}[name]
    assert events[0]["type"] == "BlockStored"
    assert events[0]["block_hashes"] == [block_hash(k) for k in KEYS[1:]]
    assert events[0]["parent_block_hash"] == block_hash(KEYS[0])
    assert events[0][namespace_field] == "ns" and events[0]["lora_id"] is None
    assert events[0]["medium"] == "GPU"
    assert "session_id" not in events[0]  # defaults omitted
    assert events[1]["type"] == "BlockRemoved" and events[2] == {"type": "AllBlocksCleared"}
    assert wire.decode(payload).events[1].medium == {"vllm": "CPU", "sglang": "CPU_PINNED"}[name]


@pytest.mark.parametrize(
    ("backend", "medium"),
    [
        ("disk", "DISK"),
        ("lmdb", "DISK"),
        ("file", "DISK"),
        ("remote", "EXTERNAL"),
        ("redis", "EXTERNAL"),
    ],
)
def test_sglang_names_the_storage_medium_after_the_backend(backend: str, medium: str) -> None:
    payload = create_format("sglang", backend).encode(0.0, [BlockRemoved(KEYS, "storage")])
    assert msgpack.unpackb(payload)[1][0]["medium"] == medium


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown KV event format"):
        create_format("hicache", "lmdb")


MEDIA = st.sampled_from(["device", "host", "storage"])
KEY = st.binary(min_size=32, max_size=32)
STORED = st.builds(
    lambda keys, parent, size, ns, medium: BlockStored(
        tuple(keys), parent, tuple(range(len(keys) * size)), size, ns, medium
    ),
    st.lists(KEY, min_size=1, max_size=4),
    st.none() | KEY,
    st.integers(1, 4),
    st.none() | st.text(max_size=8),
    MEDIA,
)
EVENT = STORED | st.builds(lambda k, m: BlockRemoved(tuple(k), m), st.lists(KEY, max_size=3), MEDIA)
PEERS = {"vllm": (VLLM, "lora_name"), "sglang": (SGLANG, "cache_salt")}


@pytest.mark.parametrize("name", sorted(FORMATS))
@settings(max_examples=60, deadline=None)
@given(events=st.lists(EVENT | st.just(AllBlocksCleared()), max_size=6), ts=st.floats(0, 2e9))
def test_any_batch_round_trips_through_the_peer_decoder(
    name: str, events: list[KVEvent], ts: float
) -> None:
    release, ns_field = PEERS[name]
    peer = load(release)
    wire = create_format(name, "redis")
    batch = msgspec.msgpack.Decoder(peer.KVEventBatch).decode(wire.encode(ts, events))
    assert batch.ts == ts and len(batch.events) == len(events)
    for ours, theirs in zip(events, batch.events, strict=True):
        assert type(theirs).__name__ == type(ours).__name__
        if isinstance(ours, AllBlocksCleared):
            continue
        assert theirs.block_hashes == [block_hash(k) for k in ours.block_hashes]
        assert theirs.medium in peer.MEDIA
        if isinstance(ours, BlockStored):
            assert theirs.parent_block_hash == (
                None if ours.parent_block_hash is None else block_hash(ours.parent_block_hash)
            )
            assert theirs.token_ids == list(ours.token_ids)
            assert theirs.block_size == ours.block_size
            assert getattr(theirs, ns_field) == ours.namespace
