"""CURVE on: unknown clients get nothing; tenants cannot read, overwrite or probe each other."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import zmq.auth

from hicache.daemon.auth import keygen
from hicache.daemon.cli import main as daemon_main
from hicache.daemon.protocol import DeleteReply, ExistsReply, Op, PingReply
from storage_backends import StorageConfig, create

from .conftest import daemon_toml, page_record

NO_REPLY_WAIT_S = 1.0


@pytest.fixture
def curve_daemon(start_daemon, tmp_path: Path):
    keys = tmp_path / "keys"
    for name in ("server", "alice", "bob", "mallory"):
        keygen(keys, name)
    alice_public, _ = zmq.auth.load_certificate(str(keys / "alice.key"))
    auth = f"""
[auth]
curve = true
server_secret_key = "{keys / "server.key_secret"}"
[[auth.tenants]]
name = "alice"
public_key = "{alice_public.decode()}"
[[auth.tenants]]
name = "bob"
public_key = "{keys / "bob.key"}"
"""
    return start_daemon(daemon_toml(tmp_path / "store") + auth), keys


def _curve(keys: Path, name: str) -> tuple[bytes, bytes, bytes]:
    server_public, _ = zmq.auth.load_certificate(str(keys / "server.key"))
    public, secret = zmq.auth.load_certificate(str(keys / f"{name}.key_secret"))
    assert secret is not None
    return server_public, public, secret


def test_clients_without_an_allowed_key_get_nothing(curve_daemon, connect) -> None:
    daemon, keys = curve_daemon
    alice = connect(daemon.endpoint, _curve(keys, "alice"))
    daemon.wait_ping(alice)
    for stranger in (connect(daemon.endpoint, _curve(keys, "mallory")), connect(daemon.endpoint)):
        assert stranger.call(Op.PING, timeout_s=NO_REPLY_WAIT_S) is None
    stats = alice.call(Op.STATS).stats
    assert stats['hicache_daemon_requests_total{op="PING"}'] == 1  # only alice's


def test_tenants_see_only_their_own_pages(curve_daemon, connect) -> None:
    daemon, keys = curve_daemon
    alice = connect(daemon.endpoint, _curve(keys, "alice"))
    bob = connect(daemon.endpoint, _curve(keys, "bob"))
    assert isinstance(alice.call(Op.PING), PingReply) and isinstance(bob.call(Op.PING), PingReply)
    shared_key = b"k" * 32
    alice_page, bob_page = page_record(shared_key, 1), page_record(shared_key, 2)
    assert alice.put([shared_key], [alice_page]) == (True,)
    assert bob.put([shared_key], [bob_page]) == (True,)  # not "already there": its own slot
    assert alice.get([shared_key]) == [alice_page]
    assert bob.get([shared_key]) == [bob_page]
    # Probing: alice's private page is a miss for bob under every op.
    private = b"p" * 32
    assert alice.put([private], [page_record(private, 3)]) == (True,)
    assert bob.call(Op.EXISTS, [private]) == ExistsReply(bob._next_id, 0)
    assert bob.get([private]) == [None]
    assert bob.call(Op.DELETE, [private]) == DeleteReply(bob._next_id, 0)
    assert alice.get([private]) == [page_record(private, 3)]


def test_a_client_without_keys_is_told_about_curve(curve_daemon, caplog, capsys) -> None:
    daemon, _ = curve_daemon
    config = StorageConfig(backend="remote", endpoint=daemon.endpoint, timeout_s=NO_REPLY_WAIT_S)
    backend = create("remote", config)
    try:
        with caplog.at_level(logging.WARNING, logger="storage_backends.remote"):
            assert backend.exists([b"k" * 32]) == 0
            assert backend.exists([b"k" * 32]) == 0
    finally:
        backend.close()
    hints = [r for r in caplog.records if "storage.curve_server_key" in r.getMessage()]
    assert len(hints) == 1, caplog.text  # once, on the first timeout
    argv = ["stats", "--connect", daemon.endpoint, "--timeout", str(NO_REPLY_WAIT_S)]
    assert daemon_main(argv) == 1
    assert "--server-key" in capsys.readouterr().err
