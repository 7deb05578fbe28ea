"""RemoteBackend against a real daemon behaves like a dict of first-written pages (hypothesis).

Every example writes under its own key namespace, so one daemon serves them all; the
model runs over frames, and over the daemon's shared memory (``storage.shm``, ipc).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from hicache.bench.common.processes import ServerProcess, start_daemon
from hicache.daemon.oneshot import call
from storage_backends import StorageConfig, create
from storage_backends.remote.client import RemoteBackend
from storage_backends.remote.protocol import Op

PAGE = 512
CONFIG = Path(__file__).resolve().parents[3] / "configs" / "daemon.toml"
IDS = st.lists(st.integers(0, 11), max_size=6)
_examples = itertools.count()


def payload(i: int, version: int) -> bytes:
    return hashlib.sha256(f"{i}/{version}".encode()).digest() * (PAGE // 32)


class RemoteModel(RuleBasedStateMachine):
    endpoint = ""  # set by a subclass per daemon
    shm = False

    def __init__(self) -> None:
        super().__init__()
        config = StorageConfig(
            backend="remote", endpoint=self.endpoint, timeout_s=10.0, shm=self.shm
        )
        backend = create("remote", config)
        assert isinstance(backend, RemoteBackend)
        self.backend = backend
        self.namespace = next(_examples)
        self.model: dict[int, bytes] = {}

    def key(self, i: int) -> bytes:
        return hashlib.sha256(f"{self.namespace}/{i}".encode()).digest()

    @rule(ids=IDS, version=st.integers(0, 3))
    def put(self, ids: list[int], version: int) -> None:
        src = [memoryview(payload(i, version)) for i in ids]
        assert self.backend.put([self.key(i) for i in ids], src) == [True] * len(ids)
        for i in ids:
            self.model.setdefault(i, payload(i, version))  # present keys keep their page

    @rule(ids=IDS)
    def get(self, ids: list[int]) -> None:
        dst = [memoryview(bytearray(PAGE)) for _ in ids]
        hits = self.backend.get([self.key(i) for i in ids], dst)
        assert hits == [i in self.model for i in ids]
        for i, d, hit in zip(ids, dst, hits, strict=True):
            assert not hit or bytes(d) == self.model[i]

    @rule(ids=IDS)
    def exists(self, ids: list[int]) -> None:
        want = next((n for n, i in enumerate(ids) if i not in self.model), len(ids))
        assert self.backend.exists([self.key(i) for i in ids]) == want

    @rule(ids=IDS)
    def contains(self, ids: list[int]) -> None:
        assert self.backend.contains([self.key(i) for i in ids]) == [i in self.model for i in ids]

    @rule(ids=IDS)
    def delete(self, ids: list[int]) -> None:
        present = {i for i in ids if i in self.model}
        assert self.backend.delete([self.key(i) for i in ids]) == len(present)
        for i in present:
            del self.model[i]

    @invariant()
    def link_is_clean(self) -> None:
        link = self.backend.link_stats()
        assert (link.timeouts, link.error_replies, link.bad_replies) == (0, 0, 0)

    def teardown(self) -> None:
        self.backend.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    store = tmp_path_factory.mktemp("remote-stateful") / "store"
    server = start_daemon(CONFIG, store)
    yield server
    server.stop()


def test_remote_backend_matches_a_dict_model(daemon: ServerProcess) -> None:
    machine = type("RemoteModelHere", (RemoteModel,), {"endpoint": daemon.endpoint})
    run_state_machine_as_test(
        machine, settings=settings(max_examples=25, stateful_step_count=15, deadline=None)
    )


def test_remote_backend_through_shared_memory_matches_a_dict_model(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("remote-stateful-shm")
    endpoint = f"ipc://{root}/daemon.sock"
    shm = ["--set", f"server.endpoint={endpoint}", "--set", f"server.shm_bytes={64 << 20}"]
    server = start_daemon(CONFIG, root / "store", endpoint, extra=shm)
    try:
        machine = type("ShmModelHere", (RemoteModel,), {"endpoint": endpoint, "shm": True})
        run_state_machine_as_test(
            machine, settings=settings(max_examples=25, stateful_step_count=15, deadline=None)
        )
        assert call(endpoint, Op.STATS, 10.0).stats["hicache_daemon_shm_leases"] <= 1  # type: ignore[union-attr]
    finally:
        server.stop()
