"""Daemon configuration (``configs/daemon.toml``): frozen dataclasses validated on construction.

Sections: ``[server]``, ``[store]``, ``[limits]`` (the protocol's ``Limits``),
``[metrics]`` and ``[auth]`` with ``[[auth.tenants]]``. Every check raises
ValueError naming the key.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from hicache.config import loader as config_loader
from hicache.config.loader import Scalar
from storage_backends.config import SYNC_LEVELS, SyncLevel
from storage_backends.remote.protocol import Limits

_TENANT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def _check(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise ValueError(f"{key}: {msg}")


def is_loopback(endpoint: str) -> bool:
    """Whether ``endpoint`` can only be reached from this machine (loopback tcp, ipc)."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    return urlsplit(endpoint).hostname in _LOOPBACK_HOSTS


@dataclass(frozen=True)
class ServerConfig:
    """The socket. Port 0 lets the OS pick; ``ready_file`` receives the bound endpoint (JSON)."""

    endpoint: str = "tcp://127.0.0.1:5557"
    allow_remote: bool = False  # bind beyond loopback without CURVE (logged as a warning)
    max_inflight_requests: int = 1024
    max_inflight_bytes: int = 2 << 30
    ready_file: str = ""
    shutdown_timeout_s: float = 30.0
    # GET replies handed to ZeroMQ but not yet taken by the client: a client over its
    # share (or all clients over the total) gets BUSY instead of more pages.
    max_queued_reply_bytes_per_peer: int = 256 << 20
    max_queued_reply_bytes: int = 1 << 30
    max_peers: int = 4096  # over it: the idlest (silent 2 heartbeats) or the newcomer goes
    readers: int = 4  # threads that answer GET and EXISTS (index lookups and copies drop the GIL)
    heartbeat_s: float = 10.0  # ZMTP heartbeats; a peer silent for 3 intervals is dropped; 0: off
    handshake_timeout_s: float = 10.0  # a connection that has not handshaken by then is dropped
    # Added to the nice value of the writer and reader threads (Linux): on busy cores the
    # kernel then runs the socket thread first. 0 (off) by default: no gain was measured
    # above the noise, and it would also rank them below every other process's threads.
    background_nice: int = 0
    # ZeroMQ I/O threads (each connection is served by one): while one copies a client's
    # bulk frames, another's small frames go through another. Released from the GIL.
    io_threads: int = 2
    # The shared-memory data plane for same-host clients (ipc only): the slab's size; 0: off.
    shm_bytes: int = 0

    def __post_init__(self) -> None:
        parts = urlsplit(self.endpoint)
        ok = parts.scheme == "ipc" or (parts.scheme == "tcp" and parts.hostname is not None)
        _check(ok, "server.endpoint", f"must be tcp://HOST:PORT or ipc://PATH: {self.endpoint!r}")
        if parts.scheme == "tcp":
            try:
                port = parts.port
            except ValueError:
                port = None
            _check(port is not None, "server.endpoint", f"needs a port 0..65535: {self.endpoint}")
        _check(self.max_inflight_requests >= 1, "server.max_inflight_requests", "must be >= 1")
        _check(self.max_inflight_bytes >= 1, "server.max_inflight_bytes", "must be >= 1")
        _check(self.shutdown_timeout_s > 0, "server.shutdown_timeout_s", "must be > 0")
        for name in (
            "max_queued_reply_bytes_per_peer",
            "max_queued_reply_bytes",
            "max_peers",
            "readers",
            "io_threads",
        ):
            _check(getattr(self, name) >= 1, f"server.{name}", "must be >= 1")
        _check(self.heartbeat_s >= 0, "server.heartbeat_s", "must be >= 0")
        _check(self.handshake_timeout_s > 0, "server.handshake_timeout_s", "must be > 0")
        _check(0 <= self.background_nice <= 19, "server.background_nice", "must be 0..19")
        self._check_shm(parts.scheme)

    def _check_shm(self, scheme: str) -> None:
        _check(self.shm_bytes >= 0, "server.shm_bytes", "must be >= 0 (0: off)")
        if self.shm_bytes == 0:
            return
        _check(self.shm_bytes >= 1 << 20, "server.shm_bytes", "must be 0 (off) or >= 1 MiB")
        _check(
            scheme == "ipc",
            "server.shm_bytes",
            f"shared memory is for same-host clients: an ipc:// endpoint, not {self.endpoint}",
        )
        _check(
            self.heartbeat_s > 0,
            "server.shm_bytes",
            "needs server.heartbeat_s > 0 (a lease is reclaimed after 3 silent intervals)",
        )


# The stores the daemon runs on, and the one it runs on when its config names none.
STORE_BACKENDS = ("lmdb", "disk")
DEFAULT_STORE_BACKEND = "disk"


