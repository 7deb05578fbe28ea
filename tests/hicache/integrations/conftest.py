"""Fixtures both engines' adapter tests use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from storage_backends.redis.cluster import (
    ClusterOptions,
    LocalRedisCluster,
    RedisUnavailableError,
    redis_server_binary,
)


@pytest.fixture(scope="module")
def redis_endpoint() -> Iterator[str]:
    """A one-master local Redis Cluster (skipped where redis-server is not installed)."""
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed (`make test` installs Debian's redis-server)")
    cluster = LocalRedisCluster(ClusterOptions(masters=1))
    try:
        cluster.start()
    except RedisUnavailableError as exc:
        pytest.fail(f"the local redis cluster did not start: {exc}")
    yield cluster.endpoint
    cluster.stop()
