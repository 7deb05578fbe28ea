"""Engines on a shared cache daemon: cross-process prefix reuse and daemon outages, bit for bit.

Outputs are compared with the no-cache reference (greedy tokens and final
logits, bit-identical), as in test_correctness.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from hicache.bench.common.processes import ServerProcess, start_daemon
from hicache.cache import HiRadixCache
from hicache.engine import RequestOutput
from storage_backends.guard import GuardedBackend
from storage_backends.remote.client import RemoteBackend
from tests.hicache.engine.helpers import (
    assert_clean,
    assert_same,
    chat,
    engine,
    push_to_storage,
    reference,
)
from tests.hicache.engine.remote_worker import remote_config, user_turns

REPO = Path(__file__).resolve().parents[3]
DAEMON_CONFIG = REPO / "configs" / "daemon.toml"
WORKER_TIMEOUT_S = 240


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[ServerProcess]:
    server = start_daemon(DAEMON_CONFIG, tmp_path / "store", log_path=tmp_path / "daemon.log")
    yield server
    server.stop()


@pytest.fixture
def want() -> list[RequestOutput]:
    """The no-cache reference (function scope: computed under the one-thread fixture)."""
    return chat(reference(), user_turns())


def run_worker(endpoint: str, out: Path) -> list[tuple[tuple[int, ...], torch.Tensor, int, int]]:
    """One engine process (tests/hicache/engine/remote_worker.py) against the daemon."""
    cmd = [sys.executable, "-m", "tests.hicache.engine.remote_worker", endpoint, str(out)]
    subprocess.run(cmd, check=True, timeout=WORKER_TIMEOUT_S, cwd=REPO)
    result: list[tuple[tuple[int, ...], torch.Tensor, int, int]] = torch.load(out)
    return result


def assert_same_as(
    got: list[tuple[tuple[int, ...], torch.Tensor, int, int]], want: list[RequestOutput]
) -> None:
    for (tokens, logits, _, _), ref in zip(got, want, strict=True):
        assert tokens == ref.output_tokens
        assert torch.equal(logits, ref.final_logits)


def test_two_engine_processes_share_a_prefix(
    daemon: ServerProcess, tmp_path: Path, want: list[RequestOutput]
) -> None:
    first = run_worker(daemon.endpoint, tmp_path / "first.pt")
    assert_same_as(first, want)
    assert first[0][2] == 0 and all(turn[2] > 0 for turn in first[1:])
    second = run_worker(daemon.endpoint, tmp_path / "second.pt")
    assert_same_as(second, want)
    # Its very first prompt was computed by the other process: a storage hit.
    assert second[0][2] > 0 and second[0][3] == 0


def kill_after_first_turn(daemon: ServerProcess) -> Callable[[HiRadixCache], None]:
    turns = 0

    def between(cache: HiRadixCache) -> None:
        nonlocal turns
        push_to_storage(cache)  # drained: this turn's pages are acknowledged
        turns += 1
        if turns == 1:
            daemon.kill()

    return between


def test_engine_runs_on_misses_while_the_daemon_is_dead_then_reuses_after_restart(
    daemon: ServerProcess, tmp_path: Path, want: list[RequestOutput]
) -> None:
    eng = engine(remote_config(daemon.endpoint, timeout_s=0.5))
    got = chat(eng, user_turns(), between=kill_after_first_turn(daemon))
    assert_same(got, want)
    assert all(out.hits.storage == 0 for out in got[1:])  # nothing to fetch from a dead daemon
    assert eng.cache.stats().errors_h2s > 0  # puts failed, counted, not raised
    guard = eng.cache.storage.backend if eng.cache.storage else None
    assert isinstance(guard, GuardedBackend)
    backend = guard.backend
    assert isinstance(backend, RemoteBackend)
    link = backend.link_stats()
    assert link.timeouts > 0 and backend.stats().put_failures > 0
    assert_clean(eng.cache)
    eng.cache.close()

    restarted = start_daemon(DAEMON_CONFIG, tmp_path / "store", daemon.endpoint)
    try:
        again = engine(remote_config(restarted.endpoint))
        outs = chat(again, user_turns()[:1])
        assert_same(outs, want[:1])
        assert outs[0].hits.storage > 0  # the turn acknowledged before kill -9 is served again
        again.cache.close()
    finally:
        restarted.stop()


def test_engine_cli_processes_share_through_configs_remote_toml(daemon: ServerProcess) -> None:
    """``python -m hicache.engine --config configs/remote.toml`` twice: the second process's
    first turn is served from the first one's pages."""
    cmd = [sys.executable, "-m", "hicache.engine", "--config", "configs/remote.toml"]
    cmd += ["--set", f"storage.endpoint={daemon.endpoint}", "--set", "device.device=cpu"]
    cmd += ["--turns", "1", "--turn-tokens", "160", "--hidden", "64", "--evict", "storage"]
    storage_hits = []
    for _ in range(2):
        done = subprocess.run(
            cmd, check=True, capture_output=True, text=True, timeout=120, cwd=REPO
        )
        turn = done.stdout.splitlines()[-1].split()  # turn prompt device host storage ttft
        assert turn[:2] == ["1", "160"]
        storage_hits.append(int(turn[4]))
    assert storage_hits[0] == 0 and storage_hits[1] > 0
