"""Daemon config validation and the serve / keygen / stats commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hicache.cli import main as hicache_main
from hicache.daemon.cli import main as daemon_main
from hicache.daemon.config import DaemonConfig

REPO = Path(__file__).resolve().parents[2]


def test_shipped_config_loads() -> None:
    config = DaemonConfig.from_toml(REPO / "configs" / "daemon.toml")
    assert config.server.endpoint.startswith("tcp://127.0.0.1:") and not config.auth.curve
    assert config.limits.max_batch_keys == 4096


@pytest.mark.parametrize(
    "text,message",
    [
        ("[server]\nport = 1\n", "server.port: unknown key"),
        ("[store]\nmax_bytes = '1'\n", "store.max_bytes: expected int"),
        ("[store]\nsync = 1\n", "store.sync: expected bool"),
        ("[limits]\nmax_batch_keys = 0\n", "max_batch_keys must be an int >= 1"),
        ("[server]\nendpoint = 'tcp://127.0.0.1'\n", "server.endpoint: needs a port"),
        ("[server]\nendpoint = 'udp://x:1'\n", "server.endpoint: must be tcp"),
        ("[server]\nendpoint = 'tcp://0.0.0.0:1'\n", "is not loopback"),
        ("[auth]\ncurve = true\n", "auth.server_secret_key: required"),
        ("[auth]\ntenants = 3\n", "auth.tenants: must be an array of tables"),
        ("[[auth.tenants]]\nname = 'a b'\npublic_key = 'k'\n", "auth.tenants.name"),
        ("[metrics]\nport = 70000\n", "metrics.port"),
        ("server = 1\n", "server: must be a table"),
        ("[server\n", "invalid TOML"),
    ],
)
def test_bad_configs_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "daemon.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        DaemonConfig.from_toml(path)
    assert str(path) in str(info.value)


def test_remote_bind_needs_explicit_consent_and_overrides_are_validated() -> None:
    config = DaemonConfig.from_mapping(
        {"server": {"endpoint": "tcp://0.0.0.0:5557", "allow_remote": True}}
    )
    assert config.server.allow_remote
    changed = DaemonConfig().with_overrides(store={"path": "/tmp/x"}, metrics={})
    assert changed.store.path == "/tmp/x"
    with pytest.raises(ValueError, match=r"store\.max_bytes"):
        DaemonConfig().with_overrides(store={"max_bytes": 0})


def test_keygen_through_the_hicache_command(tmp_path: Path, capsys) -> None:
    assert hicache_main(["keygen", str(tmp_path / "keys"), "--name", "alice"]) == 0
    assert (tmp_path / "keys" / "alice.key").is_file()
    assert (tmp_path / "keys" / "alice.key_secret").is_file()
    assert "alice.key_secret" in capsys.readouterr().out


def test_serve_reports_a_bad_config_and_exits_2(tmp_path: Path, capsys) -> None:
    path = tmp_path / "daemon.toml"
    path.write_text("[store]\nmax_bytes = -1\n")
    assert daemon_main(["serve", "--config", str(path)]) == 2
    assert "store.max_bytes" in capsys.readouterr().err
    missing_parent = tmp_path / "no" / "store"
    assert daemon_main(["serve", "--config", str(path), "--store", str(missing_parent)]) == 2


def test_stats_prints_a_running_daemon_s_counters(start_daemon, connect, capsys) -> None:
    daemon = start_daemon()
    daemon.wait_ping(connect(daemon.endpoint))
    assert daemon_main(["stats", "--connect", daemon.endpoint]) == 0
    out = capsys.readouterr().out
    assert 'hicache_daemon_requests_total{op="PING"} 1' in out
    assert "hicache_daemon_store_pages 0" in out
    assert daemon_main(["stats", "--connect", "tcp://127.0.0.1:1", "--timeout", "0.2"]) == 1


def test_serve_reports_a_busy_endpoint_and_exits_2(start_daemon, tmp_path: Path, capsys) -> None:
    daemon = start_daemon()
    argv = ["serve", "--config", str(REPO / "configs" / "daemon.toml"), "--metrics-port", "-1"]
    argv += ["--endpoint", daemon.endpoint, "--store", str(tmp_path / "second")]
    assert daemon_main(argv) == 2
    assert "cannot listen" in capsys.readouterr().err
