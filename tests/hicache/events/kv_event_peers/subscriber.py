"""A subscriber that decodes what a cache publishes with a peer's Structs."""

from __future__ import annotations

import struct

import msgspec
import zmq

from hicache.cache import HiRadixCache
from hicache.events.kv import ZmqEventPublisher
from tests.hicache.events.kv_event_peers import PeerStructs


class Receiver:
    """A SUB socket that reads every batch published so far, checks topic and
    sequence framing, and decodes each with a peer's ``KVEventBatch``."""

    def __init__(self, cache: HiRadixCache, peer: PeerStructs) -> None:
        assert isinstance(cache.events, ZmqEventPublisher)
        self.pub = cache.events
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(self.pub.endpoint)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
        assert self.pub.wait_for_subscriber(5.0)
        self.decoder = msgspec.msgpack.Decoder(peer.KVEventBatch)
        self.expected = 0

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
            events.extend(self.decoder.decode(payload).events)  # typed: raises on any mismatch
        return events
