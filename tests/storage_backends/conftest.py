"""Fixtures shared by the storage backend tests.

Helpers are handed out through fixtures rather than imported, so these tests
do not depend on how pytest puts test directories on ``sys.path``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage_backends import StorageBackend, StorageConfig, create
from storage_backends.mooncake.local import (
    LocalMooncake,
    MooncakeUnavailableError,
    mooncake_binaries,
)
from storage_backends.redis.cluster import (
    ClusterOptions,
    LocalRedisCluster,
    RedisUnavailableError,
    redis_server_binary,
)

BACKEND_NAMES = ("memory", "lmdb", "file", "disk")

MakeBackend = Callable[[StorageConfig], StorageBackend]
# (backend name, max_bytes) -> a config of a store private to the calling test.
StoreConfig = Callable[[str, int], StorageConfig]


class Pages:
    """Deterministic page keys, payloads and buffers."""

    @staticmethod
    def key(i: int) -> bytes:
        return hashlib.sha256(f"page-{i}".encode()).digest()

    @staticmethod
    def payload(i: int, size: int) -> bytes:
        seed = hashlib.sha256(f"payload-{i}".encode()).digest()
        return (seed * (size // len(seed) + 1))[:size]

    def keys(self, ids: range | list[int]) -> list[bytes]:
        return [self.key(i) for i in ids]

    def payloads(self, ids: range | list[int], size: int) -> list[memoryview]:
        return [memoryview(self.payload(i, size)) for i in ids]

    @staticmethod
    def buffers(count: int, size: int, fill: int = 0xAB) -> list[memoryview]:
        return [memoryview(bytearray([fill]) * size) for _ in range(count)]

    @staticmethod
    def config(name: str, root: Path, max_bytes: int = 64 << 20) -> StorageConfig:
        return StorageConfig(backend=name, path=str(root / f"{name}-store"), max_bytes=max_bytes)


@pytest.fixture
def pages() -> Pages:
    return Pages()


@pytest.fixture(params=BACKEND_NAMES)
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_backend() -> Iterator[MakeBackend]:
    """Create backends from configs; closes them all at teardown."""
    opened: list[StorageBackend] = []

    def make(config: StorageConfig) -> StorageBackend:
        backend = create(config.backend, config)
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        backend.close()


def start_redis_cluster(options: ClusterOptions) -> LocalRedisCluster:
    """A running local cluster, or a skip when redis-server is not installed."""
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed (`make test` installs Debian's redis-server)")
    cluster = LocalRedisCluster(options)
    try:
        cluster.start()
    except RedisUnavailableError as exc:
        pytest.fail(f"the local redis cluster did not start: {exc}")
    return cluster


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """Three redis-server masters on 127.0.0.1, shared by the whole session."""
    cluster = start_redis_cluster(ClusterOptions(masters=3))
    yield cluster
    cluster.stop()


StartCluster = Callable[[ClusterOptions], LocalRedisCluster]


def start_mooncake() -> LocalMooncake:
    """A running master + holder, or a skip when mooncake does not import here."""
    try:
        mooncake_binaries()
    except MooncakeUnavailableError as exc:
        pytest.skip(f"optional mooncake backend: {exc} (pip install '.[mooncake]', libibverbs1)")
    store = LocalMooncake()
    try:
        store.start()
    except MooncakeUnavailableError as exc:
        pytest.fail(f"the local mooncake store did not start: {exc}")
    return store


@pytest.fixture(scope="session")
def mooncake() -> Iterator[LocalMooncake]:
    """A mooncake_master and a mooncake_client holder, shared by the whole session."""
    store = start_mooncake()
    yield store
    store.stop()


@pytest.fixture
def own_mooncake() -> Iterator[Callable[[], LocalMooncake]]:
    """Starts master + holder pairs private to one test (to kill the holder); stops them after."""
    started: list[LocalMooncake] = []

    def start() -> LocalMooncake:
        started.append(start_mooncake())
        return started[-1]

    yield start
    for store in started:
        store.stop()


@pytest.fixture
def own_redis_cluster() -> Iterator[StartCluster]:
    """Starts clusters private to one test (to kill nodes, limit memory); stops them after."""
    started: list[LocalRedisCluster] = []

    def start(options: ClusterOptions) -> LocalRedisCluster:
        started.append(start_redis_cluster(options))
        return started[-1]

    yield start
    for cluster in started:
        cluster.stop()


@pytest.fixture
def store_config(tmp_path: Path, request: pytest.FixtureRequest) -> StoreConfig:
    """Configs whose stores belong to this test: a temp path, or a fresh redis key prefix."""

    def make(name: str, max_bytes: int = 64 << 20) -> StorageConfig:
        if name != "redis":
            return Pages.config(name, tmp_path, max_bytes)
        cluster: LocalRedisCluster = request.getfixturevalue("redis_cluster")
        fingerprint = hashlib.sha256(request.node.nodeid.encode()).hexdigest()
        return StorageConfig(
            backend="redis", endpoint=cluster.endpoint, max_bytes=max_bytes, fingerprint=fingerprint
        )

    return make


@pytest.fixture
def backend(
    backend_name: str, store_config: StoreConfig, make_backend: MakeBackend
) -> StorageBackend:
    return make_backend(store_config(backend_name, 64 << 20))
