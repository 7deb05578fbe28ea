"""One client process of the many-client load test (``test_server_many_clients``).

Run as ``python -m tests.hicache.daemon.load_clients KIND INDEX ENDPOINT OPS SEED PAUSE_S``
(KIND ``raw``: a DEALER socket speaking docs/protocol.md, pipelined; ``remote``:
the ``remote`` storage backend; ``remote-shm``: the same through the daemon's
shared-memory slab, silent for ``PAUSE_S`` now and then so that its lease is
reclaimed and attached again). It runs a random mix of PUT (1-4 keys), GET
(1-8), EXISTS and DELETE (~5 %) over keys every client writes (``shared``) and
keys of its own (``private``), with pages of 4-64 KiB, checks everything it gets
back, and prints one JSON line of counts (``Tally``).

Every page's payload says who wrote it: its first 16 bytes are (writer, key id,
version, size) and the rest is a pattern derived from those four, so a hit is
checked against the bytes its writer put, byte for byte, by any process. A shared
key may hold any client's page; a private key only one its owner put since its
last acknowledged DELETE. A raw client checks every record on the wire against
its header (key, length, xxh3) itself; the remote backend does the same and
counts what fails as ``corrupt``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import struct
import sys
import time
from collections.abc import Sequence

import msgpack
import numpy as np
import zmq

from storage_backends import StorageConfig, create
from storage_backends.page_format import HEADER_BYTES, Verdict, encode_page, validate
from storage_backends.remote.client import RemoteBackend
from storage_backends.remote.protocol import (
    DeleteReply,
    ErrorReply,
    ExistsReply,
    GetReply,
    Op,
    PutReply,
    Request,
    decode_reply,
    encode_request,
)

SHARED_KEYS = 120
PRIVATE_KEYS = 48
PAGE_KIB = (4, 8, 16, 24, 32, 48, 64, 64, 64)  # 64 KiB pages are sent without a copy
WINDOW = 4  # requests a raw client keeps in flight
TIMEOUT_S = 10.0
# What ``HICACHE_DAEMON_POISON`` fills reply buffers with once given back (reply_pool).
POISON = b"\xdeHICACHE-POISON\xad"
_ID = struct.Struct("<IIII")  # writer, key id, version, size


def shared_key(i: int) -> bytes:
    return hashlib.sha256(f"load-shared-{i}".encode()).digest()


def private_key(owner: int, i: int) -> bytes:
    return hashlib.sha256(f"load-private-{owner}-{i}".encode()).digest()


def page_bytes(key_id: int) -> int:
    """A key's page size, whoever writes it (so that a remote client knows what to ask)."""
    return PAGE_KIB[key_id % len(PAGE_KIB)] << 10


