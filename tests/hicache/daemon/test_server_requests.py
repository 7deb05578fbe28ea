"""The daemon answers every op and every kind of bad request with the right reply."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import msgpack

from storage_backends.remote.protocol import (
    ContainsReply,
    DeleteReply,
    ErrorCode,
    ErrorReply,
    ExistsReply,
    Op,
    PingReply,
    StatsReply,
)

from .conftest import ON_EVERY_STORE, daemon_toml

SMALL_LIMITS = """
[limits]
max_batch_keys = 16
max_key_bytes = 64
max_page_bytes = 8192
max_request_bytes = 32768
"""


def _header(frames: list[bytes] | None) -> dict[str, object]:
    assert frames is not None, "no reply"
    return msgpack.unpackb(frames[0])


@ON_EVERY_STORE
def test_ops_round_trip_bit_identical(start_daemon, connect, pages) -> None:
    daemon = start_daemon()
    client = connect(daemon.endpoint)
    daemon.wait_ping(client)
    keys, records = pages(6, size=4096)
    assert client.put(keys[:4], records[:4]) == (True,) * 4
    assert client.put(keys[:1], records[:1]) == (True,)  # already stored
    assert client.call(Op.EXISTS, keys) == ExistsReply(client._next_id, 4)
    assert client.call(Op.EXISTS, [keys[5], keys[0]]).count == 0  # leading hits only
    assert client.get(keys) == [*records[:4], None, None]
    assert client.call(Op.DELETE, [keys[0], keys[0], keys[5]]).deleted == 1
    assert client.get(keys[:2]) == [None, records[1]]
    ping = client.call(Op.PING)
    assert isinstance(ping, PingReply) and ping.server.startswith("hicache")


BAD_REQUESTS = [
    ([b"\xc1garbage"], ErrorCode.MALFORMED),
    ([b""], ErrorCode.MALFORMED),
    ([msgpack.packb({"v": 9, "op": "PING", "id": 1})], ErrorCode.BAD_VERSION),
    ([msgpack.packb({"v": 1, "op": "SCAN", "id": 1})], ErrorCode.BAD_OP),
    (
        [msgpack.packb({"v": 1, "op": "GET", "id": 1, "keys": [b"k"]}), b"x"],
        ErrorCode.BAD_FRAMES,
    ),
    (
        [msgpack.packb({"v": 1, "op": "PUT", "id": 1, "keys": [b"k", b"j"]}), b"x"],
        ErrorCode.BAD_FRAMES,
    ),
    ([msgpack.packb({"v": 1, "op": "GET", "id": 1, "keys": [b"k"] * 17})], ErrorCode.TOO_LARGE),
    ([msgpack.packb({"v": 1, "op": "GET", "id": 1, "keys": [b"k" * 65]})], ErrorCode.TOO_LARGE),
    (
        [msgpack.packb({"v": 1, "op": "PUT", "id": 1, "keys": [b"k"]}), b"x" * 8193],
        ErrorCode.TOO_LARGE,
    ),
    ([b"\xdd\xff\xff\xff\xff"], ErrorCode.MALFORMED),  # array of 4G entries, no data
]


def test_bad_requests_get_an_error_reply(start_daemon, connect, tmp_path: Path) -> None:
    daemon = start_daemon(daemon_toml(tmp_path / "store", SMALL_LIMITS))
    client = connect(daemon.endpoint)
    for frames, code in BAD_REQUESTS:
        header = _header(client.raw(frames))
        assert header["ok"] is False and header["code"] == code.value, (frames[0][:40], header)
        assert isinstance(header["message"], str) and header["message"]
    daemon.wait_ping(client)


def test_a_put_record_with_a_bad_header_is_refused_and_nothing_is_stored(
    start_daemon, connect, pages
) -> None:
    daemon = start_daemon()
    client = connect(daemon.endpoint)
    keys, records = pages(3)
    wrong_key = client.call(Op.PUT, [keys[0]], [records[1]])  # record framed for another key
    assert isinstance(wrong_key, ErrorReply) and wrong_key.code is ErrorCode.MALFORMED
    cut = client.call(Op.PUT, keys, [records[0], records[1][:-1], records[2]])  # torn record
    assert isinstance(cut, ErrorReply) and cut.code is ErrorCode.MALFORMED
    assert client.call(Op.EXISTS, keys) == ExistsReply(client._next_id, 0)


@ON_EVERY_STORE
def test_a_record_whose_checksum_lies_is_dropped_at_its_first_read_never_served(
    start_daemon, connect, pages
) -> None:
    """The daemon checks a PUT's headers, not its checksums (no pass over the payload):
    a record whose payload does not match its header's checksum is stored, and the
    first read of it finds the damage: a miss, dropped and counted, never sent."""
    daemon = start_daemon()
    client = connect(daemon.endpoint)
    keys, records = pages(3, size=4096)
    damaged = bytearray(records[1])
    damaged[-1] ^= 0xFF
    assert client.put(keys, [records[0], bytes(damaged), records[2]]) == (True,) * 3
    for _ in range(3):  # and again: what is dropped stays a miss; the memory tier never has it
        assert client.get(keys) == [records[0], None, records[2]]
    assert client.call(Op.CONTAINS, keys) == ContainsReply(client._next_id, (True, False, True))
    assert daemon.stat(client, "hicache_daemon_corrupt_pages_total") == 1


def test_writes_over_the_in_flight_bound_are_busy(
    start_daemon, connect, tmp_path: Path, pages
) -> None:
    bound = "max_inflight_bytes = 1000\n"
    daemon = start_daemon(daemon_toml(tmp_path / "store", bound))
    client = connect(daemon.endpoint)
    keys, records = pages(2, size=2000)
    reply = client.call(Op.PUT, keys[:1], records[:1])
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.BUSY
    assert client.call(Op.DELETE, keys[:1]) == DeleteReply(client._next_id, 0)


def test_stats_and_prometheus_report_the_same_counters(
    start_daemon, connect, tmp_path, pages
) -> None:
    daemon = start_daemon(daemon_toml(tmp_path / "store", "") + "[metrics]\nport = 0\n")
    client = connect(daemon.endpoint)
    keys, records = pages(3)
    client.put(keys[:2], records[:2])
    for _ in range(3):  # the PUT's pages are in memory: every read of them is a memory hit
        client.get(keys)
    client.raw([b"\xc1"])
    stats = client.call(Op.STATS)
    assert isinstance(stats, StatsReply)
    assert stats.stats['hicache_daemon_lookups_total{result="hit",tier="store"}'] == 0
    assert stats.stats['hicache_daemon_lookups_total{result="hit",tier="memory"}'] == 6
    assert stats.stats['hicache_daemon_lookups_total{result="miss",tier="none"}'] == 3
    assert stats.stats['hicache_daemon_errors_total{code="MALFORMED"}'] == 1
    assert stats.stats['hicache_daemon_requests_total{op="PUT"}'] == 1
    assert stats.stats["hicache_daemon_store_pages"] == 2
    assert stats.stats["hicache_daemon_received_bytes_total"] > 2 * 256
    url = f"http://127.0.0.1:{daemon.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    assert "# HELP hicache_daemon_request_duration_seconds" in text
    assert 'hicache_daemon_request_duration_seconds_bucket{le="0.0001",op="GET"}' in text
    assert 'hicache_daemon_lookups_total{result="hit",tier="memory"} 6.0' in text
    assert "hicache_daemon_store_used_bytes" in text and "hicache_daemon_memory_used_bytes" in text


def test_ipc_endpoint(start_daemon, connect, tmp_path: Path, pages) -> None:
    config = daemon_toml(tmp_path / "store").replace(
        'endpoint = "tcp://127.0.0.1:0"', f'endpoint = "ipc://{tmp_path}/daemon.sock"'
    )
    daemon = start_daemon(config)
    assert daemon.endpoint == f"ipc://{tmp_path}/daemon.sock"
    client = connect(daemon.endpoint)
    keys, records = pages(2)
    assert client.put(keys, records) == (True, True)
    assert client.get(keys) == records


def test_full_store_evicts_and_refuses_oversized_pages(
    start_daemon, connect, tmp_path, pages
) -> None:
    config = daemon_toml(tmp_path / "store", memory_bytes=0).replace(
        f"max_bytes = {64 << 20}", f"max_bytes = {1 << 20}"
    )
    daemon = start_daemon(config)
    client = connect(daemon.endpoint)
    keys, records = pages(48, size=65536)  # 3 MiB through a 1 MiB store
    for start in range(0, 48, 8):
        assert client.put(keys[start : start + 8], records[start : start + 8]) == (True,) * 8
    served = client.get(keys)
    assert served[-8:] == records[-8:]  # the most recent pages stay
    assert served[0] is None  # the oldest were evicted
    big_key, big_record = pages(1, salt="big", size=2 << 20)
    assert client.put(big_key, big_record) == (False,)  # larger than the whole store
    stats = client.call(Op.STATS).stats
    assert stats['hicache_daemon_evictions_total{tier="store"}'] > 0
    assert stats["hicache_daemon_put_failures_total"] == 1
    assert stats["hicache_daemon_store_used_bytes"] <= 1 << 20
