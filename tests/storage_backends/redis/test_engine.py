"""Engines over the redis tier: outputs equal a full recompute bit for bit, across processes.

The pages go through the session's 3-master cluster; the cluster is flushed
first because every engine of the tiny model shares its fingerprint.
"""

from __future__ import annotations

import dataclasses
import random
import subprocess
import sys
from pathlib import Path

import pytest

from hicache.config.cache import CacheConfig
from storage_backends import StorageConfig
from storage_backends.redis.cluster import LocalRedisCluster
from tests.hicache.engine.helpers import (
    assert_clean,
    assert_same,
    chat,
    config,
    engine,
    push_to_storage,
    reference,
    tokens,
)

REPO = Path(__file__).resolve().parents[3]
PAGE_SIZE = 16

WRITER = """
import sys
from tests.storage_backends.redis.test_engine import redis_config, user_turns
from tests.hicache.engine.helpers import chat, engine, push_to_storage
eng = engine(redis_config(sys.argv[1]))
chat(eng, user_turns(int(sys.argv[2])), between=push_to_storage)
eng.cache.close()
"""


def redis_config(endpoint: str) -> CacheConfig:
    storage = StorageConfig(backend="redis", endpoint=endpoint, max_bytes=64 << 20)
    return dataclasses.replace(config(PAGE_SIZE, 1024, host=True), storage=storage)


def user_turns(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [tokens(rng, n) for n in (40, 21, 33, 18)]


@pytest.fixture
def endpoint(redis_cluster: LocalRedisCluster) -> str:
    for index in range(len(redis_cluster.nodes)):
        client = redis_cluster.client(index)
        client.flushall()
        client.close()
    return redis_cluster.endpoint


def test_outputs_through_redis_equal_the_reference(endpoint: str) -> None:
    turns = user_turns(31)
    want = chat(reference(), turns)
    eng = engine(redis_config(endpoint))
    got = chat(eng, turns, between=push_to_storage)
    assert_same(got, want)
    assert all(out.hits.storage > 0 and out.hits.device == 0 for out in got[1:])
    assert_clean(eng.cache)
    eng.cache.close()


def test_two_engine_processes_share_pages(endpoint: str) -> None:
    """Another process writes the chat's pages; this one reuses them and matches the reference."""
    subprocess.run(
        [sys.executable, "-c", WRITER, endpoint, "32"], cwd=REPO, check=True, timeout=120
    )
    turns = user_turns(32)
    want = chat(reference(), turns)
    eng = engine(redis_config(endpoint))
    got = chat(eng, turns)
    assert_same(got, want)
    assert all(out.hits.storage > 0 for out in got)  # even the first turn: the writer's pages
    assert_clean(eng.cache)
    eng.cache.close()
