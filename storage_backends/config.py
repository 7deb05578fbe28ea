"""Configuration of a storage backend (the ``[storage]`` TOML section)."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path

from storage_backends.builtins import BUILTIN_BACKENDS

BACKENDS = ("none", *BUILTIN_BACKENDS)
ENDPOINT_SCHEMES = ("tcp://", "ipc://")


class SyncLevel(enum.Enum):
    """Durability of acknowledged writes (``storage.sync``), one vocabulary for every
    backend that writes files. No level ever serves a wrong byte (every read is
    verified); they differ in what a crash may cost.

    - ``none``: nothing is fsynced. A process crash (``kill -9``) loses no
      acknowledged page; an OS crash may lose recent pages, and an index left
      damaged by it (disk, lmdb) is quarantined at the next open: the cache starts empty.
    - ``index``: each batch's index commit is fsynced, page data is left to the OS
      (as SGLang's HiCacheFile and vLLM's fs tier). An OS crash may lose the pages
      of the last seconds (they read as misses); the index survives. For stores
      whose data is their index (lmdb, file) this is ``full``.
    - ``full``: page data is fsynced, then the index: an OS crash loses no
      acknowledged page.
    """

    NONE = "none"
    INDEX = "index"
    FULL = "full"

    @property
    def fsync_index(self) -> bool:
        return self is not SyncLevel.NONE

    @property
    def fsync_data(self) -> bool:
        return self is SyncLevel.FULL


SYNC_LEVELS = tuple(level.value for level in SyncLevel)


def sync_level(value: str | bool) -> SyncLevel:
    """The level a ``storage.sync`` value names; ``true``/``false`` (older configs) are
    ``full``/``none``. ValueError for another word."""
    if isinstance(value, bool):
        return SyncLevel.FULL if value else SyncLevel.NONE
    try:
        return SyncLevel(value)
    except ValueError:
        raise ValueError(
            f"storage.sync must be one of {SYNC_LEVELS} (or true/false), got {value!r}"
        ) from None


@dataclass(frozen=True)
class StorageConfig:
    """Where and how pages are stored outside the process.

    ``backend = "none"`` disables the storage tier. An empty ``path`` puts an
    lmdb or file store in the per-user cache directory (``store_dir()``). ``fingerprint`` is not set
    by users: the cache fills it with the model fingerprint (hex) so that a
    store refuses pages written for another model unless
    ``allow_fingerprint_mismatch`` is set.
    """

    backend: str = "none"
    path: str = ""
    max_bytes: int = 8 << 30
    map_size: int = 0  # LMDB map size; 0 means max_bytes plus headroom
    timeout_s: float = 5.0
    max_page_bytes: int = 64 << 20
    fingerprint: str = ""
    allow_fingerprint_mismatch: bool = False
    # Durability: a SyncLevel word ("none", "index", "full"); true/false mean full/none.
    sync: str | bool = SyncLevel.INDEX.value
    # Network backends: where the store is: "redis://host:port[,host:port...]" (redis),
    # "mooncake://master-host:port[?metadata=...]" (mooncake), "tcp://host:port" or
    # "ipc://path" (remote: the daemon).
    endpoint: str = ""
    # redis, mooncake: first part of every key, so that fleets (or bench runs) share a store.
    key_prefix: str = "hicache"
    # remote: CURVE is on when both key files are set (a client certificate with its
    # secret key, and the daemon's public certificate, as ``hicache keygen`` writes
    # them). Breaker: a request left unanswered (or a dropped connection) opens it at
    # once, as do ``breaker_failures`` BUSY/INTERNAL replies in a row; open, calls fail
    # fast for ``breaker_cooldown_s``, then one PING probes the daemon.
    curve_client_key: str = ""
    curve_server_key: str = ""
    breaker_failures: int = 3
    breaker_cooldown_s: float = 1.0
    # remote over ipc://: move pages through the daemon's shared-memory slab when it has one.
    shm: bool = False
    # disk: threads doing one batch's reads and writes (bytes in flight); size of one segment
    # file; O_DIRECT (no page cache; a clear error where the file system refuses it).
    io_threads: int = 4
    segment_bytes: int = 1 << 30
    direct_io: bool = False

    def __post_init__(self) -> None:
        if not _known_backend(self.backend):
            raise ValueError(
                f"storage.backend must be one of {BACKENDS}, a name registered under the "
                f"'hicache.storage_backends' entry points, or package.module:Class; "
                f"got {self.backend!r}"
            )
        if self.max_bytes < 1:
            raise ValueError(f"storage.max_bytes must be >= 1, got {self.max_bytes}")
        if self.backend == "redis" and not self.endpoint.startswith("redis://"):
            raise ValueError(
                f"storage.endpoint must be redis://host:port[,...], got {self.endpoint!r}"
            )
        if self.backend == "mooncake" and not self.endpoint.startswith("mooncake://"):
            raise ValueError(
                f"storage.endpoint must be mooncake://host:port, got {self.endpoint!r}"
            )
        if not self.key_prefix or "{" in self.key_prefix or "}" in self.key_prefix:
            # A hash tag in the prefix would put every page in one cluster slot.
            raise ValueError(
                f"storage.key_prefix must be non-empty, without braces: {self.key_prefix!r}"
            )
        if self.map_size < 0:
            raise ValueError(f"storage.map_size must be >= 0, got {self.map_size}")
        if self.timeout_s <= 0:
            raise ValueError(f"storage.timeout_s must be > 0, got {self.timeout_s}")
        if self.max_page_bytes < 1:
            raise ValueError(f"storage.max_page_bytes must be >= 1, got {self.max_page_bytes}")
        sync_level(self.sync)
        if self.io_threads < 1:
            raise ValueError(f"storage.io_threads must be >= 1, got {self.io_threads}")
        if self.segment_bytes < 1 << 20:
            raise ValueError(f"storage.segment_bytes must be >= 1 MiB, got {self.segment_bytes}")
        if self.backend == "remote":
            self._check_remote()

    def _check_remote(self) -> None:
        if not self.endpoint.startswith(ENDPOINT_SCHEMES):
            raise ValueError(
                f"storage.endpoint must start with one of {ENDPOINT_SCHEMES} for the 'remote' "
                f"backend, got {self.endpoint!r}"
            )
        if bool(self.curve_client_key) != bool(self.curve_server_key):
            raise ValueError(
                "storage.curve_client_key and storage.curve_server_key must be set together"
            )
        if self.shm and not self.endpoint.startswith("ipc://"):
            raise ValueError(
                "storage.shm needs the daemon on this host: an ipc:// endpoint, "
                f"got {self.endpoint!r}"
            )
        if self.breaker_failures < 1:
            raise ValueError(f"storage.breaker_failures must be >= 1, got {self.breaker_failures}")
        if self.breaker_cooldown_s <= 0:
            raise ValueError(
                f"storage.breaker_cooldown_s must be > 0, got {self.breaker_cooldown_s}"
            )

    @property
    def enabled(self) -> bool:
        return self.backend != "none"

    @property
    def sync_level(self) -> SyncLevel:
        """``sync`` as a SyncLevel (what backends read)."""
        return sync_level(self.sync)

    def store_dir(self) -> Path:
        """``path``, or when empty ``user_cache_dir()/store/<fingerprint prefix>``
        (one store per model, so that switching models never mixes pages)."""
        if self.path:
            return Path(self.path).expanduser()
        return user_cache_dir() / "store" / (self.fingerprint[:16] or "any-model")


def _known_backend(name: str) -> bool:
    from storage_backends.plugins import entry_point_names, is_dotted

    return name in BACKENDS or is_dotted(name) or name in entry_point_names()


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/hicache`` (when set to an absolute path, as the XDG
    spec asks), else ``~/.cache/hicache``."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "hicache"
