"""Cache configuration: frozen dataclasses per TOML section, validated on construction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hicache.config import loader as config_loader
from hicache.config.loader import Override, Scalar, parse_override
from hicache.policies.eviction import EVICTION_POLICIES
from hicache.policies.prefetch import PREFETCH_POLICIES
from hicache.policies.write import WRITE_POLICIES
from storage_backends import StorageConfig

if TYPE_CHECKING:
    from device_pool import KVShape

__all__ = ["CacheConfig", "Override", "Scalar", "parse_override"]


def _check(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise ValueError(f"{key}: {msg}")


def _one_of(value: str, choices: tuple[str, ...], key: str) -> None:
    _check(value in choices, key, f"must be one of {choices}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """The model whose KV is cached; it also names the store's fingerprint."""

    model_id: str = "tiny-llama"
    num_layers: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    dtype: str = "float16"
    attention: str = "mha"
    kv_lora_rank: int = 0
    rope_dim: int = 0
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        _check(bool(self.model_id), "model.model_id", "must not be empty")
        _check(0 <= self.tp_rank < self.tp_size, "model.tp_rank", "must be in [0, tp_size)")
        try:
            self.kv_shape()
        except ValueError as e:
            raise ValueError(f"model: {e}") from None

    def kv_shape(self) -> KVShape:
        from device_pool import KVShape, dtype_from_name  # torch: only once a config is built

        return KVShape(
            num_layers=self.num_layers,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            dtype=dtype_from_name(self.dtype),
            attention=self.attention,  # type: ignore[arg-type]  # validated by KVShape
            kv_lora_rank=self.kv_lora_rank,
            rope_dim=self.rope_dim,
        )


@dataclass(frozen=True)
class DeviceConfig:
    """The device tier. Give its size in tokens or in GB (tokens win when both are set)."""

    device: str = "auto"
    page_size: int = 16
    num_tokens: int = 16384
    size_gb: float = 0.0

    def __post_init__(self) -> None:
        _check(self.page_size >= 1, "device.page_size", f"must be >= 1, got {self.page_size}")
        _check(self.num_tokens >= 0, "device.num_tokens", "must be >= 0")
        _check(self.size_gb >= 0, "device.size_gb", "must be >= 0")
        _check(self.num_tokens > 0 or self.size_gb > 0, "device", "num_tokens or size_gb needed")
        _check(
            self.num_tokens % self.page_size == 0,
            "device.num_tokens",
            f"must be a multiple of page_size {self.page_size}",
        )
        _check(
            self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
            "device.device",
            f"must be auto, cpu or cuda[:N], got {self.device!r}",
        )


@dataclass(frozen=True)
class HostConfig:
    """The host tier: ``ratio`` × device tokens, or ``size_gb`` when set."""

    enabled: bool = True
    ratio: float = 2.0
    size_gb: float = 0.0
    layout: str = "layer_first"
    reserve_gb: float = 1.0

    def __post_init__(self) -> None:
        _check(self.ratio > 0, "host.ratio", f"must be > 0, got {self.ratio}")
        _check(self.size_gb >= 0, "host.size_gb", "must be >= 0")
        _check(self.reserve_gb >= 0, "host.reserve_gb", "must be >= 0")
        _one_of(self.layout, ("layer_first", "page_first"), "host.layout")


@dataclass(frozen=True)
class PolicyConfig:
    """Eviction, write-back and prefetch policy."""

    eviction: str = "lru"
    write_policy: str = "write_through"
    write_through_threshold: int = 2
    load_back_threshold: int = 16
    prefetch_threshold: int = 256
    prefetch_policy: str = "best_effort"
    prefetch_timeout_base_s: float = 1.0
    prefetch_timeout_per_1k_s: float = 0.25
    cost_margin: float = 1.25
    cost_probe_s: float = 30.0
    prefill_tokens_per_s: float = 0.0
    io_workers: int = 2

    def __post_init__(self) -> None:
        _one_of(self.eviction, tuple(EVICTION_POLICIES), "policy.eviction")
        _one_of(self.write_policy, tuple(WRITE_POLICIES), "policy.write_policy")
        _one_of(self.prefetch_policy, tuple(PREFETCH_POLICIES), "policy.prefetch_policy")
        for name in ("write_through_threshold", "io_workers"):
            _check(getattr(self, name) >= 1, f"policy.{name}", "must be >= 1")
        for name in ("load_back_threshold", "prefetch_threshold"):
            _check(getattr(self, name) >= 0, f"policy.{name}", "must be >= 0")
        for name in (
            "prefetch_timeout_base_s",
            "prefetch_timeout_per_1k_s",
            "prefill_tokens_per_s",
        ):
            _check(getattr(self, name) >= 0, f"policy.{name}", "must be >= 0")
        _check(self.cost_margin >= 1, "policy.cost_margin", f"must be >= 1, got {self.cost_margin}")
        _check(
            self.cost_probe_s > 0, "policy.cost_probe_s", f"must be > 0, got {self.cost_probe_s}"
        )


