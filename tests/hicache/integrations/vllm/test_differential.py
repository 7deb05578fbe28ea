"""The same store / lookup / load sequences against vLLM's own ``fs`` tier and
against HicacheTier (LMDB, the daemon, Redis): identical lookup answers,
identical job results and identical bytes in the primary tier.

Loads ask only for keys a lookup answered HIT, as vLLM's tiering manager
does (it promotes a chunk only after a secondary tier's HIT).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm.v1.kv_offload.base import LookupResult

from hicache.bench.common.processes import ServerProcess
from hicache.integrations.vllm_cpu import (
    PrimaryBuffer,
    TierDriver,
    cpu_offloading_spec,
    create_tier,
)
from tests.hicache.integrations.vllm.helpers import (
    CHUNK,
    fs_tier,
    key,
    lmdb_tier,
    payload,
    redis_tier,
    remote_tier,
)

CHUNKS = 16
BLOCKS = st.tuples(st.integers(0, 9), st.integers(0, 1))  # (block, KV group)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.lists(BLOCKS, min_size=1, max_size=5), st.integers(0, 2)),
        st.tuples(st.just("lookup"), st.lists(BLOCKS, min_size=1, max_size=6), st.just(0)),
        st.tuples(st.just("load"), st.lists(BLOCKS, min_size=1, max_size=5), st.just(0)),
    ),
    min_size=1,
    max_size=7,
)
_runs = itertools.count()


class Pair:
    """vLLM's fs tier and ours, each over its own primary buffer."""

    def __init__(self, ours: dict[str, Any], root: Path, model: str) -> None:
        spec = cpu_offloading_spec(CHUNK, CHUNKS, model=model)
        self.primaries = (PrimaryBuffer(CHUNKS, CHUNK), PrimaryBuffer(CHUNKS, CHUNK))
        self.drivers = (
            TierDriver(create_tier(fs_tier(root), self.primaries[0], spec)),
            TierDriver(create_tier({**ours, "workers": 2}, self.primaries[1], spec)),
        )

    def both(self, act: Callable[[TierDriver, PrimaryBuffer], object]) -> object:
        answers = [act(d, p) for d, p in zip(self.drivers, self.primaries, strict=True)]
        assert answers[0] == answers[1]
        assert self.primaries[0].array.tobytes() == self.primaries[1].array.tobytes()
        return answers[0]

    def close(self) -> None:
        for driver in self.drivers:
            driver.tier.shutdown()


def store(
    blocks: list[tuple[int, int]], version: int
) -> Callable[[TierDriver, PrimaryBuffer], object]:
    def act(driver: TierDriver, primary: PrimaryBuffer) -> object:
        unique = list(dict.fromkeys(blocks))
        for slot, (n, g) in enumerate(unique):
            primary.fill(slot, payload(1000 * version + 10 * n + g))
        keys = [key(n, g) for n, g in unique]
        return [r.success for r in driver.jobs([(keys, list(range(len(keys))))], False)]

    return act


def load(keys: list[bytes]) -> Callable[[TierDriver, PrimaryBuffer], object]:
    def act(driver: TierDriver, primary: PrimaryBuffer) -> object:
        slots = list(range(CHUNKS - len(keys), CHUNKS))
        results = driver.jobs([(keys, slots)], True)  # type: ignore[list-item]
        return [(r.success, r.successful_keys) for r in results]

    return act


def run(pair: Pair, ops: list[tuple[str, list[tuple[int, int]], int]]) -> None:
    for op, blocks, version in ops:
        if op == "store":
            pair.both(store(blocks, version))
        else:
            keys = [key(n, g) for n, g in blocks]
            answers = pair.both(lambda d, _p, keys=keys: d.lookup(keys))
            assert isinstance(answers, list)
            found = [k for k, a in zip(keys, answers, strict=True) if a is LookupResult.HIT]
            hits = list(dict.fromkeys(found))
            if op == "load" and hits:
                pair.both(load(hits))


def backend_config(name: str, request: pytest.FixtureRequest, tmp: Path) -> dict[str, Any]:
    if name == "lmdb":
        return lmdb_tier(tmp / "lmdb")
    if name == "daemon":
        daemon: ServerProcess = request.getfixturevalue("shared_daemon")
        return remote_tier(daemon.endpoint)
    return redis_tier(request.getfixturevalue("redis_endpoint"), f"vllm-diff-{tmp.name}")


@pytest.mark.parametrize("backend", ["lmdb", "daemon", "redis"])
def test_same_answers_and_bytes_as_vllm_fs(
    backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp(f"diff-{backend}")
    ours = backend_config(backend, request, tmp)

    @settings(
        max_examples=10,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(ops=OPS)
    def check(ops: list[tuple[str, list[tuple[int, int]], int]]) -> None:
        run_id = next(_runs)  # a fresh namespace (model) and fs root per example
        pair = Pair(ours, tmp / f"fs-{run_id}", model=f"org/model-{backend}-{run_id}")
        try:
            run(pair, ops)
        finally:
            pair.close()

    check()
