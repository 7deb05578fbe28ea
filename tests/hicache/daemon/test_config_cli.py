"""Daemon config validation and the serve / keygen / stats commands."""

from __future__ import annotations

import re
import stat
import sys
from pathlib import Path

import pytest

from hicache.bench.common.processes import DAEMON_BANNER, ServerProcess, wait_ping
from hicache.cli import main as hicache_main
from hicache.config.daemon import DaemonConfig
from hicache.daemon.cli import main as daemon_main
from storage_backends.config import sync_level

REPO = Path(__file__).resolve().parents[3]


def test_shipped_config_loads() -> None:
    config = DaemonConfig.from_toml(REPO / "configs" / "daemon.toml")
    assert config.server.endpoint.startswith("tcp://127.0.0.1:") and not config.auth.curve
    assert config.limits.max_batch_keys == 4096


@pytest.mark.parametrize(
    "value,level", [("true", "full"), ("false", "none"), ("'index'", "index"), ("'full'", "full")]
)
def test_store_sync_takes_the_storage_words_and_the_old_booleans(
    tmp_path: Path, value: str, level: str
) -> None:
    path = tmp_path / "daemon.toml"
    path.write_text(f"[store]\nsync = {value}\n")
    assert sync_level(DaemonConfig.from_toml(path).store.sync).value == level
    assert DaemonConfig().store.sync == "index"  # the default: committed, not fsynced


@pytest.mark.parametrize(
    "text,message",
    [
        ("[server]\nport = 1\n", "server.port: unknown key"),
        ("[sever]\n", "sever: unknown key; did you mean server?"),
        (
            "[store]\nmemory_byte = 1\n",
            "store.memory_byte: unknown key; did you mean store.memory_bytes?",
        ),
        (
            "[[auth.tenants]]\nname = 'a'\n",
            "auth.tenants.public_key: missing; this key is required",
        ),
        ("[store]\nmax_bytes = '1'\n", 'store.max_bytes: expected an integer, got "1"'),
        ("[store]\nsync = 1\n", "store.sync: expected a string, got 1"),
        ("[store]\nsync = 'always'\n", "store.sync: must be one of ('none', 'index', 'full')"),
        ("[store]\nbackend = 'redis'\n", "store.backend: must be one of ('lmdb', 'disk')"),
        ("[limits]\nmax_batch_keys = 0\n", "limits.max_batch_keys: must be an int >= 1, got 0"),
        ("[server]\nendpoint = 'tcp://127.0.0.1'\n", "server.endpoint: needs a port"),
        ("[server]\nendpoint = 'udp://x:1'\n", "server.endpoint: must be tcp"),
        ("[server]\nio_threads = 0\n", "server.io_threads: must be >= 1"),
        ("[server]\nbackground_nice = 20\n", "server.background_nice: must be 0..19"),
        ("[server]\nbackground_nice = -1\n", "server.background_nice: must be 0..19"),
        ("[server]\nendpoint = 'tcp://0.0.0.0:1'\n", "is not loopback"),
        ("[auth]\ncurve = true\n", "auth.server_secret_key: required"),
        (
            "[auth]\ntenants = 3\n",
            "auth.tenants: expected an array of tables ([[auth.tenants]]), got 3",
        ),
        ("[[auth.tenants]]\nname = 'a b'\npublic_key = 'k'\n", "auth.tenants.name"),
        ("[metrics]\nport = 70000\n", "metrics.port"),
        ("server = 1\n", "server: expected a table, got 1"),
        ("[server\n", "invalid TOML"),
    ],
)
def test_bad_configs_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "daemon.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        DaemonConfig.from_toml(path)
    assert str(info.value).startswith(f"{path}: ")


def test_set_on_the_daemon_config_names_the_flag() -> None:
    path = REPO / "configs" / "daemon.toml"
    assert DaemonConfig.from_toml(path, {"store.memory_bytes": 5}).store.memory_bytes == 5
    with pytest.raises(ValueError) as info:
        DaemonConfig.from_toml(path, {"store.memory_bytes": -1})
    assert str(info.value) == "--set store.memory_bytes: must be >= 0"
    with pytest.raises(
        ValueError, match=r"^--set stor\.path: unknown key; did you mean store\.path"
    ):
        DaemonConfig.from_toml(path, {"stor.path": "x"})


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
    public, secret = tmp_path / "keys" / "alice.key", tmp_path / "keys" / "alice.key_secret"
    assert public.is_file() and secret.is_file()
    assert "alice.key_secret" in capsys.readouterr().out
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644


