"""docs/protocol.md is true: its tables match the code, and a client written
from the page alone (plain zmq + msgpack, no hicache protocol module) talks to
a real daemon."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest
import zmq

from storage_backends.remote import protocol
from storage_backends.remote.protocol import ErrorCode, Limits, Op
from tests.hicache.daemon.conftest import REPLY_TIMEOUT_S, StartDaemon

DOC = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"
Pages = Callable[..., tuple[list[bytes], list[bytes]]]


def table(title: str) -> dict[str, list[str]]:
    """First column (unquoted) -> the other cells, of the first table after
    ``title`` (its header row left out)."""
    text = DOC.read_text()
    lines = text[text.index(title) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2 :]:  # past the header and the --- row
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_code_points_at_this_document() -> None:
    assert "docs/protocol.md" in (protocol.__doc__ or "")
    assert DOC.exists()


def test_ops_error_codes_and_limits_match_the_code() -> None:
    ops = table("On success, by op:")
    assert set(ops) == {op.value for op in Op}
    codes = table("## Errors")
    assert set(codes) == {code.value for code in ErrorCode}
    limits = table("## Limits")
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for name, (default, _) in limits.items():
        number, _, unit = default.partition(" ")
        assert getattr(Limits(), name) == int(number) * units.get(unit, 1), name
    assert f"{protocol.VERSION}" in table("## Request")["v"][1]


def call(sock: zmq.Socket[bytes], header: dict[str, object], *payload: bytes) -> list[bytes]:
    sock.send_multipart([msgpack.packb(header), *payload])  # no delimiter frame
    assert sock.poll(int(REPLY_TIMEOUT_S * 1000)), f"no reply to {header['op']}"
    return sock.recv_multipart()


def test_a_client_written_from_the_page_alone(start_daemon: StartDaemon, pages: Pages) -> None:
    daemon = start_daemon()
    (key, other), (record, _) = pages(2)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(daemon.endpoint)
    try:
        pong = msgpack.unpackb(call(sock, {"v": 1, "op": "PING", "id": 1})[0])
        assert pong["ok"] is True and pong["id"] == 1 and pong["server"].startswith("hicache")
        put = msgpack.unpackb(call(sock, {"v": 1, "op": "PUT", "id": 7, "keys": [key]}, record)[0])
        assert put == {"v": 1, "id": 7, "ok": True, "stored": [True]}
        head, *records = call(sock, {"v": 1, "op": "GET", "id": 8, "keys": [key, other]})
        assert msgpack.unpackb(head)["found"] == [True, False] and records == [record]
        exists = msgpack.unpackb(call(sock, {"v": 1, "op": "EXISTS", "id": 9, "keys": [key]})[0])
        assert exists["count"] == 1
        bad = msgpack.unpackb(call(sock, {"v": 2, "op": "PING", "id": 10})[0])
        assert (bad["ok"], bad["id"], bad["code"]) == (False, 10, "BAD_VERSION")
        frames = call(sock, {"v": 1, "op": "PUT", "id": 11, "keys": [other]})  # no record
        assert msgpack.unpackb(frames[0])["code"] == "BAD_FRAMES"
        junk = msgpack.unpackb(call(sock, {"v": 1, "op": "PING", "id": 12}, b"x")[0])
        assert junk["code"] == "BAD_FRAMES"
        gone = msgpack.unpackb(call(sock, {"v": 1, "op": "DELETE", "id": 13, "keys": [key]})[0])
        assert gone["deleted"] == 1
        stats = msgpack.unpackb(call(sock, {"v": 1, "op": "STATS", "id": 14})[0])["stats"]
        assert stats['hicache_daemon_requests_total{op="PUT"}'] == 1
        assert stats['hicache_daemon_errors_total{code="BAD_FRAMES"}'] == 2
        unreadable = msgpack.unpackb(call(sock, {"op": "PING"} | {"v": 1, "id": "x"})[0])
        assert unreadable["id"] is None and unreadable["code"] == "MALFORMED"
    finally:
        sock.close(0)


def test_the_exchange_shown_is_what_the_daemon_sends() -> None:
    """The error in the example is the one the reference encoder writes."""
    text = DOC.read_text()
    assert re.search(r'"code": "BAD_VERSION", "message": "protocol version 2 != 1"', text)
    with pytest.raises(protocol.ProtocolError) as caught:
        protocol.decode_request([msgpack.packb({"v": 2, "op": "PING", "id": 9})], Limits())
    assert (caught.value.code, caught.value.message) == (
        ErrorCode.BAD_VERSION,
        "protocol version 2 != 1",
    )
