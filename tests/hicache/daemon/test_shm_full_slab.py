"""The shared-memory plane of a real daemon on a nearly full slab: a reply the slab can
hold only part of goes as frames and lends nothing, reclaiming that lease frees nothing
twice, and the serve loop survives a sweep that raises.

Raw DEALER clients speak the shared-memory protocol (docs/protocol.md) and never free
their GET slots, so the test knows what the slab holds: leases fill it up to a gap,
then one asks for a small record and a big one (the small one fits the gap, the big
one does not) and goes silent until it is reclaimed.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from hicache.config.daemon import DaemonConfig
from hicache.daemon.shm_extents import GRAIN
from hicache.daemon.shm_plane import ShmPlane
from storage_backends.page_format import HEADER_BYTES, encode_page
from storage_backends.remote.protocol import (
    GetReply,
    Op,
    PingReply,
    Request,
    ShmAttachReply,
    StatsReply,
    decode_reply,
    encode_request,
)
from tests.hicache.daemon.conftest import Client, Daemon, StartDaemon, in_process_daemon
from tests.hicache.daemon.test_shm import BOUND_S, LEASES, LENT, key, payload, shm_toml
from tests.polling import wait_until

SLAB = 1 << 20  # 256 slots of 4 KiB; a lease's share is a quarter: 64 slots
BIG = 24 * GRAIN  # a record of 24 slots
SMALL = 8 * GRAIN


def _call(client: Client, request: Request) -> object:
    frames = client.raw(encode_request(request))
    assert frames is not None, "no reply in time"
    return decode_reply(frames, request.op)


def _attach(client: Client) -> int:
    reply = _call(client, Request(Op.SHM_ATTACH, 1))  # no put area: all of it for GET slots
    assert isinstance(reply, ShmAttachReply) and reply.put.length == 0
    return reply.lease


def _get(client: Client, lease: int, keys: list[bytes]) -> GetReply:
    reply = _call(client, Request(Op.GET, 2, tuple(keys), lease=lease))
    assert isinstance(reply, GetReply) and all(reply.found), reply
    return reply


def _stat(client: Client, name: str) -> float:
    reply = _call(client, Request(Op.STATS, 3))
    assert isinstance(reply, StatsReply)
    return reply.stats[name]


def _store(writer: Client) -> tuple[list[bytes], bytes]:
    """Two big records and a small one, stored through frames."""
    big, small = [key(i) for i in range(2)], key(9)
    records = [encode_page(k, payload(i, BIG - HEADER_BYTES)) for i, k in enumerate(big)]
    records.append(encode_page(small, payload(9, SMALL - HEADER_BYTES)))
    assert writer.put([*big, small], records) == (True,) * 3
    return big, small


def test_a_reply_the_full_slab_holds_only_part_of_lends_nothing(
    start_daemon: StartDaemon, tmp_path: Path, connect
) -> None:
    # Leases are reclaimed 1.5 s after their last request.
    config = shm_toml(tmp_path, shm_bytes=SLAB).replace("heartbeat_s = 0.2", "heartbeat_s = 0.5")
    daemon: Daemon = start_daemon(config)
    writer = connect(daemon.endpoint)
    daemon.wait_ping(writer)
    big, small = _store(writer)
    holders = [connect(daemon.endpoint) for _ in range(5)]
    leases = [_attach(holder) for holder in holders]
    for holder, lease in zip(holders, leases, strict=True):  # 48 slots each, never freed
        assert len(_get(holder, lease, big).spans) == 2
    for holder, lease in zip(holders, leases, strict=True):  # renewed: none expires meanwhile
        renewed = _call(holder, Request(Op.SHM_ATTACH, 5, lease=lease))
        assert isinstance(renewed, ShmAttachReply) and renewed.lease == lease
    assert _stat(writer, LENT) == 240 * GRAIN  # 16 slots left
    late = connect(daemon.endpoint)
    reply = _get(late, _attach(late), [small, big[0]])  # 8 slots fit the gap, 24 do not
    assert not reply.spans and len(reply.pages) == 2  # so the reply went as frames
    assert _stat(writer, LENT) == 240 * GRAIN  # and nothing is lent for it
    # Every lease goes silent and is reclaimed with what it held; the daemon serves on.
    assert wait_until(lambda: _stat(writer, LEASES) == 0 and _stat(writer, LENT) == 0, BOUND_S)
    again = _attach(writer)
    assert len(_get(writer, again, [small, *big]).spans) == 3
    assert _stat(writer, "hicache_daemon_sweep_failures_total") == 0
    assert daemon.alive()


def test_the_serve_loop_survives_a_sweep_that_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, connect, caplog: pytest.LogCaptureFixture
) -> None:
    original = ShmPlane.sweep
    raised: list[int] = []

    def sweep(self: ShmPlane) -> int:
        if len(raised) < 3:
            raised.append(1)
            raise ValueError("span overlaps free space (given back twice?)")
        return original(self)

    monkeypatch.setattr(ShmPlane, "sweep", sweep)
    config = DaemonConfig.from_mapping(tomllib.loads(shm_toml(tmp_path, shm_bytes=SLAB)))
    quiet = dataclasses.replace(config.server, ready_file="")
    with in_process_daemon(dataclasses.replace(config, server=quiet)) as served:
        client = connect(served.endpoint)
        assert wait_until(lambda: len(raised) == 3, BOUND_S)
        assert isinstance(_call(client, Request(Op.PING, 1)), PingReply)
        assert _stat(client, "hicache_daemon_sweep_failures_total") == 3
        assert served.serving.is_alive()
    assert "a sweep failed; serving on" in caplog.text
