"""Idle and never-handshaking peers: the daemon raises its fd limit, bounds its peers, drops
connections that do not handshake, and a new engine still gets answers."""

from __future__ import annotations

import resource
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

from hicache.daemon.peers import idle_ms
from storage_backends.remote.protocol import Op, PingReply
from tests.polling import wait_until

from .conftest import daemon_toml

SOFT_LIMIT = 128  # what the daemon inherits; it must raise it to the hard limit
IDLE_PEERS = 200
MAX_PEERS = 150
HANDSHAKE_S = 1.0
PEERS = "hicache_daemon_peers"


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
        # More silent peers than the inherited fd limit: every one is dropped (over the bound
        # at once, the rest at the handshake timeout), however slowly they were accepted.
        dropped = sum(_closed_by_peer(sock, 10 * HANDSHAKE_S) for sock in idle)
        busy = (_cpu_s(daemon.proc.pid) - cpu_before) / (time.monotonic() - start)
    finally:
        for sock in idle:
            sock.close()
    print(f"daemon CPU {busy:.0%} with {IDLE_PEERS} idle peers; {dropped} dropped")
    assert dropped == IDLE_PEERS
    first = connect(daemon.endpoint)
    assert isinstance(first.call(Op.PING), PingReply)  # the silent peers locked no one out
    assert wait_until(lambda: daemon.stat(first, PEERS) == 1, 10 * HANDSHAKE_S)


def test_peers_over_the_bound_are_refused(start_daemon, connect, tmp_path) -> None:
    extra = f"max_peers = {MAX_PEERS}\nhandshake_timeout_s = {HANDSHAKE_S}\n"
    daemon = start_daemon(daemon_toml(tmp_path / "store", extra))
    clients = [connect(daemon.endpoint) for _ in range(MAX_PEERS)]
    for client in clients:  # each one handshaken and counted: the bound is reached, not raced
        assert isinstance(client.call(Op.PING), PingReply)
    assert wait_until(lambda: daemon.stat(clients[0], PEERS) == MAX_PEERS, 10 * HANDSHAKE_S)
    address = urlsplit(daemon.endpoint)
    with socket.create_connection((address.hostname, address.port)) as over:
        # The newcomer, not an engine that talked a moment ago (none was silent long enough).
        assert daemon.wait_log("refused a connection, a new connection")
        assert _closed_by_peer(over, 10 * HANDSHAKE_S)
    assert isinstance(clients[-1].call(Op.PING), PingReply)  # those inside keep their answers


def test_a_new_engine_is_answered_at_once_when_idle_peers_fill_the_slots(
    start_daemon, connect, tmp_path
) -> None:
    # Heartbeats keep a live engine's connection fresher than 2 intervals; the silent ones
    # (never handshaken, so never heartbeaten) are not timed out here.
    extra = "max_peers = 4\nhandshake_timeout_s = 60.0\nheartbeat_s = 0.25\n"
    daemon = start_daemon(daemon_toml(tmp_path / "store", extra))
    address = urlsplit(daemon.endpoint)
    idle = [socket.create_connection((address.hostname, address.port)) for _ in range(3)]
    try:
        engine = connect(daemon.endpoint)  # after the idle ones, and it talks
        assert isinstance(engine.call(Op.PING), PingReply)
        assert wait_until(lambda: daemon.stat(engine, PEERS) == 4, 30.0)
        # Silent for longer than two heartbeat intervals: idle enough to make room.
        assert wait_until(lambda: all((idle_ms(s.fileno()) or 0) > 600 for s in idle), 30.0)
        newcomer = connect(daemon.endpoint)
        # One try: the slot of the idlest connection is given to the newcomer.
        assert isinstance(newcomer.call(Op.PING), PingReply)
        assert isinstance(engine.call(Op.PING), PingReply)  # the talking engine stays
        assert _closed_by_peer(idle[0], 10.0)  # the oldest of the silent ones made room
    finally:
        for sock in idle:
            sock.close()
    assert daemon.wait_log("refused a connection, the idlest connection")
