"""Engine-independent pieces of the engine adapters (SGLang, vLLM).

An adapter turns an engine's own storage interface into calls of our
``StorageBackend`` protocol. The parts every adapter needs live here:

- ``resolve_storage_config``: the adapter's ``hicache_config`` (a shipped
  config name or a TOML path) plus override keys from the engine's own
  configuration become one validated ``StorageConfig``; an unknown key is one
  ``ValueError`` naming it, at construction, never a surprise later.
- ``open_backend``: the backend through ``storage_backends.create`` behind the
  guard that turns a damaged store into misses and a fresh store.
- ``Namespace``: what the engine's page keys leave out (model, dtype, layout,
  page bytes, ranks) and the derivation of our 32-byte page key from the
  namespace and the engine's key.
- ``FailureLog``: counted, rate-limited failure logging, and ``call`` that
  runs a backend call and turns any exception into the engine's "miss" value
  (engines' I/O threads die on an exception).

Why the namespace enters the key (and not the store's prefix or fingerprint):
the daemon has no per-client key prefix (only CURVE tenants, chosen by the
operator, not by the engine), LMDB and file stores keep one fingerprint per
store path (so two TP ranks or two models could not share a path), and only
Redis/Mooncake have a ``key_prefix``. Deriving ``sha256(namespace digest ‖
engine key)`` works the same on every backend, costs about a microsecond a
page, and the derived key is also written in each page's header, so a page
can never be read back under another namespace. The store's fingerprint is
set to ``ADAPTER_FINGERPRINT``: it tells a store of namespaced adapter pages
apart from a store written by our own engine (whose keys carry its model
fingerprint), so the two are never mixed by accident.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from hicache.config.cache import CacheConfig
from hicache.config.shipped import resolve_config
from storage_backends.base import FailedCalls, StorageBackend
from storage_backends.config import StorageConfig
from storage_backends.guard import open_guarded
from storage_backends.log_limit import LogLimiter
from storage_backends.page_format import KEY_BYTES

__all__ = [
    "ADAPTER_FINGERPRINT",
    "DEFAULT_HICACHE_CONFIG",
    "FailureLog",
    "Keyer",
    "Namespace",
    "OverrideValue",
    "backend_errors",
    "engine_key_from_hex",
    "open_backend",
    "resolve_storage_config",
    "storage_fields",
]

logger = logging.getLogger(__name__)

# The fingerprint of stores that hold adapter pages (keys already namespaced).
ADAPTER_FINGERPRINT = "engine-adapter-namespaced-keys-v1"
# The shipped config adapters use when the engine's configuration names none.
DEFAULT_HICACHE_CONFIG = "remote"
# A version tag in every namespace digest: changing how keys are derived changes it.
_KEY_SCHEME = b"hicache-adapter-key/v1\0"

OverrideValue = str | int | float | bool
_T = TypeVar("_T")


def storage_fields() -> list[str]:
    """The names ``resolve_storage_config`` accepts as overrides (StorageConfig's fields)."""
    return sorted(f.name for f in dataclasses.fields(StorageConfig))


def resolve_storage_config(
    hicache_config: str,
    overrides: Mapping[str, object],
    ignore: Collection[str] = (),
    source: str = "hicache adapter config",
) -> StorageConfig:
    """The ``[storage]`` section of ``hicache_config`` with ``overrides`` applied.

    ``hicache_config`` is a TOML path or a shipped config's name (``remote``,
    ``default``, ...). ``overrides`` maps StorageConfig field names (e.g.
    ``"endpoint"``, ``"path"``, ``"timeout_s"``) to values; keys in ``ignore``
    (the engine's own keys, such as a module path) are skipped. The result's
    ``fingerprint`` is ``ADAPTER_FINGERPRINT`` unless overridden.

    Raises ValueError (its message starts with ``source``) for an unknown key
    (naming it and the known ones), a value of the wrong type or range, a
    config that cannot be found or parsed, or a config whose storage backend
    is ``none``. Pure: reads the TOML file, mutates nothing.
    """
    known = set(storage_fields())
    chosen: dict[str, OverrideValue] = {"fingerprint": ADAPTER_FINGERPRINT}
    for key, value in overrides.items():
        if key in ignore:
            continue
        if key not in known:
            raise ValueError(f"{source}: unknown key {key!r}; known: {sorted(known)}")
        if not isinstance(value, str | int | float | bool):
            raise ValueError(f"{source}: {key} must be a string, number or bool, got {value!r}")
        chosen[key] = value
    try:
        path = resolve_config(hicache_config)
        config = CacheConfig.from_toml(path, {f"storage.{k}": v for k, v in chosen.items()})
    except (ValueError, OSError) as exc:
        raise ValueError(f"{source}: hicache_config {hicache_config!r}: {exc}") from None
    if not config.storage.enabled:
        raise ValueError(
            f"{source}: hicache_config {hicache_config!r} has storage.backend = 'none'; "
            "name a config with a storage backend (remote, disk, lmdb, file, redis, ...)"
        )
    return config.storage


def open_backend(config: StorageConfig) -> StorageBackend:
    """Open ``config.backend`` (built-in, entry point or ``package.module:Class``)
    behind ``GuardedBackend``: backend exceptions become misses, a damaged
    store is moved aside and replaced by an empty one.

    Raises what ``storage_backends.create`` raises when the store cannot be
    opened at all (ValueError, ``StorageOpenError``, ``FingerprintMismatchError``).
    """
    return open_guarded(config.backend, config)


def backend_errors(backend: StorageBackend) -> int:
    """Calls of ``backend`` that failed other than by a miss (an exception, no reply in
    time, a daemon down or refusing, an error reply), where the backend counts them
    without I/O (``FailedCalls``: the guard of ``open_backend`` does); else 0. Never
    raises, does no I/O, so an engine's scheduler thread may ask."""
    if not isinstance(backend, FailedCalls):
        return 0
    try:
        return backend.failed_calls()
    except Exception:  # a counter that fails is no reason to fail the engine
        logger.debug("failed_calls() raised", exc_info=True)
        return 0


def engine_key_from_hex(text: str) -> bytes:
    """A 64-hex-digit engine page hash as 32 bytes; ValueError otherwise."""
    if len(text) != 2 * KEY_BYTES:
        raise ValueError(f"page key must be {2 * KEY_BYTES} hex digits, got {len(text)}")
    return bytes.fromhex(text)


@dataclass(frozen=True)
class Namespace:
    """What partitions an engine's pages beyond its own keys.

    ``fields`` are (name, value) pairs such as ``("model", "llama-3-8b")``,
    ``("tp_rank", "0")``; their order does not matter. Two namespaces with the
    same fields give the same keys in every process and on every machine; any
    difference gives unrelated keys. Immutable and thread-safe.
    """

    fields: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        names = [name for name, _ in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"namespace fields must have distinct names, got {names}")
        for name, value in self.fields:
            if not name or "\0" in name or "\0" in value or "=" in name:
                raise ValueError(f"namespace field {name!r}={value!r} is malformed")

    @classmethod
    def of(cls, fields: Mapping[str, object]) -> Namespace:
        """A namespace from a mapping; values are turned into text with ``str``."""
        return cls(tuple(sorted((name, str(value)) for name, value in fields.items())))

    @property
    def digest(self) -> bytes:
        """sha256 of the scheme tag and the sorted fields (32 bytes)."""
        h = hashlib.sha256(_KEY_SCHEME)
        for name, value in sorted(self.fields):
            h.update(f"{name}={value}\0".encode())
        return h.digest()

    def describe(self) -> str:
        """The fields as ``name=value`` text, for logs and stats."""
        return ", ".join(f"{name}={value}" for name, value in sorted(self.fields))

    def keyer(self) -> Keyer:
        """A key deriver bound to this namespace's digest (computed once)."""
        return Keyer(self.digest)


@dataclass(frozen=True)
class Keyer:
    """Derives our 32-byte page keys from engine keys: ``sha256(digest ‖ engine key)``."""

    digest: bytes

    def key(self, engine_key: bytes) -> bytes:
        """The page key of one engine key (any length; SGLang's are 32 bytes)."""
        return hashlib.sha256(self.digest + engine_key).digest()

    def keys(self, engine_keys: Sequence[bytes]) -> list[bytes]:
        """``key`` of each engine key, in order."""
        digest = self.digest
        sha = hashlib.sha256
        return [sha(digest + k).digest() for k in engine_keys]


class FailureLog:
    """Counts failures by kind and logs them rate-limited (one traceback per
    kind, then a summary line at most every ``interval_s``). Thread-safe."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0) -> None:
        self._limiter = LogLimiter(logger, interval_s)
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def failure(self, what: str, exc: BaseException) -> None:
        """Count one failure of kind ``what`` and log it (rate-limited)."""
        with self._lock:
            self._counts[what] = self._counts.get(what, 0) + 1
        self._limiter.failure(what, exc)

    def call(self, what: str, fn: Callable[[], _T], fallback: _T) -> _T:
        """``fn()``, or ``fallback`` after counting and logging any Exception it raised."""
        try:
            return fn()
        except Exception as exc:
            self.failure(what, exc)
            return fallback

    def counts(self) -> dict[str, int]:
        """Failures so far by kind (a copy)."""
        with self._lock:
            return dict(self._counts)

    def total(self) -> int:
        """All failures so far."""
        with self._lock:
            return sum(self._counts.values())
