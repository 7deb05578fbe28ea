"""Print the KV events a cache publishes: python examples/subscribe_events.py ENDPOINT [BATCHES]"""

import sys

import msgpack
import zmq

endpoint, batches = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else -1
sub = zmq.Context().socket(zmq.SUB)
sub.connect(endpoint)  # the cache's events.endpoint (logged at INFO; cache.events.endpoint)
sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")  # events.topic
while batches != 0:
    topic, seq, payload = sub.recv_multipart()  # [topic, 8-byte big-endian sequence, batch]
    ts, events = msgpack.unpackb(payload)[:2]  # KVEventBatch: [ts, events, dp rank]
    for e in events:  # tagged maps: BlockStored, BlockRemoved, AllBlocksCleared
        print(int.from_bytes(seq, "big"), e["type"], e.get("medium"), e.get("block_hashes"))
    batches -= 1
