from __future__ import annotations

import hashlib

import msgpack
import pytest

from hicache.event_formats import FORMATS, block_hash, create_format
from hicache.events import AllBlocksCleared, BlockRemoved, BlockStored

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
    [("lmdb", "DISK"), ("file", "DISK"), ("remote", "EXTERNAL"), ("redis", "EXTERNAL")],
)
def test_sglang_names_the_storage_medium_after_the_backend(backend: str, medium: str) -> None:
    payload = create_format("sglang", backend).encode(0.0, [BlockRemoved(KEYS, "storage")])
    assert msgpack.unpackb(payload)[1][0]["medium"] == medium


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown KV event format"):
        create_format("hicache", "lmdb")