def test_keygen_keeps_an_existing_pair_without_force(tmp_path: Path, capsys) -> None:
    keys = tmp_path / "keys"
    assert hicache_main(["keygen", str(keys), "--name", "srv"]) == 0
    before = {p.name: p.read_bytes() for p in keys.iterdir()}
    assert hicache_main(["keygen", str(keys), "--name", "srv"]) == 2
    err = capsys.readouterr().err
    assert "srv.key" in err and "--force" in err
    assert {p.name: p.read_bytes() for p in keys.iterdir()} == before
    assert hicache_main(["keygen", str(keys), "--name", "srv", "--force"]) == 0
    after = {p.name: p.read_bytes() for p in keys.iterdir()}
    assert after.keys() == before.keys() and after != before
    assert stat.S_IMODE((keys / "srv.key_secret").stat().st_mode) == 0o600


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
    rows = {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines()}
    assert rows['hicache_daemon_requests_total{op="PING"}'] == "1"  # an integer, not 1.0
    assert rows["hicache_daemon_store_pages"] == "0"
    assert rows["hicache_daemon_store_capacity_bytes"] == "67,108,864 B (64.0 MiB)"
    assert "." not in "".join(v for k, v in rows.items() if k.endswith("_total"))
    assert daemon_main(["stats", "--connect", "tcp://127.0.0.1:1", "--timeout", "0.2"]) == 1


def test_serve_reports_a_busy_endpoint_and_exits_2(start_daemon, tmp_path: Path, capsys) -> None:
    daemon = start_daemon()
    argv = ["serve", "--config", str(REPO / "configs" / "daemon.toml"), "--metrics-port", "-1"]
    argv += ["--endpoint", daemon.endpoint, "--store", str(tmp_path / "second")]
    assert daemon_main(argv) == 2
    assert "cannot listen" in capsys.readouterr().err


def test_serve_and_stats_take_set_and_the_banner_says_metrics_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [sys.executable, "-m", "hicache.cli", "serve", "-v"]
    for key in ("server.endpoint=tcp://127.0.0.1:0", "metrics.port=-1", "store.sync=false"):
        argv += ["--set", key]
    argv += ["--set", f"store.path={tmp_path / 'store'}"]
    log = tmp_path / "daemon.log"
    with ServerProcess(argv, DAEMON_BANNER, log) as server:
        wait_ping(server.endpoint)
        # No --connect: stats asks the daemon its config (here, --set) names.
        assert hicache_main(["stats", "-v", "--set", f"server.endpoint={server.endpoint}"]) == 0
        assert server.stop() == 0
    assert "hicache_daemon_store_pages" in capsys.readouterr().out
    banner = next(line for line in log.read_text().splitlines() if DAEMON_BANNER in line)
    assert banner.endswith("(metrics off)"), banner
    assert (tmp_path / "store").is_dir()


def test_serve_refuses_a_bad_set_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert hicache_main(["serve", "--set", "store.memory_bytes=lots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == 'hicache serve: --set store.memory_bytes: expected an integer, got "lots"'


def test_serve_flags_count_in_the_checks_across_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Shared memory needs an ipc endpoint: ``--endpoint ipc://`` over a tcp config is seen
    by that check (it used to run before the flags were applied, refusing the pair)."""
    argv = [sys.executable, "-m", "hicache.cli", "serve", "--config", "daemon"]
    argv += ["--set", "server.shm_bytes=1048576", "--metrics-port", "-1"]
    argv += ["--endpoint", f"ipc://{tmp_path / 'sock'}", "--store", str(tmp_path / "store")]
    with ServerProcess(argv, DAEMON_BANNER, tmp_path / "daemon.log") as server:
        wait_ping(server.endpoint)
        assert server.endpoint.startswith("ipc://")
        assert server.stop() == 0
    tcp = ["serve", "--config", "daemon", "--set", "server.shm_bytes=1048576", "--metrics-port"]
    assert hicache_main([*tcp, "-1"]) == 2
    assert "server.shm_bytes" in capsys.readouterr().err
