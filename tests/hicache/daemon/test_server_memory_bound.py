"""The memory tier's byte bound is what it costs: RssAnon stays within 2 x memory_bytes plus a
constant (plus the pages in flight) for page sizes from 64 B to 4 MiB, each PUT in its own
message (as engines send them); the memory of pages deleted is reused by the next PUTs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hicache.daemon.memory_lru import ENTRY_OVERHEAD
from storage_backends.page_format import HEADER_BYTES
from storage_backends.remote.protocol import (
    DeleteReply,
    Op,
    PutReply,
    Request,
    decode_reply,
    encode_request,
)

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


def _minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_the_memory_of_pages_put_and_deleted_is_reused_by_the_next_puts(
    start_daemon, connect, tmp_path
) -> None:
    # The memory tier keeps PUTs' frames; a DELETE of them all frees a burst of heap at
    # once, which glibc would give back to the kernel whole, so that the next PUTs fault
    # all of their receive memory in again (heap.TOP_PAD_BYTES keeps it).
    size, count = 2 << 20, 48  # 96 MiB: more than glibc would keep, less than TRIM_BYTES
    config = daemon_toml(tmp_path / "store", memory_bytes=128 << 20, sync=False)
    daemon = start_daemon(config.replace(f"max_bytes = {64 << 20}", f"max_bytes = {256 << 20}"))
    client = connect(daemon.endpoint)
    daemon.wait_ping(client)
    for round_ in range(2):
        keys = [page_key(i, f"r{round_}") for i in range(count)]
        before = _minor_faults(daemon.proc.pid)
        for i, key in enumerate(keys):
            assert client.put([key], [page_record(key, i, size)]) == (True,)
        faults = _minor_faults(daemon.proc.pid) - before
        assert daemon.stat(client, "hicache_daemon_memory_pages") == count
        assert client.call(Op.DELETE, keys) == DeleteReply(client._next_id, count)
    pages_put = count * size // 4096
    assert faults < pages_put // 4, f"the second round faulted {faults} of {pages_put} pages in"