def choice_fields() -> dict[str, tuple[str, ...]]:
    """Config keys whose value is a name from a registry, with the names (for
    the CLI help: the registries are the one list)."""
    from storage_backends.registry import FACTORIES

    return {
        "policy.eviction": tuple(EVICTION_POLICIES),
        "policy.write_policy": tuple(WRITE_POLICIES),
        "policy.prefetch_policy": tuple(PREFETCH_POLICIES),
        "storage.backend": tuple(FACTORIES),
    }


@dataclass(frozen=True)
class TransferConfig:
    """How bytes move between device and host."""

    backend: str = "auto"
    io_backend: str = "direct"
    workers: int = 1

    def __post_init__(self) -> None:
        _one_of(self.backend, ("auto", "cpu", "cuda"), "transfer.backend")
        _one_of(self.io_backend, ("direct", "kernel"), "transfer.io_backend")
        _check(self.workers >= 1, "transfer.workers", "must be >= 1")


@dataclass(frozen=True)
class EventsConfig:
    """KV events; published on a ZeroMQ PUB socket when ``endpoint`` is set,
    encoded in vLLM's or SGLang's schema (``format``). A ROUTER socket on
    ``replay_endpoint`` (when set) serves the last ``replay_buffer`` batches
    again to subscribers that missed some."""

    endpoint: str = ""
    topic: str = "kv-events"
    format: str = "vllm"
    replay_endpoint: str = ""
    replay_buffer: int = 10_000

    def __post_init__(self) -> None:
        from hicache.events.formats import FORMATS

        _one_of(self.format, tuple(FORMATS), "events.format")
        _check(self.replay_buffer >= 1, "events.replay_buffer", "must be >= 1")
        _check(
            not self.replay_endpoint or bool(self.endpoint),
            "events.replay_endpoint",
            "needs events.endpoint (replay serves what was published)",
        )


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus metrics over HTTP on ``port`` (0 = off)."""

    port: int = 0
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        _check(0 <= self.port < 65536, "metrics.port", f"must be in [0, 65535], got {self.port}")


@dataclass(frozen=True)
class CacheConfig:
    """All of hicache's configuration; one field per TOML section."""

    model: ModelConfig = field(default_factory=ModelConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    host: HostConfig = field(default_factory=HostConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    events: EventsConfig = field(default_factory=EventsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def __post_init__(self) -> None:
        if self.storage.enabled and not self.host.enabled:
            raise ValueError("storage: the storage tier needs the host tier (host.enabled)")

    @classmethod
    def from_toml(
        cls, path: str | Path, overrides: Mapping[str, Scalar] | None = None
    ) -> CacheConfig:
        """Load ``path`` and apply ``overrides`` (``"section.key" -> value``, as ``--set``).

        Raises ConfigError (a ValueError) naming the file or ``--set`` and the key for an
        unknown section or key, a wrong type or an out-of-range value; OSError if unreadable.
        """
        return cls.from_mapping(config_loader.read_toml(path), overrides, source=str(path))

    @classmethod
    def from_mapping(
        cls,
        data: Mapping[str, object],
        overrides: Mapping[str, Scalar] | None = None,
        source: str = "<config>",
    ) -> CacheConfig:
        return config_loader.load(cls, data, source, overrides)

    @classmethod
    def shipped(cls, name: str, overrides: Mapping[str, Scalar] | None = None) -> CacheConfig:
        """A config that ships with the package (``default``, ``device-only``, ``remote``),
        found wherever the package is installed. ValueError for another name."""
        return cls.from_toml(shipped_path(name), overrides)


def shipped_path(name: str) -> Path:
    """The file of shipped config ``name``; ValueError naming the cache's shipped configs."""
    from hicache.config.shipped import CACHE, resolve_config, shipped_configs

    if name not in shipped_configs(CACHE):
        raise ValueError(
            f"no shipped cache config {name!r}; shipped: {', '.join(shipped_configs(CACHE))}"
        )
    return resolve_config(name, CACHE)
