"""The reference engine's own traffic, published as KV events, decodes with
each engine release's Structs (from its wheel), and names every tier."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from hicache.config.cache import EventsConfig
from tests.hicache.engine.helpers import chat, config, engine, push_to_storage, tokens
from tests.hicache.events.kv_event_peers import SGLANG, VLLM, load
from tests.hicache.events.kv_event_peers.subscriber import Receiver

PEERS = [("vllm", VLLM), ("sglang", SGLANG)]


@pytest.mark.parametrize(("wire", "release"), PEERS, ids=[VLLM, SGLANG])
def test_engine_chat_events_decode_with_peer_structs(
    tmp_path: Path, wire: str, release: str
) -> None:
    peer = load(release)
    cfg = config(16, 1024, store=tmp_path / "store")
    events = EventsConfig("tcp://127.0.0.1:*", format=wire)
    eng = engine(dataclasses.replace(cfg, events=events))
    receiver = Receiver(eng.cache, peer)
    rng = random.Random(7)
    turns = [tokens(rng, n) for n in (40, 21, 33)]
    outs = chat(eng, turns, between=push_to_storage, namespace="tenant-a")
    chat(eng, turns[:1])  # the same tokens in no namespace: cached apart
    eng.cache.drain()
    decoded = receiver.receive()  # a typed decode of every batch
    receiver.close()
    eng.cache.close()
    assert all(out.hits.storage > 0 for out in outs[1:])
    stored = [e for e in decoded if isinstance(e, peer.BlockStored)]
    assert len({e.medium for e in stored}) == 3 and {e.medium for e in stored} <= peer.MEDIA
    ns_field = "cache_salt" if wire == "sglang" else "lora_name"
    assert {getattr(e, ns_field) for e in stored} == {"tenant-a", None}
    assert any(isinstance(e, peer.BlockRemoved) for e in decoded)
