"""RedisBackend: pages in a Redis Cluster, one string key per page (the ``redis`` backend).

``storage.endpoint`` lists startup nodes (``redis://host:port[,host:port…]``);
a single server runs as a one-node cluster, so there is one code path. A page
is stored under ``<key_prefix>:<fingerprint>:<32-byte page key>`` as the usual
header + payload (``storage_backends.page_format``) and checked on every read;
there is no other key. Page keys already chain the namespace; the fingerprint
prefix keeps models apart, so pages of another model are never seen (and
``allow_fingerprint_mismatch`` has nothing to allow).

Capacity and eviction belong to Redis (``maxmemory`` with
``maxmemory-policy allkeys-lru``): ``put`` never evicts, Redis' own evictions
are not reported by ``take_removed`` nor counted, and ``capacity_bytes`` is
``storage.max_bytes`` as configured. Failures of nodes or of the whole
cluster (refused, timed out, MOVED during resharding, out of memory) are
misses or failed puts, never exceptions; see ``storage_backends.redis.nodes``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple

from redis.backoff import NoBackoff
from redis.client import Pipeline, Redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException, RedisError
from redis.retry import Retry

from storage_backends.base import StorageStats
from storage_backends.batch import check_batch, check_keys, count_leading
from storage_backends.config import StorageConfig
from storage_backends.counters import StatCounters
from storage_backends.errors import StorageClosedError, StorageOpenError
from storage_backends.page_format import HEADER_BYTES, Verdict, copy_verified, encode_page
from storage_backends.redis.nodes import ClusterIO

logger = logging.getLogger(__name__)

_SCAN_COUNT = 1000
_GLOB_SPECIAL = frozenset(b"*?[]\\")


def parse_endpoint(endpoint: str) -> list[ClusterNode]:
    """Startup nodes of ``redis://host:port[,host:port…]``; ValueError if malformed."""
    if not endpoint.startswith("redis://"):
        raise ValueError(f"storage.endpoint must start with redis://, got {endpoint!r}")
    nodes = []
    for part in endpoint.removeprefix("redis://").split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"storage.endpoint: {part!r} is not host:port")
        nodes.append(ClusterNode(host, int(port)))
    return nodes


def key_prefix(config: StorageConfig) -> bytes:
    """The prefix of every Redis key of the store ``config`` names (prefix and fingerprint)."""
    return f"{config.key_prefix}:{config.fingerprint}:".encode()


def _glob_escape(raw: bytes) -> bytes:
    return b"".join(b"\\" + bytes([c]) if c in _GLOB_SPECIAL else bytes([c]) for c in raw)


def _connect(config: StorageConfig) -> RedisCluster:
    startup = parse_endpoint(config.endpoint)
    try:
        return RedisCluster(
            startup_nodes=startup,
            require_full_coverage=False,
            retry=Retry(NoBackoff(), 0),  # a failed node is a miss now, not a retry
            socket_timeout=config.timeout_s,
            socket_connect_timeout=config.timeout_s,
        )
    except (RedisError, RedisClusterException, OSError) as exc:
        raise StorageOpenError(
            f"storage.endpoint {config.endpoint}: cannot reach a Redis Cluster "
            f"(a single server needs cluster-enabled yes and all slots): {exc}"
        ) from exc


