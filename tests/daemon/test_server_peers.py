"""Idle and never-handshaking peers: the daemon raises its fd limit, bounds its peers, drops
connections that do not handshake, and a new engine still gets answers."""

from __future__ import annotations

import resource
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

from storage_backends.remote.protocol import Op, PingReply

from .conftest import daemon_toml

SOFT_LIMIT = 128  # what the daemon inherits; it must raise it to the hard limit
IDLE_PEERS = 200
MAX_PEERS = 150
HANDSHAKE_S = 1.0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, USER_HZ = 100


def _closed_by_peer(sock: socket.socket, timeout_s: float) -> bool:
    sock.settimeout(timeout_s)
    try:
        while sock.recv(4096):  # the ZMTP greeting, then EOF
            pass
    except TimeoutError:
        return False
    except OSError:  # reset
        pass
    return True


def test_idle_peers_cannot_lock_new_clients_out(start_daemon, connect, tmp_path) -> None:
    extra = f"max_peers = {MAX_PEERS}\nhandshake_timeout_s = {HANDSHAKE_S}\n"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(SOFT_LIMIT, hard), hard))
    try:
        daemon = start_daemon(daemon_toml(tmp_path / "store", extra))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    address = urlsplit(daemon.endpoint)
    idle = [socket.create_connection((address.hostname, address.port)) for _ in range(IDLE_PEERS)]
    try:
        cpu_before, start = _cpu_s(daemon.proc.pid), time.monotonic()
        # Answered although 200 peers connected first: a connection over the bound is shut
        # (its request lost, as with any dropped link) until the silent peers time out.
        assert any(
            isinstance(connect(daemon.endpoint).call(Op.PING, timeout_s=HANDSHAKE_S), PingReply)
            for _ in range(20)
        )
        dropped = sum(_closed_by_peer(sock, 10 * HANDSHAKE_S) for sock in idle)
        busy = (_cpu_s(daemon.proc.pid) - cpu_before) / (time.monotonic() - start)
    finally:
        for sock in idle:
            sock.close()
    print(f"daemon CPU {busy:.0%} with {IDLE_PEERS} idle peers; {dropped} dropped")
    assert dropped == IDLE_PEERS  # over the bound at once, the rest at the handshake timeout
    assert "refused a connection" in daemon.log()


def test_a_new_engine_is_answered_at_once_when_idle_peers_fill_the_slots(
    start_daemon, connect, tmp_path
) -> None:
    extra = "max_peers = 4\nhandshake_timeout_s = 60.0\n"  # the idle ones are not timed out
    daemon = start_daemon(daemon_toml(tmp_path / "store", extra))
    address = urlsplit(daemon.endpoint)
    idle = [socket.create_connection((address.hostname, address.port)) for _ in range(3)]
    try:
        engine = connect(daemon.endpoint)  # after the idle ones, and it talks
        deadline = time.monotonic() + 30
        while daemon.stat(engine, "hicache_daemon_peers") < 4:
            assert time.monotonic() < deadline, "the daemon did not count its peers"
        newcomer = connect(daemon.endpoint)
        # One try: the slot of the idlest connection is given to the newcomer.
        assert isinstance(newcomer.call(Op.PING), PingReply)
        assert isinstance(engine.call(Op.PING), PingReply)  # the talking engine stays
        assert _closed_by_peer(idle[0], 10.0)  # the oldest of the silent ones made room
    finally:
        for sock in idle:
            sock.close()
    assert "refused a connection, the idlest connection" in daemon.log()
