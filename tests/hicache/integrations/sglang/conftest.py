"""Set-up of the SGLang adapter tests: SGLang's real classes from its pinned wheel.

``make test`` installs ``sglang`` with ``--no-deps`` (requirements/engines.txt).
The storage modules this adapter uses (``hicache_storage``, the backend
factory) import only torch and ``sglang.srt.environ``; SGLang's top-level
``sglang/__init__.py``, though, loads its client front-end (transformers,
requests, the HF patches), which has nothing to do with storage. So the
``sglang`` package is entered here without running its ``__init__``: every
submodule still comes from the installed wheel, unchanged. The light packages
those submodules import are in requirements/engine-deps.txt; triton (GPU-only)
is stood in for by an empty module.

Fixtures start their servers themselves (a daemon through
``hicache.bench.common.processes``, on OS-picked loopback ports) and stop them by PID.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hicache.bench.common.processes import ServerProcess, start_daemon
from hicache.integrations.sglang_cpu import enter_sglang
from storage_backends.remote.keys import keygen

enter_sglang()

StartDaemon = Callable[..., ServerProcess]


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[StartDaemon]:
    """``daemon_factory(store_name="store", config="daemon", keys=None)`` → a running daemon
    (answering PING); every one started is stopped at teardown."""
    started: list[ServerProcess] = []

    def start(
        store_name: str = "store",
        config: str | Path = "daemon",
        keys: tuple[str, str] | None = None,
    ) -> ServerProcess:
        server = start_daemon(config, tmp_path / store_name, keys=keys)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.kill()


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One daemon for a whole test module (tests keep apart by model name)."""
    root = tmp_path_factory.mktemp("sglang-daemon")
    server = start_daemon("daemon", root / "store")
    yield server
    server.kill()


class CurveSetup:
    """A CURVE daemon with tenants ``alice`` and ``bob`` and their key files."""

    def __init__(self, root: Path, start: StartDaemon) -> None:
        keys = root / "keys"
        for name in ("server", "alice", "bob"):
            keygen(keys, name)
        self.keys = keys
        config = root / "curve.toml"
        config.write_text(
            '[server]\nendpoint = "tcp://127.0.0.1:0"\n'
            f'[store]\npath = "{root / "curve-store"}"\nmax_bytes = {64 << 20}\n'
            "[auth]\ncurve = true\n"
            f'server_secret_key = "{keys / "server.key_secret"}"\n'
            f'[[auth.tenants]]\nname = "alice"\npublic_key = "{keys / "alice.key"}"\n'
            f'[[auth.tenants]]\nname = "bob"\npublic_key = "{keys / "bob.key"}"\n'
        )
        self.server = start("curve-store", config, self.client_keys("alice"))

    def client_keys(self, name: str) -> tuple[str, str]:
        return str(self.keys / f"{name}.key_secret"), str(self.keys / "server.key")


@pytest.fixture
def curve_daemon(tmp_path: Path, daemon_factory: StartDaemon) -> CurveSetup:
    return CurveSetup(tmp_path, daemon_factory)