class RedisBackend:
    """Pages in a Redis Cluster; see the module docstring.

    Thread-safe: several I/O workers may call it at once (each batch builds its
    own pipelines; connections come from per-node pools).
    """

    def __init__(self, config: StorageConfig) -> None:
        self._config = config
        self._prefix = key_prefix(config)
        self._io = ClusterIO(_connect(config), config.timeout_s)
        self._counters = StatCounters()
        self._lock = threading.Lock()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError("RedisBackend is closed")

    def _names(self, keys: Sequence[bytes]) -> list[bytes]:
        return [self._prefix + key for key in keys]

    def exists(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        if not keys:
            return 0
        names = self._names(keys)
        replies = self._io.run(names, lambda pipe, i: pipe.exists(names[i]))
        return count_leading(reply == 1 for reply in replies)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        self._check_open()
        check_keys(keys)
        if not keys:
            return []
        names = self._names(keys)
        replies = self._io.run(names, lambda pipe, i: pipe.exists(names[i]))
        return [reply == 1 for reply in replies]

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        self._check_open()
        views = check_batch(keys, dst, writable=True)
        names = self._names(keys)
        replies = self._io.run(names, lambda pipe, i: pipe.get(names[i]))
        hits = [False] * len(keys)
        damaged: list[int] = []
        for i, (key, view, reply) in enumerate(zip(keys, views, replies, strict=True)):
            if not isinstance(reply, bytes):
                continue  # absent, or its node failed: a miss either way
            verdict = copy_verified(memoryview(reply), key, view)
            hits[i] = verdict is Verdict.OK
            if verdict.corrupt:
                damaged.append(i)
        corrupt = self._drop_damaged([keys[i] for i in damaged]) if damaged else 0
        n_hits = sum(hits)
        self._counters.record_get(n_hits, len(keys) - n_hits, corrupt)
        return hits

    def _drop_damaged(self, keys: list[bytes]) -> int:
        """Delete pages found damaged; return how many were deleted.

        Unconditional: a page is never rewritten in place (SET NX), so the only
        race is with a delete-and-put of the same key, which costs one miss.
        """
        removed = self._delete_present(keys)
        logger.warning("deleted %d damaged pages from redis", len(removed))
        return len(removed)

    def _delete_present(self, keys: Sequence[bytes]) -> list[bytes]:
        names = self._names(keys)
        replies = self._io.run(names, lambda pipe, i: pipe.delete(names[i]))
        removed = [key for key, reply in zip(keys, replies, strict=True) if reply == 1]
        self._counters.note_removed(removed)
        return removed

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self._check_open()
        views = check_batch(keys, src, writable=False)
        limit = min(self._config.max_page_bytes, self._config.max_bytes - HEADER_BYTES)
        todo = [i for i, view in enumerate(views) if len(view) <= limit]
        names = self._names([keys[i] for i in todo])
        blobs = [encode_page(keys[i], views[i]) for i in todo]

        def queue(pipe: Pipeline, j: int) -> None:
            pipe.set(names[j], blobs[j], nx=True)

        replies = self._io.run(names, queue)
        results = [False] * len(keys)
        stored = 0
        for i, reply in zip(todo, replies, strict=True):
            # True: stored now; None: already present (NX), which is a success too.
            results[i] = reply is True or reply is None
            stored += reply is True
        failures = len(keys) - sum(results)
        if not all(results[i] for i in todo):
            logger.warning("redis put: %d pages not stored (%r)", failures, _first_error(replies))
        self._counters.record_put(stored, failures, 0)
        return results

    def delete(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        removed = len(self._delete_present(keys)) if keys else 0
        self._counters.record_deletes(removed)
        return removed

    def take_removed(self) -> list[bytes]:
        return self._counters.take_removed()

    def stats(self) -> StorageStats:
        """Counters plus this store's pages, counted by SCAN over every primary.

        The scan walks the whole keyspace (O(keys in the cluster)) and stops at
        ``timeout_s``; unreachable nodes and an interrupted scan undercount.
        """
        self._check_open()
        entries = bytes_used = 0
        deadline = time.monotonic() + self._config.timeout_s
        pattern = _glob_escape(self._prefix) + b"*"
        for node in self._io.primaries():
            try:
                usage = _count_node(self._io.node_redis(node), pattern, deadline)
            except (RedisError, OSError) as exc:
                logger.warning("redis stats: node %s not counted: %r", node.name, exc)
                continue
            entries += usage.entries
            bytes_used += usage.bytes_used
        return self._counters.snapshot(entries, bytes_used, self._config.max_bytes)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._io.close()


class _Usage(NamedTuple):
    entries: int
    bytes_used: int


def _count_node(node: Redis, pattern: bytes, deadline: float) -> _Usage:
    """Keys matching ``pattern`` on one node and their value bytes, until ``deadline``."""
    entries = used = 0
    cursor = 0
    while time.monotonic() < deadline:
        cursor, names = node.scan(cursor=cursor, match=pattern, count=_SCAN_COUNT)
        if names:
            pipe = node.pipeline(transaction=False)
            for name in names:
                pipe.strlen(name)
            sizes = [size for size in pipe.execute(raise_on_error=False) if isinstance(size, int)]
            entries += sum(size > 0 for size in sizes)
            used += sum(sizes)
        if cursor == 0:
            break
    return _Usage(entries, used)


def _first_error(replies: Sequence[object]) -> object:
    return next((r for r in replies if r is not True and r is not None), None)


def delete_prefix(config: StorageConfig) -> int:
    """Delete every key under ``<config.key_prefix>:`` (all fingerprints) on
    every primary and return how many went; for a prefix one run owns (a
    bench's scratch store), never a fleet's. Raises StorageOpenError when the
    cluster cannot be reached and RedisError when a node fails mid-way."""
    io = ClusterIO(_connect(config), config.timeout_s)
    pattern = _glob_escape(f"{config.key_prefix}:".encode()) + b"*"
    deleted = 0
    try:
        for node in io.primaries():
            deleted += _delete_node(io.node_redis(node), pattern)
    finally:
        io.close()
    return deleted


def _delete_node(node: Redis, pattern: bytes) -> int:
    """UNLINK the keys matching ``pattern`` on one node, one per command (keys
    of different slots cannot share a command in a cluster)."""
    deleted, cursor = 0, 0
    while True:
        cursor, names = node.scan(cursor=cursor, match=pattern, count=_SCAN_COUNT)
        if names:
            pipe = node.pipeline(transaction=False)
            for name in names:
                pipe.unlink(name)
            deleted += sum(int(n) for n in pipe.execute())
        if cursor == 0:
            return deleted
