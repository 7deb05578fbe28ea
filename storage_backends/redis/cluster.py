"""LocalRedisCluster: real ``redis-server`` processes on 127.0.0.1 formed into a Redis Cluster.

Used by the tests and by ``hicache bench storage --backend redis``; not by the
backend itself (operators run their own cluster). Each node gets two free
ports picked by the OS (client port and cluster bus port); a node that loses a
race for its ports exits at once and is restarted on new ones. Slots are
split evenly over the masters with ``CLUSTER ADDSLOTSRANGE``, so one node is a
one-node cluster. Readiness is a reply: ``PING`` from every node, then
``CLUSTER INFO`` reporting ``cluster_state:ok`` with every node known.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import redis

from storage_backends.local_process import free_ports, terminate

logger = logging.getLogger(__name__)

SLOTS = 16384
_PORT_ATTEMPTS = 5
_POLL_S = 0.02  # pause between two readiness probes (each probe waits for a reply)


class RedisUnavailableError(RuntimeError):
    """redis-server is not installed, or the cluster did not come up in time."""


@dataclass(frozen=True)
class ClusterOptions:
    """How to run the local cluster; ``maxmemory_bytes = 0`` means no memory limit."""

    masters: int = 3
    maxmemory_bytes: int = 0
    maxmemory_policy: str = "allkeys-lru"
    node_timeout_ms: int = 2000
    start_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not 1 <= self.masters <= 64:
            raise ValueError(f"masters must be in 1..64, got {self.masters}")
        if self.maxmemory_bytes < 0:
            raise ValueError(f"maxmemory_bytes must be >= 0, got {self.maxmemory_bytes}")
        if self.start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be > 0, got {self.start_timeout_s}")


class RedisNode(NamedTuple):
    port: int
    bus_port: int
    process: subprocess.Popen[bytes]


def redis_server_binary() -> str | None:
    """Path of ``redis-server``, or None when it is not installed."""
    return shutil.which("redis-server")


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2.0, socket_connect_timeout=2.0)


class LocalRedisCluster:
    """A cluster of ``options.masters`` redis-server processes; use as a context manager.

    Not thread-safe. ``stop()`` terminates every node by PID and removes the
    working directory if this object created it.
    """

    def __init__(self, options: ClusterOptions, workdir: Path | None = None) -> None:
        self.options = options
        self._own_dir = workdir is None
        self._dir = Path(tempfile.mkdtemp(prefix="hicache-redis-")) if workdir is None else workdir
        self.nodes: list[RedisNode] = []

    def __enter__(self) -> LocalRedisCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """``redis://host:port,host:port,…``: every node, as ``storage.endpoint``."""
        return "redis://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def start(self) -> None:
        """Start the nodes, assign slots, join them and wait for ``cluster_state:ok``.

        Raises RedisUnavailableError (nodes already started are stopped first).
        """
        binary = redis_server_binary()
        if binary is None:
            raise RedisUnavailableError("redis-server is not installed")
        deadline = time.monotonic() + self.options.start_timeout_s
        try:
            for index in range(self.options.masters):
                self.nodes.append(self._start_node(binary, index, deadline))
            self._form_cluster()
            self._wait_cluster_ok(deadline)
        except BaseException:
            self.stop()
            raise

    def _start_node(self, binary: str, index: int, deadline: float) -> RedisNode:
        node_dir = self._dir / f"node-{index}"
        node_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(_PORT_ATTEMPTS):
            port, bus_port = free_ports(2)
            process = _spawn(binary, self._server_args(node_dir, port, bus_port))
            node = RedisNode(port, bus_port, process)
            if self._wait_ping(node, deadline):
                return node
            logger.info("redis-server on port %d did not start (port taken?); retrying", port)
            terminate(process)
        raise RedisUnavailableError(
            f"redis-server failed to start {_PORT_ATTEMPTS} times; see {node_dir}/redis.log"
        )

    def _server_args(self, node_dir: Path, port: int, bus_port: int) -> list[str]:
        opts = self.options
        return [
            *("--port", str(port), "--cluster-port", str(bus_port), "--bind", "127.0.0.1"),
            *("--cluster-enabled", "yes", "--cluster-config-file", str(node_dir / "nodes.conf")),
            *("--cluster-node-timeout", str(opts.node_timeout_ms)),
            *("--cluster-require-full-coverage", "no"),
            *("--maxmemory", str(opts.maxmemory_bytes)),
            *("--maxmemory-policy", opts.maxmemory_policy),
            *("--dir", str(node_dir), "--logfile", str(node_dir / "redis.log")),
            *("--save", "", "--appendonly", "no", "--daemonize", "no"),
        ]

    @staticmethod
    def _wait_ping(node: RedisNode, deadline: float) -> bool:
        """True once the node answers PING; False if the process exits first."""
        client = _client(node.port)
        try:
            while time.monotonic() < deadline:
                if node.process.poll() is not None:
                    return False
                try:
                    return bool(client.ping())
                except redis.ConnectionError:
                    time.sleep(_POLL_S)
            raise RedisUnavailableError(f"redis-server on port {node.port} did not answer PING")
        finally:
            client.close()

    def _form_cluster(self) -> None:
        count = len(self.nodes)
        first = self.nodes[0]
        for index, node in enumerate(self.nodes):
            client = _client(node.port)
            try:
                lo, hi = index * SLOTS // count, (index + 1) * SLOTS // count - 1
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", index + 1)
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
                if node is not first:
                    client.execute_command(
                        "CLUSTER", "MEET", "127.0.0.1", first.port, first.bus_port
                    )
            finally:
                client.close()

    def _wait_cluster_ok(self, deadline: float) -> None:
        clients = [_client(node.port) for node in self.nodes]
        try:
            while time.monotonic() < deadline:
                if all(self._node_ready(client) for client in clients):
                    return
                time.sleep(_POLL_S)
        finally:
            for client in clients:
                client.close()
        raise RedisUnavailableError("the redis cluster did not reach cluster_state:ok in time")

    def _node_ready(self, client: redis.Redis) -> bool:
        info = client.execute_command("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
        return (
            fields.get("cluster_state") == "ok"
            and fields.get("cluster_slots_ok") == str(SLOTS)
            and fields.get("cluster_known_nodes") == str(len(self.nodes))
        )

    def client(self, index: int) -> redis.Redis:
        """A plain client of node ``index`` (the caller closes it)."""
        return _client(self.nodes[index].port)

    def kill(self, index: int) -> None:
        """SIGKILL node ``index`` and reap it (its keys become unreachable)."""
        process = self.nodes[index].process
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def restart(self, index: int) -> None:
        """Start killed node ``index`` again on its ports (it rejoins with its slots, empty).

        Raises RedisUnavailableError if it does not come back or the cluster is not ok in time.
        """
        old = self.nodes[index]
        binary = redis_server_binary()
        if binary is None:
            raise RedisUnavailableError("redis-server is not installed")
        args = self._server_args(self._dir / f"node-{index}", old.port, old.bus_port)
        process = _spawn(binary, args)
        self.nodes[index] = RedisNode(old.port, old.bus_port, process)
        deadline = time.monotonic() + self.options.start_timeout_s
        if not self._wait_ping(self.nodes[index], deadline):
            raise RedisUnavailableError(f"redis-server did not restart on port {old.port}")
        self._wait_cluster_ok(deadline)

    def stop(self) -> None:
        """Terminate every node by PID; idempotent."""
        for node in self.nodes:
            terminate(node.process)
        self.nodes = []
        if self._own_dir:
            shutil.rmtree(self._dir, ignore_errors=True)


def _spawn(binary: str, args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [binary, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
