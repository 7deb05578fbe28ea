"""CURVE on: unknown clients get nothing; tenants cannot read, overwrite or probe each other."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import zmq.auth

from hicache.daemon.cli import main as daemon_main
from storage_backends import StorageConfig, create
from storage_backends.remote.keys import keygen
from storage_backends.remote.protocol import DeleteReply, ExistsReply, Op, PingReply

from .conftest import ON_EVERY_STORE, daemon_toml, page_record

NO_REPLY_WAIT_S = 1.0


@pytest.fixture
def curve_daemon(start_daemon, tmp_path: Path, daemon_backend: str):
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
    return start_daemon(daemon_toml(tmp_path / "store", backend=daemon_backend) + auth), keys


def _curve(keys: Path, name: str) -> tuple[bytes, bytes, bytes]:
    server_public, _ = zmq.auth.load_certificate(str(keys / "server.key"))
    public, secret = zmq.auth.load_certificate(str(keys / f"{name}.key_secret"))
    assert secret is not None
    return server_public, public, secret


def test_clients_without_an_allowed_key_get_nothing(curve_daemon, connect) -> None:
    daemon, keys = curve_daemon
    alice = connect(daemon.endpoint, _curve(keys, "alice"))
    daemon.wait_ping(alice)
    mallory = connect(daemon.endpoint, _curve(keys, "mallory"))
    # Unsendable (the refused handshake took the peer away) or unanswered: nothing either way.
    assert mallory.call(Op.PING, timeout_s=NO_REPLY_WAIT_S) is None
    assert daemon.wait_log("refused a CURVE client with an unknown key")  # it did knock
    assert mallory.call(Op.PING, timeout_s=NO_REPLY_WAIT_S) is None  # after the refusal too
    assert connect(daemon.endpoint).call(Op.PING, timeout_s=NO_REPLY_WAIT_S) is None  # no CURVE
    stats = alice.call(Op.STATS).stats
    assert stats['hicache_daemon_requests_total{op="PING"}'] == 1  # only alice's


@ON_EVERY_STORE
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
        with caplog.at_level(logging.WARNING, logger="storage_backends.remote.link"):
            assert backend.exists([b"k" * 32]) == 0
            assert backend.exists([b"k" * 32]) == 0
    finally:
        backend.close()
    hints = [r for r in caplog.records if "storage.curve_server_key" in r.getMessage()]
    assert len(hints) == 1, caplog.text  # once, on the first timeout
    argv = ["stats", "--connect", daemon.endpoint, "--timeout", str(NO_REPLY_WAIT_S)]
    assert daemon_main(argv) == 1
    assert "--server-key" in capsys.readouterr().err


@pytest.fixture
def quota_daemon(start_daemon, tmp_path: Path, daemon_backend: str):
    """alice shares a 256 KiB store; bob has a 64 KiB store of his own; ops is an admin."""
    keys = tmp_path / "keys"
    for name in ("server", "alice", "bob", "ops"):
        keygen(keys, name)
    tenants = {"alice": "", "bob": f"max_store_bytes = {64 << 10}", "ops": "admin = true"}
    auth = f'[auth]\ncurve = true\nserver_secret_key = "{keys / "server.key_secret"}"\n'
    for name, more in tenants.items():
        auth += f'[[auth.tenants]]\nname = "{name}"\npublic_key = "{keys / name}.key"\n{more}\n'
    # memory_bytes=0: every GET reads the stores
    config = daemon_toml(tmp_path / "store", memory_bytes=0, backend=daemon_backend)
    config = config.replace(f"max_bytes = {64 << 20}", f"max_bytes = {256 << 10}")
    return start_daemon(config + auth), keys


@ON_EVERY_STORE
def test_a_tenant_s_stats_are_its_own_and_an_admin_sees_all(quota_daemon, connect) -> None:
    daemon, keys = quota_daemon
    alice, bob, ops = (connect(daemon.endpoint, _curve(keys, n)) for n in ("alice", "bob", "ops"))
    records = [page_record(bytes([i]) * 32, i, 1024) for i in range(8)]
    assert alice.put([bytes([i]) * 32 for i in range(3)], records[:3]) == (True,) * 3
    assert bob.put([bytes([i]) * 32 for i in range(3, 8)], records[3:]) == (True,) * 5
    pages = "hicache_daemon_store_pages"
    assert pages not in daemon.stat_map(alice)  # a shared store's share is not known
    assert daemon.stat_map(alice)['hicache_daemon_requests_total{op="PUT"}'] == 1
    assert daemon.stat_map(bob)[pages] == 5
    assert daemon.stat_map(ops)[pages] == 8


@ON_EVERY_STORE
def test_a_tenant_over_its_quota_evicts_only_its_own_pages(quota_daemon, connect) -> None:
    daemon, keys = quota_daemon
    alice, bob = (
        connect(daemon.endpoint, _curve(keys, "alice")),
        connect(daemon.endpoint, _curve(keys, "bob")),
    )
    mine = [bytes([i]) * 32 for i in range(16)]
    records = [page_record(key, i, 4096) for i, key in enumerate(mine)]
    assert alice.put(mine, records) == (True,) * 16
    for batch in range(16):  # 256 KiB from bob: four times his quota
        flood = [bytes([batch, i]) * 16 for i in range(4)]
        assert bob.put(flood, [page_record(k, 0, 4096) for k in flood]) == (True,) * 4
    assert alice.get(mine) == records
    bob_stats = daemon.stat_map(bob)
    assert bob_stats["hicache_daemon_store_used_bytes"] <= 64 << 10
    assert bob_stats['hicache_daemon_evictions_total{tier="store"}'] > 0
