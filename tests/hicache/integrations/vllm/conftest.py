"""Set-up of the vLLM tier tests: vLLM's real offloading classes from its pinned wheel.

``make test`` installs ``vllm`` with ``--no-deps`` (requirements/engines.txt)
and the light packages its offloading modules import
(requirements/engine-deps.txt). ``enter_vllm()`` stands in empty modules for
the two grammar engines vLLM's config imports at module level (xgrammar,
llguidance) when they are missing; every vLLM class used here
(``SecondaryTierFactory``, ``TieringOffloadingSpec``,
``TieringOffloadingManager``, ``AsyncLookupManager``, the ``fs`` tier,
``OffloadKey``, ``TransferJob``, ``JobResult``) is vLLM's own.

Servers (the daemon, redis-server) are started by the fixtures on OS-picked
loopback ports and stopped by PID.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hicache.bench.common.processes import ServerProcess, start_daemon
from hicache.integrations.vllm_cpu import enter_vllm

enter_vllm()


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One daemon for a whole test module (tests keep apart by model name)."""
    server = start_daemon("daemon", tmp_path_factory.mktemp("vllm-daemon") / "store")
    yield server
    server.kill()


@pytest.fixture
def own_daemon(tmp_path: Path) -> Iterator[ServerProcess]:
    """A daemon for one test (which may kill it)."""
    server = start_daemon("daemon", tmp_path / "daemon-store")
    yield server
    if server.proc.poll() is None:
        server.kill()
