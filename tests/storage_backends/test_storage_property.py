"""Random batches of put/get/delete/exists against a dict model (memory, LMDB, redis)."""

from __future__ import annotations

import hashlib
import tempfile
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage_backends import StorageBackend, StorageConfig, create
from storage_backends.redis.cluster import LocalRedisCluster


class Op(NamedTuple):
    kind: str
    ids: list[int]
    sizes: list[int]


KEY_POOL = 12
ops = st.builds(
    Op,
    kind=st.sampled_from(["put", "get", "delete", "exists"]),
    ids=st.lists(st.integers(0, KEY_POOL - 1), max_size=6),
    sizes=st.lists(st.integers(1, 300), min_size=6, max_size=6),
)


def _key(i: int) -> bytes:
    return hashlib.sha256(f"model-{i}".encode()).digest()


def _data(i: int, size: int, generation: int) -> bytes:
    return bytes((i * 31 + generation * 7 + j) % 251 for j in range(size))


def _apply(store: StorageBackend, model: dict[int, bytes], op: Op, step: int) -> None:
    keys = [_key(i) for i in op.ids]
    if op.kind == "put":
        blobs = [_data(i, size, step) for i, size in zip(op.ids, op.sizes, strict=False)]
        assert store.put(keys, [memoryview(b) for b in blobs]) == [True] * len(keys)
        for i, blob in zip(op.ids, blobs, strict=True):
            model.setdefault(i, blob)
    elif op.kind == "get":
        sizes = [len(model.get(i, b"?")) for i in op.ids]
        dst = [memoryview(bytearray(size)) for size in sizes]
        assert store.get(keys, dst) == [i in model for i in op.ids]
        for i, buf in zip(op.ids, dst, strict=True):
            assert i not in model or bytes(buf) == model[i]
    elif op.kind == "delete":
        removed = {i for i in op.ids if i in model}
        assert store.delete(keys) == len(removed)
        for i in removed:
            del model[i]
    else:
        leading = next((n for n, i in enumerate(op.ids) if i not in model), len(op.ids))
        assert store.exists(keys) == leading


def _run(config: StorageConfig, program: list[Op]) -> None:
    store = create(config.backend, config)
    model: dict[int, bytes] = {}
    try:
        for step, op in enumerate(program):
            _apply(store, model, op, step)
        stats = store.stats()
        assert stats.entries == len(model)
        assert stats.corrupt == 0
    finally:
        store.close()


@pytest.mark.parametrize("name", ["memory", "lmdb", "disk"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(ops, max_size=12))
def test_backend_matches_dict_model(name: str, program: list[Op]) -> None:
    with tempfile.TemporaryDirectory() as root:
        _run(StorageConfig(backend=name, path=str(Path(root, "store")), max_bytes=1 << 24), program)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(ops, max_size=12))
def test_redis_matches_dict_model(redis_cluster: LocalRedisCluster, program: list[Op]) -> None:
    fingerprint = uuid.uuid4().hex  # every example starts from an empty store
    config = StorageConfig(
        backend="redis", endpoint=redis_cluster.endpoint, fingerprint=fingerprint, max_bytes=1 << 24
    )
    _run(config, program)
