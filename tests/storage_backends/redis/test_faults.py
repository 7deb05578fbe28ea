"""The redis backend under failures: dead masters, a dead cluster, full memory, bad endpoints.

Each failure is a miss or a failed put, counted, never an exception; the
backend reconnects by itself once a node is back. These tests run clusters of
their own (they kill nodes or limit memory), apart from the session cluster.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import pytest
from redis.cluster import RedisCluster
from redis.crc import key_slot

from storage_backends import StorageConfig, StorageOpenError, create
from storage_backends.redis.backend import key_prefix
from storage_backends.redis.cluster import ClusterOptions, LocalRedisCluster
from tests.polling import wait_until

if TYPE_CHECKING:
    from conftest import MakeBackend, Pages, StartCluster

SIZE = 4096
FINGERPRINT = "f00d"
RECONNECT_S = 30.0  # bound on waiting for the backend to reconnect or reload the slot map


def _config(cluster: LocalRedisCluster) -> StorageConfig:
    return StorageConfig(
        backend="redis", endpoint=cluster.endpoint, fingerprint=FINGERPRINT, timeout_s=2.0
    )


def _owners(cluster: LocalRedisCluster, keys: list[bytes]) -> list[int]:
    """Index (in ``cluster.nodes``) of the master owning each page key."""
    ports = [node.port for node in cluster.nodes]
    prefix = key_prefix(_config(cluster))
    client = RedisCluster.from_url(f"redis://127.0.0.1:{ports[0]}")
    try:
        return [ports.index(client.get_node_from_key(prefix + key).port) for key in keys]
    finally:
        client.close()


def test_killed_master_turns_its_keys_into_misses(
    own_redis_cluster: StartCluster, pages: Pages, make_backend: MakeBackend
) -> None:
    cluster = own_redis_cluster(ClusterOptions(masters=3, node_timeout_ms=1000))
    store = make_backend(_config(cluster))
    keys, new_keys = pages.keys(range(48)), pages.keys(range(100, 148))
    assert store.put(keys, pages.payloads(range(48), SIZE)) == [True] * 48
    lost = [owner == 1 for owner in _owners(cluster, keys)]
    lost_new = [owner == 1 for owner in _owners(cluster, new_keys)]
    assert 0 < sum(lost) < 48 and any(lost_new)
    cluster.kill(1)

    dst = pages.buffers(48, SIZE)
    assert store.get(keys, dst) == [not gone for gone in lost]
    for i, gone in enumerate(lost):
        assert bytes(dst[i]) == (b"\xab" * SIZE if gone else pages.payload(i, SIZE))
    assert store.exists(keys) == lost.index(True)
    assert store.put(new_keys, pages.payloads(range(100, 148), SIZE)) == [
        not gone for gone in lost_new
    ]
    stats = store.stats()
    assert (stats.misses, stats.put_failures) == (sum(lost), sum(lost_new))
    assert stats.entries == 96 - sum(lost) - sum(lost_new)

    cluster.restart(1)  # back, empty: the backend reconnects by itself
    victim = keys[lost.index(True)]
    payload = pages.payloads([lost.index(True)], SIZE)
    assert wait_until(lambda: store.put([victim], payload) == [True], RECONNECT_S, 0.1)
    assert store.get([victim], dst[:1]) == [True]
    assert bytes(dst[0]) == pages.payload(lost.index(True), SIZE)


def test_dead_cluster_is_all_misses(
    own_redis_cluster: StartCluster, pages: Pages, make_backend: MakeBackend
) -> None:
    cluster = own_redis_cluster(ClusterOptions(masters=1))  # a one-node cluster
    store = make_backend(_config(cluster))
    keys = pages.keys(range(8))
    assert store.put(keys, pages.payloads(range(8), SIZE)) == [True] * 8
    cluster.kill(0)
    dst = pages.buffers(8, SIZE)
    assert store.get(keys, dst) == [False] * 8
    assert all(bytes(d) == b"\xab" * SIZE for d in dst)
    assert store.exists(keys) == 0
    assert store.put(pages.keys(range(8, 10)), pages.payloads(range(8, 10), SIZE)) == [False] * 2
    assert store.delete(keys) == 0
    stats = store.stats()
    assert (stats.entries, stats.misses, stats.put_failures) == (0, 8, 2)


def test_full_memory_with_noeviction_fails_puts_cleanly(
    own_redis_cluster: StartCluster, pages: Pages, make_backend: MakeBackend
) -> None:
    cluster = own_redis_cluster(ClusterOptions(masters=1, maxmemory_policy="noeviction"))
    client = cluster.client(0)
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + (1 << 20))
    client.close()
    store = make_backend(_config(cluster))
    size, ids = 64 << 10, range(64)  # 4 MiB of pages into ~1 MiB of room
    results: list[bool] = []
    for i in ids:
        results += store.put(pages.keys([i]), pages.payloads([i], size))
    assert results.count(True) > 0 and results.count(False) > 0
    assert store.stats().put_failures == results.count(False)
    dst = pages.buffers(len(ids), size)
    assert store.get(pages.keys(ids), dst) == results  # what was acknowledged is intact
    assert all(bytes(dst[i]) == pages.payload(i, size) for i in ids if results[i])
    stored = [i for i in ids if results[i]]
    assert store.delete(pages.keys(stored)) == len(stored)
    refused = results.index(False)
    assert store.put(pages.keys([refused]), pages.payloads([refused], size)) == [True]


def test_unreachable_endpoint_fails_to_open() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = StorageConfig(backend="redis", endpoint=f"redis://127.0.0.1:{port}", timeout_s=1.0)
    with pytest.raises(StorageOpenError, match="cannot reach a Redis Cluster"):
        create("redis", config)


@pytest.mark.parametrize("endpoint", ["", "127.0.0.1:7000", "http://127.0.0.1:7000"])
def test_endpoint_must_be_a_redis_url(endpoint: str) -> None:
    with pytest.raises(ValueError, match=r"storage\.endpoint"):
        StorageConfig(backend="redis", endpoint=endpoint)


@pytest.mark.parametrize("prefix", ["", "{tag}", "a}b"])
def test_key_prefix_without_hash_tags(prefix: str) -> None:
    with pytest.raises(ValueError, match="key_prefix"):
        StorageConfig(backend="redis", endpoint="redis://h:1", key_prefix=prefix)


@pytest.mark.parametrize("endpoint", ["redis://127.0.0.1", "redis://:7000", "redis://h:99999"])
def test_endpoint_needs_host_and_port(endpoint: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        create("redis", StorageConfig(backend="redis", endpoint=endpoint))


def test_resharded_slot_is_followed(
    own_redis_cluster: StartCluster, pages: Pages, make_backend: MakeBackend
) -> None:
    """A slot moved to another master (as ``redis-cli --cluster reshard`` does): after a
    MOVED reply or two the backend reloads the slot map and finds the page again."""
    cluster = own_redis_cluster(ClusterOptions(masters=2))
    store = make_backend(_config(cluster))
    key = pages.key(0)
    assert store.put([key], pages.payloads([0], SIZE)) == [True]
    source = _owners(cluster, [key])[0]
    target = 1 - source
    _move_slot(cluster, key_slot(key_prefix(_config(cluster)) + key), source, target)
    assert _owners(cluster, [key]) == [target]
    dst = pages.buffers(1, SIZE)
    # Misses until the slot map is reloaded (at most once a second).
    assert wait_until(lambda: store.get([key], dst) == [True], RECONNECT_S, 0.1)
    assert bytes(dst[0]) == pages.payload(0, SIZE)


def _move_slot(cluster: LocalRedisCluster, slot: int, source: int, target: int) -> None:
    clients = [cluster.client(i) for i in range(len(cluster.nodes))]
    try:
        ids = [client.execute_command("CLUSTER", "MYID").decode() for client in clients]
        clients[target].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
        clients[source].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
        names = clients[source].execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
        port = cluster.nodes[target].port
        clients[source].execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *names)
        for client in clients:
            client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
    finally:
        for client in clients:
            client.close()