@dataclass(frozen=True)
class StoreConfig:
    """The page store (``backend``, ``path``, ``max_bytes``, ``sync``) and the memory LRU in
    front of it. An empty ``path`` is ``daemon-store`` in the per-user cache directory.

    ``sync`` is the storage vocabulary (``storage.sync``): ``none`` (the default),
    ``index`` or ``full``; ``true``/``false`` (older configs) mean ``full``/``none``. At
    every level a PUT is acknowledged after its page bytes are written (into the page
    cache) and its index entry committed, so it survives ``kill -9`` of the daemon;
    ``index`` and ``full`` add fsyncs so that it also survives an OS crash."""

    backend: str = DEFAULT_STORE_BACKEND
    path: str = ""
    max_bytes: int = 8 << 30
    memory_bytes: int = 1 << 30
    sync: str | bool = SyncLevel.NONE.value

    def __post_init__(self) -> None:
        _check(
            self.backend in STORE_BACKENDS,
            "store.backend",
            f"must be one of {STORE_BACKENDS}, got {self.backend!r}",
        )
        _check(self.max_bytes >= 1, "store.max_bytes", "must be >= 1")
        _check(self.memory_bytes >= 0, "store.memory_bytes", "must be >= 0")
        _check(
            isinstance(self.sync, bool) or self.sync in SYNC_LEVELS,
            "store.sync",
            f"must be one of {SYNC_LEVELS} (or true/false), got {self.sync!r}",
        )


@dataclass(frozen=True)
class MetricsConfig:
    """The Prometheus endpoint: port -1 disables it, 0 lets the OS pick."""

    host: str = "127.0.0.1"
    port: int = -1

    def __post_init__(self) -> None:
        _check(-1 <= self.port <= 65535, "metrics.port", f"must be -1..65535, got {self.port}")


@dataclass(frozen=True)
class TenantConfig:
    """One allowed client: ``public_key`` is a z85 key (40 chars) or a key file from keygen.

    ``max_store_bytes`` > 0 gives the tenant a store of its own with that capacity (its
    pages evict only its own); 0 keeps it in the shared store. ``admin`` lets its STATS
    show the whole daemon; other tenants see their own figures only."""

    name: str
    public_key: str
    max_store_bytes: int = 0
    admin: bool = False

    def __post_init__(self) -> None:
        _check(
            bool(_TENANT_NAME.fullmatch(self.name)),
            "auth.tenants.name",
            f"must match {_TENANT_NAME.pattern}, got {self.name!r}",
        )
        _check(bool(self.public_key), "auth.tenants.public_key", "must not be empty")
        _check(self.max_store_bytes >= 0, "auth.tenants.max_store_bytes", "must be >= 0")


@dataclass(frozen=True)
class AuthConfig:
    """CURVE authentication; each client key maps to a tenant whose pages only it sees."""

    curve: bool = False
    server_secret_key: str = ""  # key file written by ``hicache keygen``
    tenants: tuple[TenantConfig, ...] = ()

    def __post_init__(self) -> None:
        if not self.curve:
            return
        _check(bool(self.server_secret_key), "auth.server_secret_key", "required with curve")
        _check(bool(self.tenants), "auth.tenants", "at least one tenant is required with curve")
        names = [t.name for t in self.tenants]
        keys = [t.public_key for t in self.tenants]
        _check(len(set(names)) == len(names), "auth.tenants", "tenant names must be unique")
        _check(len(set(keys)) == len(keys), "auth.tenants", "public keys must be unique")


@dataclass(frozen=True)
class DaemonConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    limits: Limits = field(default_factory=Limits)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)

    def __post_init__(self) -> None:
        remote_ok = self.auth.curve or self.server.allow_remote
        _check(
            remote_ok or is_loopback(self.server.endpoint),
            "server.endpoint",
            f"{self.server.endpoint} is not loopback: enable auth.curve or server.allow_remote",
        )
        _check(
            not (self.auth.curve and self.server.shm_bytes),
            "server.shm_bytes",
            "every client maps the whole slab, so tenants could read each other's pages: "
            "not with auth.curve",
        )

    @classmethod
    def from_toml(
        cls, path: str | Path, overrides: Mapping[str, Scalar] | None = None
    ) -> DaemonConfig:
        """Load ``path`` and apply ``overrides`` (``"section.key" -> value``, as ``--set``):
        ConfigError (a ValueError) naming the file or ``--set`` and the key for bad
        content, OSError if unreadable."""
        return cls.from_mapping(config_loader.read_toml(path), overrides, source=str(path))

    @classmethod
    def from_mapping(
        cls,
        data: Mapping[str, object],
        overrides: Mapping[str, Scalar] | None = None,
        source: str = "<config>",
    ) -> DaemonConfig:
        return config_loader.load(cls, data, source, overrides)

    def with_overrides(self, **sections: Mapping[str, object]) -> DaemonConfig:
        """A copy with fields replaced, e.g. ``with_overrides(store={"path": p})`` (validated)."""
        changes = {
            name: dataclasses.replace(getattr(self, name), **values)
            for name, values in sections.items()
            if values
        }
        return dataclasses.replace(self, **changes)
