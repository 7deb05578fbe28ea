"""The memory tier's byte bound is what it costs: RssAnon stays within 2 x memory_bytes plus a
constant (plus the pages in flight) for page sizes from 64 B to 4 MiB, each PUT in its own
message (as engines send them)."""

from __future__ import annotations

from hicache.daemon.memory_lru import ENTRY_OVERHEAD
from storage_backends.page_format import HEADER_BYTES
from storage_backends.remote.protocol import Op, PutReply, Request, decode_reply, encode_request

from .conftest import daemon_toml, page_key, page_record

MEMORY = 4 << 20
CONSTANT = 16 << 20  # interpreter, allocator arenas, LMDB bookkeeping
IN_FLIGHT_COPIES = 8  # pages of the current size the receive and commit path may still hold
WINDOW = 256
SIZES = (64, 200, 4096, 65536, 1 << 20, 4 << 20)


def _put_one_by_one(client, salt: str, size: int, count: int) -> None:
    sent = 0
    acked = 0
    while acked < count:
        while sent < count and sent - acked < WINDOW:
            key = page_key(sent, salt)
            request = Request(Op.PUT, sent + 1, (key,), (page_record(key, sent, size),))
            client.sock.send_multipart(encode_request(request))
            sent += 1
        reply = decode_reply(client.recv(), Op.PUT)
        assert isinstance(reply, PutReply) and reply.stored == (True,), reply
        acked += 1


def test_memory_tier_costs_what_it_charges(start_daemon, connect, tmp_path) -> None:
    config = daemon_toml(tmp_path / "store", memory_bytes=MEMORY, sync=False)
    config = config.replace(f"max_bytes = {64 << 20}", f"max_bytes = {256 << 20}")
    daemon = start_daemon(config)
    client = connect(daemon.endpoint)
    daemon.wait_ping(client)
    baseline = daemon.rss_bytes("RssAnon")
    grown = {}
    for size in SIZES:
        count = max(6 * MEMORY // (size + HEADER_BYTES + ENTRY_OVERHEAD) // 5, 4)  # 1.2 x
        _put_one_by_one(client, f"s{size}-", size, count)
        grown[size] = daemon.rss_bytes("RssAnon") - baseline
    print({size: f"{g / 2**20:.1f} MiB" for size, g in grown.items()})
    assert daemon.stat(client, "hicache_daemon_memory_used_bytes") <= MEMORY
    for size, g in grown.items():
        bound = 2 * MEMORY + CONSTANT + IN_FLIGHT_COPIES * size
        assert g <= bound, f"{size} B pages: RssAnon grew {g / 2**20:.0f} MiB"
