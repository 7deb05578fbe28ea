"""ClusterIO: one batch of per-key commands fanned out to Redis Cluster nodes, never raising.

Keys are grouped by the node that owns their slot (from the client's slot
map); each node gets one non-transactional pipeline, all nodes in parallel on
a small thread pool, and the whole batch waits at most ``timeout_s``. A node
that refuses, times out or answers with a cluster error (MOVED, ASK,
CLUSTERDOWN, TRYAGAIN) makes its keys ``Unavailable``; it is then skipped for a
short back-off, and the slot map is refreshed (at most once per interval) so
that failovers and resharding are picked up without a restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import NamedTuple

from redis.client import Pipeline, Redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisClusterException,
    RedisError,
    TryAgainError,
)

logger = logging.getLogger(__name__)

_NODE_BACKOFF_S = 1.0
_REFRESH_INTERVAL_S = 1.0
_TOPOLOGY_ERRORS = (MovedError, AskError, ClusterDownError, TryAgainError)

# Queues the command for item ``i`` of the batch (e.g. ``pipe.get(names[i])``).
QueueCommand = Callable[[Pipeline, int], object]


class Unavailable(NamedTuple):
    """The reply of a key whose node could not be asked or did not answer in time."""

    reason: str


class _Group(NamedTuple):
    node: ClusterNode
    indices: list[int]


class ClusterIO:
    """Runs batches against the cluster; thread-safe (several I/O workers call ``run`` at once)."""

    def __init__(self, client: RedisCluster, timeout_s: float, workers: int = 8) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="redis-io")
        self._lock = threading.Lock()
        self._down_until: dict[str, float] = {}
        self._stale = False
        self._next_refresh = 0.0
        self._refreshing = threading.Lock()

    def run(self, names: Sequence[bytes], queue: QueueCommand) -> list[object]:
        """Reply per name: the command's result, a reply error (an Exception) or Unavailable."""
        self._maybe_refresh()
        replies: list[object] = [Unavailable("slot not covered")] * len(names)
        futures: dict[Future[list[object] | None], _Group] = {}
        for group in self._groups(names):
            if self._is_down(group.node.name):
                for i in group.indices:
                    replies[i] = Unavailable(f"node {group.node.name} is backing off")
                continue
            futures[self._pool.submit(self._run_node, group, queue)] = group
        done, _late = wait(futures, timeout=self._timeout_s)
        for future, group in futures.items():
            results = future.result() if future in done else None
            if results is None:
                if future not in done:
                    self._node_failed(group.node.name, "timed out")
                results = [Unavailable(f"node {group.node.name} failed")] * len(group.indices)
            for i, result in zip(group.indices, results, strict=True):
                replies[i] = result
        return replies

    def _groups(self, names: Sequence[bytes]) -> list[_Group]:
        groups: dict[str, _Group] = {}
        for i, name in enumerate(names):
            try:
                node = self._client.get_node_from_key(name)
            except RedisClusterException:
                self._stale = True
                continue
            groups.setdefault(node.name, _Group(node, [])).indices.append(i)
        return list(groups.values())

    def _run_node(self, group: _Group, queue: QueueCommand) -> list[object] | None:
        """One pipeline on one node; None if the node failed (never raises)."""
        try:
            pipe = self._client.get_redis_connection(group.node).pipeline(transaction=False)
            for i in group.indices:
                queue(pipe, i)
            results: list[object] = pipe.execute(raise_on_error=False)
        except Exception as exc:  # any failure of one node is that node's keys' miss
            self._node_failed(group.node.name, repr(exc))
            return None
        if any(isinstance(result, _TOPOLOGY_ERRORS) for result in results):
            self._stale = True
        self._node_ok(group.node.name)
        return results

    def _is_down(self, name: str) -> bool:
        with self._lock:
            until = self._down_until.get(name)
        return until is not None and time.monotonic() < until

    def _node_failed(self, name: str, why: str) -> None:
        with self._lock:
            first = name not in self._down_until
            self._down_until[name] = time.monotonic() + _NODE_BACKOFF_S
            self._stale = True
        if first:
            logger.warning("redis node %s unavailable (%s); its pages are misses", name, why)

    def _node_ok(self, name: str) -> None:
        with self._lock:
            recovered = self._down_until.pop(name, None) is not None
        if recovered:
            logger.info("redis node %s is back", name)

    def _maybe_refresh(self) -> None:
        """Reload the slot map after node or cluster errors; one thread at a time, rate-limited."""
        if not self._stale or time.monotonic() < self._next_refresh:
            return
        if not self._refreshing.acquire(blocking=False):
            return
        try:
            self._next_refresh = time.monotonic() + _REFRESH_INTERVAL_S
            self._client.nodes_manager.initialize()
            self._stale = False
        except (RedisError, RedisClusterException, OSError) as exc:
            logger.debug("redis slot map refresh failed: %r", exc)
        finally:
            self._refreshing.release()

    def primaries(self) -> list[ClusterNode]:
        """The primaries in the current slot map."""
        return list(self._client.get_primaries())

    def node_redis(self, node: ClusterNode) -> Redis:
        """The client of one node (for whole-node scans)."""
        return self._client.get_redis_connection(node)

    def close(self) -> None:
        """Stop the pool (work in flight finishes on its own) and close every connection."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()