def payload(writer: int, key_id: int, version: int, size: int) -> bytes:
    """The page ``writer`` puts as ``version`` of key ``key_id``: its identity, then a
    pattern of 8-byte words unique to (identity, position)."""
    head = _ID.pack(writer, key_id, version, size)
    seed = int.from_bytes(hashlib.blake2b(head, digest_size=8).digest(), "little")
    words = np.arange((size - len(head) + 7) // 8, dtype=np.uint64)
    words *= np.uint64(0x9E3779B97F4A7C15)
    words += np.uint64(seed)
    words ^= words >> np.uint64(31)
    return head + words.tobytes()[: size - len(head)]


@dataclasses.dataclass
class Tally:
    """What one client saw; every field but the first five must stay 0."""

    ops: int = 0
    gets: int = 0
    records: int = 0  # GET records checked
    hits_private: int = 0
    errors_busy: int = 0  # BUSY replies and unanswered requests (a miss, legitimately)
    bad_header: int = 0  # a record that fails its own header check (key, length, xxh3)
    poisoned: int = 0  # a record holding the reply pool's poison
    wrong_bytes: int = 0  # header fine, bytes not what the writer put
    stale: int = 0  # a private page its owner did not put (or deleted since)
    protocol: int = 0  # a reply that does not fit its request (frames, ids, fields)
    corrupt_remote: int = 0  # pages the remote backend counted as damaged
    details: list[str] = dataclasses.field(default_factory=list)

    def note(self, field: str, text: str) -> None:
        setattr(self, field, getattr(self, field) + 1)
        if len(self.details) < 8:
            self.details.append(f"{field}: {text}")


class Keys:
    """The key space of one client and what its private keys may hold."""

    def __init__(self, me: int, rng: random.Random) -> None:
        self.me = me
        self.rng = rng
        self.shared = [shared_key(i) for i in range(SHARED_KEYS)]
        self.private = [private_key(me, i) for i in range(PRIVATE_KEYS)]
        self.ids = {key: i for i, key in enumerate(self.shared)}
        self.ids.update({key: SHARED_KEYS + i for i, key in enumerate(self.private)})
        # Private key -> versions put since its last acknowledged DELETE.
        self.allowed: dict[bytes, set[int]] = {key: set() for key in self.private}
        self.version = 0

    def sample(self, n: int) -> list[bytes]:
        """``n`` distinct keys, about half shared."""
        shared = self.rng.randint(0, n)
        return self.rng.sample(self.shared, shared) + self.rng.sample(self.private, n - shared)

    def page(self, key: bytes) -> bytes:
        """A fresh version of ``key`` by this client, recorded before it is sent."""
        self.version += 1
        size = page_bytes(self.ids[key])
        if key in self.allowed:
            self.allowed[key].add(self.version)
        return payload(self.me, self.ids[key], self.version, size)

    def check(self, key: bytes, data: bytes | memoryview, tally: Tally) -> None:
        """A hit's payload against what its writer put under ``key``."""
        data = bytes(data)
        if POISON in data:
            tally.note("poisoned", f"key {self.ids[key]}")
            return
        if len(data) < _ID.size:
            tally.note("wrong_bytes", f"key {self.ids[key]}: {len(data)} bytes")
            return
        writer, key_id, version, size = _ID.unpack_from(data)
        if key_id != self.ids[key] or size != len(data) or data != payload(*_ID.unpack_from(data)):
            tally.note("wrong_bytes", f"key {self.ids[key]}: ({writer}, {key_id}, {version})")
            return
        if key in self.allowed:
            tally.hits_private += 1
            if writer != self.me or version not in self.allowed[key]:
                tally.note("stale", f"private key {key_id}: ({writer}, {version})")


class RawClient:
    """A DEALER socket with up to ``WINDOW`` requests in flight, checking every reply."""

    def __init__(self, endpoint: str, keys: Keys, tally: Tally) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.keys = keys
        self.tally = tally
        self.next_id = 0
        self.pending: dict[int, tuple[Op, list[bytes]]] = {}

    def send(self, op: Op, keys: list[bytes], pages: Sequence[bytes] = ()) -> None:
        while len(self.pending) >= WINDOW:
            self.receive_one()
        self.next_id += 1
        self.pending[self.next_id] = (op, keys)
        self.sock.send_multipart(
            encode_request(Request(op, self.next_id, tuple(keys), tuple(pages)))
        )

    def drain(self) -> None:
        while self.pending:
            self.receive_one()

    def receive_one(self) -> None:
        if not self.sock.poll(int(TIMEOUT_S * 1000)):
            self.tally.errors_busy += len(self.pending)
            self.pending.clear()  # unanswered: misses; a late reply is matched to nothing
            return
        frames = self.sock.recv_multipart(copy=False)
        header = msgpack.unpackb(frames[0].bytes)
        sent = self.pending.pop(header.get("id"), None) if isinstance(header, dict) else None
        if sent is None:
            return  # the answer to a request given up on
        op, keys = sent
        try:
            reply = decode_reply([f.buffer for f in frames], op)
        except Exception as exc:
            self.tally.note("protocol", f"undecodable reply to {op.value}: {exc!r:.100}")
            return
        if isinstance(reply, ErrorReply):
            self.tally.errors_busy += 1
        elif isinstance(reply, GetReply):
            self.on_get(keys, reply)
        elif op is Op.DELETE and isinstance(reply, DeleteReply):
            for key in keys:
                if key in self.keys.allowed:
                    self.keys.allowed[key].clear()
        elif not isinstance(reply, (PutReply, ExistsReply, DeleteReply)):
            self.tally.note("protocol", f"{type(reply).__name__} to {op.value}")

    def on_get(self, keys: list[bytes], reply: GetReply) -> None:
        self.tally.gets += 1
        if len(reply.found) != len(keys) or len(reply.pages) != sum(reply.found):
            self.tally.note("protocol", f"{len(reply.pages)} records for {reply.found}")
            return
        records = iter(reply.pages)
        for key, found in zip(keys, reply.found, strict=True):
            if not found:
                continue
            record = memoryview(next(records))
            self.tally.records += 1
            verdict = validate(record, key, None)
            if verdict is not Verdict.OK:
                poisoned = POISON in bytes(record)
                field = "poisoned" if poisoned else "bad_header"
                self.tally.note(
                    field, f"key {self.keys.ids[key]}: {verdict.value}, {len(record)} B"
                )
                continue
            self.keys.check(key, record[HEADER_BYTES:], self.tally)

    def run(self, ops: int, rng: random.Random) -> None:
        for _ in range(ops):
            roll = rng.random()
            if roll < 0.05:
                key = rng.choice(self.keys.private if rng.random() < 0.7 else self.keys.shared)
                self.drain()  # a private key's versions restart at the acknowledged DELETE
                self.send(Op.DELETE, [key])
                self.drain()
            elif roll < 0.35:
                keys = self.keys.sample(rng.randint(1, 4))
                self.send(Op.PUT, keys, [encode_page(k, self.keys.page(k)) for k in keys])
            elif roll < 0.45:
                self.send(Op.EXISTS, self.keys.sample(rng.randint(1, 4)))
            else:
                self.send(Op.GET, self.keys.sample(rng.randint(1, 8)))
            self.tally.ops += 1
        self.drain()


class RemoteClient:
    """The ``remote`` backend, one call at a time; its own checks count damage."""

    def __init__(
        self, endpoint: str, keys: Keys, tally: Tally, shm: bool = False, pause_s: float = 0.0
    ) -> None:
        config = StorageConfig(backend="remote", endpoint=endpoint, timeout_s=TIMEOUT_S, shm=shm)
        self.pause_s = pause_s
        backend = create("remote", config)
        assert isinstance(backend, RemoteBackend)
        self.backend = backend
        self.keys = keys
        self.tally = tally

    def run(self, ops: int, rng: random.Random) -> None:
        for _ in range(ops):
            roll = rng.random()
            if self.pause_s and rng.random() < 0.01:
                time.sleep(self.pause_s)  # silent: the daemon reclaims the lease
            if roll < 0.05:
                key = rng.choice(self.keys.private if rng.random() < 0.7 else self.keys.shared)
                failed = self.backend.failed_calls()
                self.backend.delete([key])
                if self.backend.failed_calls() == failed:  # acknowledged
                    self.keys.allowed.get(key, set()).clear()
            elif roll < 0.35:
                keys = self.keys.sample(rng.randint(1, 4))
                pages = [self.keys.page(key) for key in keys]
                self.backend.put(keys, [memoryview(p) for p in pages])
            elif roll < 0.45:
                self.backend.exists(self.keys.sample(rng.randint(1, 4)))
            else:
                self.get(self.keys.sample(rng.randint(1, 8)))
            self.tally.ops += 1
        self.tally.corrupt_remote = self.backend.stats().corrupt
        self.tally.errors_busy = self.backend.failed_calls()
        self.backend.close()

    def get(self, keys: list[bytes]) -> None:
        dst = [memoryview(bytearray(page_bytes(self.keys.ids[key]))) for key in keys]
        self.tally.gets += 1
        for key, hit, view in zip(keys, self.backend.get(keys, dst), dst, strict=True):
            if hit:
                self.tally.records += 1
                self.keys.check(key, view, self.tally)


def main(argv: Sequence[str]) -> int:
    kind, index, endpoint, ops, seed, pause_s = argv
    rng = random.Random(f"{seed}-{index}")
    tally = Tally()
    keys = Keys(int(index), rng)
    client: RawClient | RemoteClient
    if kind == "raw":
        client = RawClient(endpoint, keys, tally)
    else:
        client = RemoteClient(endpoint, keys, tally, kind == "remote-shm", float(pause_s))
    start = time.monotonic()
    client.run(int(ops), rng)
    result = dataclasses.asdict(tally) | {"seconds": time.monotonic() - start}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
