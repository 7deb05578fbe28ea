"""The built-in storage backends by name: the one list that the registry,
config validation, CLI help and tests read (modules are imported only when a
backend is created)."""

from __future__ import annotations

from types import MappingProxyType

# "module:class"; every backend class is constructed as Cls(config).
BUILTIN_BACKENDS: MappingProxyType[str, str] = MappingProxyType(
    {
        "memory": "storage_backends.memory:MemoryBackend",
        "disk": "storage_backends.disk:DiskBackend",
        "lmdb": "storage_backends.lmdb.backend:LmdbBackend",
        "file": "storage_backends.file.backend:FileBackend",
        "redis": "storage_backends.redis.backend:RedisBackend",
        "mooncake": "storage_backends.mooncake.backend:MooncakeBackend",
        "remote": "storage_backends.remote.client:RemoteBackend",
    }
)
